"""ClusterSpec: hosts, devices per host, device kind and memory, interconnect, scheduler."""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Literal, Union

from podrun.errors import SpecError


@dataclass(frozen=True)
class DeviceSpec:
    kind: Literal["ipu", "gpu", "cpu"]
    model: str                       # gc200, v100, h100, cpu ...
    memory_gb: float                 # per device (IPU: on-chip SRAM)

    @property
    def key(self) -> str:
        """The lookup key in recipe tables: '<kind>-<model>' (falls back to '<kind>')."""
        return self.kind if self.model == self.kind else f"{self.kind}-{self.model}"


@dataclass(frozen=True)
class LinkSpec:
    name: str
    bandwidth_gbps: float            # usable all-reduce bandwidth, Gbit/s per device (intra) or per host (inter)
    latency_us: float
    source: str = ""


@dataclass(frozen=True)
class InterconnectSpec:
    intra_host: LinkSpec
    inter_host: LinkSpec


@dataclass(frozen=True)
class HostPattern:
    """A regular naming scheme: count hosts named pattern.format(i=start..start+count-1)."""

    count: int
    pattern: str = "host{i}"
    start: int = 0


@dataclass(frozen=True)
class ClusterFile:
    """The YAML schema of a cluster spec, as written (see docs/cluster-specs.md)."""

    name: str
    hosts: Union[tuple[str, ...], HostPattern]
    devices_per_host: Union[int, Literal["auto"]]
    device: DeviceSpec
    interconnect: InterconnectSpec
    description: str = ""
    scheduler: Literal["none", "slurm", "pbs", "uge", "vipu"] = "none"
    transport: Literal["local", "ssh", "mpirun", "srun"] = "ssh"
    engine: Literal["torch", "poprun"] = "torch"
    instances_per_host: int = 1
    sources: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClusterSpec:
    """A loaded cluster: host names expanded, devices_per_host resolved."""

    name: str
    path: str
    description: str
    hosts: tuple[str, ...]
    devices_per_host: int
    device: DeviceSpec
    interconnect: InterconnectSpec
    scheduler: str
    transport: str
    engine: str
    instances_per_host: int
    sources: tuple[str, ...]

    def with_hosts(self, hosts: tuple[str, ...], devices_per_host: int | None = None) -> "ClusterSpec":
        return replace(self, hosts=tuple(hosts), devices_per_host=devices_per_host or self.devices_per_host)


def resolve(spec: ClusterFile, path: str) -> ClusterSpec:
    if isinstance(spec.hosts, HostPattern):
        p = spec.hosts
        if p.count < 1:
            raise SpecError(f"{path}: field 'hosts.count' must be at least 1, got {p.count}")
        try:
            hosts = tuple(p.pattern.format(i=i) for i in range(p.start, p.start + p.count))
        except (KeyError, IndexError, ValueError) as exc:
            raise SpecError(f"{path}: field 'hosts.pattern' {p.pattern!r} is not a valid pattern ({exc}); use {{i}} or {{i:04d}}") from None
    else:
        hosts = spec.hosts
    if not hosts:
        raise SpecError(f"{path}: field 'hosts' is empty")
    if len(set(hosts)) != len(hosts):
        raise SpecError(f"{path}: field 'hosts' lists a host twice")
    dph = (os.cpu_count() or 1) if spec.devices_per_host == "auto" else spec.devices_per_host
    if dph < 1:
        raise SpecError(f"{path}: field 'devices_per_host' must be at least 1, got {dph}")
    if spec.instances_per_host < 1:
        raise SpecError(f"{path}: field 'instances_per_host' must be at least 1")
    return ClusterSpec(
        name=spec.name, path=path, description=spec.description, hosts=hosts, devices_per_host=dph,
        device=spec.device, interconnect=spec.interconnect, scheduler=spec.scheduler,
        transport=spec.transport, engine=spec.engine, instances_per_host=spec.instances_per_host,
        sources=spec.sources,
    )
