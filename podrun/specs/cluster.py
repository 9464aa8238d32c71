"""ClusterSpec: hosts, devices per host, device kind and memory, interconnect, scheduler."""
from __future__ import annotations

import os
import re
import string
from dataclasses import dataclass, field, fields, replace
from typing import Literal, Optional, Union

from podrun.errors import HostError, SpecError
from podrun.specs.hosts import MAX_HOST_NAME, check_name
from podrun.specs.limits import MAX_HOSTS, MAX_PER_HOST, MAX_SECONDS
from podrun.specs.loader import bound
from podrun.specs.recipe import HANG_TIMEOUT


@dataclass(frozen=True)
class DeviceSpec:
    kind: Literal["ipu", "gpu", "cpu"]
    model: str                       # gc200, v100, h100, cpu ...
    memory_gb: float = field(metadata=bound(0, 1e6, why="GB per device; 0 when it does not matter (CPU)"))

    @property
    def key(self) -> str:
        """The lookup key in recipe tables: '<kind>-<model>' (falls back to '<kind>')."""
        return self.kind if self.model == self.kind else f"{self.kind}-{self.model}"


@dataclass(frozen=True)
class LinkSpec:
    name: str
    # usable all-reduce bandwidth, Gbit/s per device (intra) or per host (inter)
    bandwidth_gbps: float = field(metadata=bound(0.001, 1e6, why="Gbit/s: the estimate divides by it; from 1 Mbit/s to 1 Pbit/s"))
    latency_us: float = field(metadata=bound(0, 1e9, why="microseconds per message, up to 1000 s"))
    source: str = ""


@dataclass(frozen=True)
class InterconnectSpec:
    intra_host: LinkSpec
    inter_host: LinkSpec


MAX_CORES = 4096          # cores of one host (the largest shipped today have a few hundred)


@dataclass(frozen=True)
class HostCpuSpec:
    """A host's CPUs: the cores its workers and their data loaders share, in NUMA domains of equal size."""

    cores: Union[int, Literal["auto"]] = field(
        metadata=bound(1, MAX_CORES, why="physical cores per host, or 'auto' for this machine's"))
    numa_nodes: int = field(default=1, metadata=bound(1, 256, why="NUMA domains per host (sockets x domains each)"))
    source: str = ""


@dataclass(frozen=True)
class VipuSpec:
    """An IPU-POD's V-IPU controller and partition, which poprun attaches to the IPUs through."""

    server_host: Optional[str] = None
    partition: Optional[str] = None


@dataclass(frozen=True)
class JobsSpec:
    """What a batch job on this cluster asks its own scheduler (the spec's ``scheduler``) for beside its nodes,
    devices and cores; job scripts for another scheduler read none of it."""

    resource: Optional[str] = None      # Grid Engine: `-l NAME=N` asks N whole nodes (ABCI 1.0's rt_F)
    pe: Optional[str] = None            # Grid Engine: `-pe PE N`, a parallel environment of one slot per host
    queue: Optional[str] = None         # the queue (Slurm: partition) a job goes to when none is given
    typed_queues: tuple[str, ...] = ()  # queues that set each node's CPUs and GPUs themselves (ABCI 3.0's rt_HF)
    ssh_directives: tuple[str, ...] = ()  # directives a job needs when its launch reaches its nodes over ssh
    ssh_port: Optional[int] = field(default=None, metadata=bound(
        1, 65535, why="the port sshd listens on between a job's nodes"))


@dataclass(frozen=True)
class HostPattern:
    """A regular naming scheme: count hosts named pattern.format(i=start..start+count-1)."""

    count: int = field(metadata=bound(1, MAX_HOSTS, why=f"a cluster has at least one host and at most {MAX_HOSTS}"))
    pattern: str = "host{i}"
    start: int = field(default=0, metadata=bound(0, 10 ** 9, why="the first host number"))


