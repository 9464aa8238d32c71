"""Placement: instances onto hosts, replica offsets and device ids per instance."""
from __future__ import annotations

from podrun.plan.model import Placement


def place(hosts: tuple[str, ...], devices_per_host: int, instances_per_host: int,
          replicas_per_instance: int, devices_per_replica: int) -> tuple[Placement, ...]:
    """Instance i runs on host i // instances_per_host and drives replicas [i*rpi, (i+1)*rpi)."""
    devices_per_instance = devices_per_host // instances_per_host
    out = []
    for h, host in enumerate(hosts):
        for local in range(instances_per_host):
            i = h * instances_per_host + local
            first = local * devices_per_instance
            out.append(Placement(
                index=i, host=host, local_index=local, replica_offset=i * replicas_per_instance,
                local_replicas=replicas_per_instance,
                devices=tuple(range(first, first + replicas_per_instance * devices_per_replica)),
            ))
    return tuple(out)
