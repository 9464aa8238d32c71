"""Placement: instances onto hosts, replica offsets and device ids per instance."""
from __future__ import annotations

import itertools

from podrun.plan.model import Placement


def place(hosts: tuple[str, ...], devices_per_host: int, instances_per_host: int,
          replicas_per_instance: int, devices_per_replica: int) -> tuple[Placement, ...]:
    """Instance i runs on host i // instances_per_host and drives replicas [i*rpi, (i+1)*rpi)."""
    devices_per_instance = devices_per_host // instances_per_host
    used = replicas_per_instance * devices_per_replica          # an instance's devices, from its first
    return tuple(Placement(index=i, host=host, local_index=local, replica_offset=i * replicas_per_instance,
                           local_replicas=replicas_per_instance,
                           devices=tuple(range(local * devices_per_instance, local * devices_per_instance + used)))
                 for i, (host, local) in enumerate(itertools.product(hosts, range(instances_per_host))))