@dataclass(frozen=True)
class ClusterFile:
    """The YAML schema of a cluster spec, as written (see docs/cluster-specs.md)."""

    name: str
    hosts: Union[tuple[str, ...], HostPattern]
    devices_per_host: Union[int, Literal["auto"]] = field(
        metadata=bound(1, MAX_PER_HOST, why="devices on each host, or 'auto' for this machine's cores"))
    device: DeviceSpec
    interconnect: InterconnectSpec
    description: str = ""
    cpu: Optional[HostCpuSpec] = None   # each host's cores; None: not said (job scripts then need --cpus-per-node)
    local_disk: Optional[str] = None    # a folder on each host's own disk (--stage); None: the scheduler's, if any
    scheduler: Literal["none", "slurm", "pbs", "uge", "vipu"] = "none"
    transport: Literal["local", "ssh", "mpirun", "srun"] = "ssh"
    engine: Literal["torch", "poprun"] = "torch"
    vipu: Optional[VipuSpec] = None     # poprun's --vipu-server-host / --vipu-partition on this POD
    jobs: Optional[JobsSpec] = None     # what its batch jobs ask the scheduler for (job scripts)
    instances_per_host: int = field(default=1, metadata=bound(1, MAX_PER_HOST, why="instances podrun starts on each host"))
    sources: tuple[str, ...] = ()
    data_interface: str = ""         # the interface of the network the hosts share for collectives ("" = none given)
    # `podrun launch`'s default --hang-timeout on this cluster (None: auto); a recipe's own wins
    hang_timeout: Union[float, Literal["auto", "off", False], None] = field(default=None, metadata=HANG_TIMEOUT)
    # `podrun launch`'s liveness on this cluster when none of --heartbeat, --heartbeat-misses, --keepalive is given
    heartbeat: Optional[float] = field(default=None, metadata=bound(
        above=0, high=MAX_SECONDS, why="seconds between two heartbeats, both ways (above 0, at most a week)"))
    heartbeat_misses: Optional[int] = field(default=None, metadata=bound(
        1, 10 ** 6, why="heartbeats missed in a row before a host is lost, at least 1"))


# A Linux network interface name (IFNAMSIZ: at most 15 bytes; no '/', no whitespace), for data_interface
IFNAME_RE = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")
# a word of a scheduler directive line (what podrun.jobscript.job accepts there: no quotes, spaces, '#' or '$')
DIRECTIVE_WORD = re.compile(r"[A-Za-z0-9_.,:=+@%/-]{1,200}")


def _check_jobs(jobs: JobsSpec, path: str) -> None:
    """The jobs block's names and directives are what a directive line can hold: a SpecError naming the field."""
    names = [("'jobs.resource'", jobs.resource), ("'jobs.pe'", jobs.pe), ("'jobs.queue'", jobs.queue),
             *((f"'jobs.typed_queues' item {i}", q) for i, q in enumerate(jobs.typed_queues))]
    for name, value in names:
        if value is not None and (not DIRECTIVE_WORD.fullmatch(value) or value.startswith("-")):
            raise SpecError(f"{path}: field {name} {value[:40]!r} cannot go on a scheduler directive line",
                            hint="use letters, digits and _ . , : = + @ % / - (not starting with -)")
    for i, d in enumerate(jobs.ssh_directives):
        words = d.split()
        if not words or not words[0].startswith("-") or not all(DIRECTIVE_WORD.fullmatch(w) for w in words):
            raise SpecError(f"{path}: field 'jobs.ssh_directives' item {i} {d[:40]!r} is not a directive's options",
                            hint="write the options as after #$ or #PBS, e.g. '-l USE_SSH=1' or '-v USE_SSH=1'")


@dataclass(frozen=True)
class ClusterSpec(ClusterFile):
    """A loaded cluster: the file's fields with host names expanded and devices_per_host resolved."""

    hosts: tuple[str, ...]
    devices_per_host: int
    cpu: Optional[HostCpuSpec] = None   # cores resolved to a number
    path: str = ""

    def with_hosts(self, hosts: tuple[str, ...], devices_per_host: int | None = None) -> "ClusterSpec":
        dph = self.devices_per_host if devices_per_host is None else devices_per_host
        return replace(self, hosts=tuple(hosts), devices_per_host=dph)


# the format spec of {i} in a host pattern: fill/align, zero, width (two digits at most), 'd'
_INDEX_SPEC = re.compile(r"(?:.?[<>^=])?0?[0-9]{0,2}d?")


def _check_pattern(pattern: str, path: str) -> None:
    """A host pattern uses {i} with a short integer format, so that no name is built that could not be one."""
    def bad(why: str):
        raise SpecError(f"{path}: field 'hosts.pattern' {pattern[:60]!r} {why}", hint="use e.g. 'g{i:04d}' or 'host{i}'")

    if len(pattern) > MAX_HOST_NAME:
        bad(f"is longer than a host name ({MAX_HOST_NAME} characters)")
    try:
        parts = list(string.Formatter().parse(pattern))
    except ValueError as exc:
        bad(f"is not a valid pattern ({exc})")
    fields = [(name, spec, conv) for _, name, spec, conv in parts if name is not None]
    if not fields:
        bad("has no {i}: every host would get the same name")
    for name, spec, conv in fields:
        if name != "i" or conv is not None or not _INDEX_SPEC.fullmatch(spec or ""):
            bad(f"may hold only {{i}} with an integer format such as {{i:04d}}, found {{{name}{'!' + conv if conv else ''}"
                f"{':' + spec if spec else ''}}}")


def _pattern_hosts(p: HostPattern, path: str) -> tuple[str, ...]:
    _check_pattern(p.pattern, path)
    try:
        return tuple(p.pattern.format(i=i) for i in range(p.start, p.start + p.count))
    except (KeyError, IndexError, ValueError) as exc:
        raise SpecError(f"{path}: field 'hosts.pattern' {p.pattern!r} is not a valid pattern ({exc}); use {{i}} or {{i:04d}}") from None


def resolve(spec: ClusterFile, path: str) -> ClusterSpec:
    if isinstance(spec.hosts, HostPattern):
        hosts = _pattern_hosts(spec.hosts, path)
    else:
        hosts = spec.hosts
        if len(hosts) > MAX_HOSTS:
            raise SpecError(f"{path}: field 'hosts' lists {len(hosts)} hosts, more than {MAX_HOSTS}")
    if not hosts:
        raise SpecError(f"{path}: field 'hosts' is empty")
    for i, h in enumerate(hosts):
        try:
            check_name(h, f"{path}: field 'hosts'" + ("" if isinstance(spec.hosts, HostPattern) else f" item {i}"))
        except HostError as exc:
            raise SpecError(exc.message, hint=exc.hint) from None
    if len(set(hosts)) != len(hosts):
        raise SpecError(f"{path}: field 'hosts' lists a host twice")
    dph = (os.cpu_count() or 1) if spec.devices_per_host == "auto" else spec.devices_per_host
    if spec.data_interface and not IFNAME_RE.fullmatch(spec.data_interface):
        raise SpecError(f"{path}: field 'data_interface' {spec.data_interface[:40]!r} is not a network interface name",
                        hint="give the name `ip -br addr` shows on the hosts, e.g. ib0 or eth1 (at most 15 characters)")
    if spec.jobs is not None:
        _check_jobs(spec.jobs, path)
    cpu = spec.cpu
    if cpu is not None and cpu.cores == "auto":
        cpu = replace(cpu, cores=len(os.sched_getaffinity(0)))
    if cpu is not None and cpu.cores % cpu.numa_nodes != 0:
        raise SpecError(f"{path}: field 'cpu.cores' {cpu.cores} does not split into {cpu.numa_nodes} NUMA nodes "
                        "of equal size", hint="give the physical cores of the whole host and its NUMA domains")
    given = {f.name: getattr(spec, f.name) for f in fields(ClusterFile)}
    return ClusterSpec(**{**given, "hosts": hosts, "devices_per_host": dph, "cpu": cpu}, path=path)
