"""The calibration file: its schema as frozen dataclasses, loaded at one boundary, its text, found by name."""
from __future__ import annotations

import datetime as _dt
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from podrun.errors import SpecError
from podrun.specs.limits import MAX_BATCH
from podrun.specs.loader import bound, build_dataclass, read_yaml

FORMAT = 1
SUBDIR = "calibrations"           # under the runs dir: <runs>/calibrations/<name>.yaml
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_BATCH = bound(1, MAX_BATCH, why="samples per device per step")
_SECONDS = bound(above=0, high=1e7, why="seconds, above 0")


@dataclass(frozen=True)
class MemoryProbe:
    """One probe of the largest-batch search: a child process ran one training step at ``local_batch``."""

    local_batch: int = field(metadata=_BATCH)
    fits: bool
    peak_bytes: Optional[int] = field(default=None, metadata=bound(0, 2 ** 53, why="bytes"))   # None: it died (OOM)
    error: str = ""


@dataclass(frozen=True)
class MemoryResult:
    # None: no search, the largest local batch was given (podrun calibrate --largest-batch)
    budget_bytes: Optional[int] = field(metadata=bound(1, 2 ** 53, why="bytes a device may hold"), kw_only=True)
    budget_source: str                     # "--device-memory 2 GB", the spec's device memory, or "--largest-batch 8"
    method: str                            # how a step's peak allocation was measured ("given": not measured)
    largest_local_batch: int = field(metadata=_BATCH)
    probes: tuple[MemoryProbe, ...] = ()

    @property
    def searched(self) -> bool:
        return self.budget_bytes is not None


@dataclass(frozen=True)
class RatePoint:
    """Training throughput of one device at one local batch: forward, backward and optimiser step."""

    local_batch: int = field(metadata=_BATCH)
    step_seconds: float = field(metadata=_SECONDS)     # the slowest device's median step
    images_per_second: float = field(metadata=bound(above=0, high=1e9, why="images per second per device"))
    # a CPU device's step: the CPU seconds of its process (all threads; median), None elsewhere or not recorded
    cpu_seconds: Optional[float] = field(default=None, metadata=bound(0, 1e9, why="CPU seconds"))


@dataclass(frozen=True)
class LinkResult:
    """All-reduce between ``ranks`` processes (one per host across hosts, or the devices of one host)."""

    ranks: int = field(metadata=bound(2, 10 ** 6, why="processes in the all-reduce, at least 2"))
    message_bytes: int = field(metadata=bound(1, 2 ** 53, why="bytes all-reduced"))
    # nccl-tests' bus bandwidth: algbw x 2(n-1)/n, algbw = bytes / time
    bus_bandwidth_gbps: float = field(metadata=bound(above=0, high=1e7, why="Gbit/s"))
    latency_us: float = field(metadata=bound(0, 1e9, why="microseconds per ring step of a small message"))
    seconds: float = field(metadata=_SECONDS)          # median time of one all-reduce of message_bytes


@dataclass(frozen=True)
class NetworkResult:
    backend: str                           # gloo (CPU), nccl where present
    intra_host: Optional[LinkResult] = None    # None: one device per host
    inter_host: Optional[LinkResult] = None    # None: one host


@dataclass(frozen=True)
class OverlapResult:
    """A data-parallel step (the model under DDP, every device of the hosts stepping at once) held against its
    parts, the step alone and one all-reduce of the gradient across every rank: the part of the all-reduce the
    backward pass hid on these hosts (DDP all-reduces gradient buckets while the backward pass goes on)."""

    ranks: int = field(metadata=bound(2, 10 ** 6, why="processes in the data-parallel step, at least 2"))
    local_batch: int = field(metadata=_BATCH)
    step_seconds: float = field(metadata=_SECONDS)          # the step alone (no gradient sync): slowest median
    allreduce_seconds: float = field(metadata=_SECONDS)     # one all-reduce of the gradient over all ranks: median
    synced_step_seconds: float = field(metadata=_SECONDS)   # the DDP step: the slowest device's median
    # (step + all-reduce - synced step) / all-reduce, within [0, 1]
    hidden_fraction: float = field(metadata=bound(0, 1, why="a fraction of the all-reduce, 0 to 1"))


def hidden_fraction(step_seconds: float, allreduce_seconds: float, synced_step_seconds: float) -> float:
    """The part of the all-reduce a synced step hid: what the step and the all-reduce one after the other would
    take, less the synced step, over the all-reduce; within [0, 1] (a synced step slower than both, 0)."""
    hidden = (step_seconds + allreduce_seconds - synced_step_seconds) / allreduce_seconds
    return min(1.0, max(0.0, hidden))


@dataclass(frozen=True)
class InputRate:
    """The recipe's input pipeline (decode and augmentation, no model) on one host with ``workers`` loader
    processes (0: in the rank's own thread): podrun data bench's row, the slowest host's."""

    workers: int = field(metadata=bound(0, 100_000, why="loader processes, 0 or more"))
    images_per_second: float = field(metadata=bound(above=0, high=1e9, why="images per second on one host"))
    cpu_ms_per_image: Optional[float] = field(default=None, metadata=bound(0, 1e6, why="CPU milliseconds"))


@dataclass(frozen=True)
class InputResult:
    """The host's input rate for the recipe's decode and augmentation on a sample of the user's data."""

    data: str                              # the folder or shards read (as given to podrun calibrate --data)
    decoder: str                           # simplejpeg, pil ...
    cores: int = field(metadata=bound(1, 1_000_000, why="cores of one host"))
    image_size: int = field(metadata=bound(1, 100_000, why="pixels"))
    images: int = field(metadata=bound(1, 10 ** 9, why="images timed per worker count"))
    rates: tuple[InputRate, ...]
    hosts: int = field(default=1, metadata=bound(1, 10 ** 6, why="hosts that measured it (the slowest kept)"))


@dataclass(frozen=True)
class Calibration:
    """What `podrun calibrate` measured for one recipe on one cluster's hosts."""

    format: int = field(metadata=bound(FORMAT, FORMAT, why=f"this podrun reads calibration format {FORMAT}"))
    recipe: str
    model: str
    cluster: str
    device: str                            # the device key: cpu, gpu-h100, ipu-gc200 ...
    hosts: tuple[str, ...]
    devices_per_host: int = field(metadata=bound(1, 10 ** 6, why="devices measured on each host"))
    measured_at: str                       # UTC, ISO 8601 (2026-11-25T12:00:00Z)
    podrun_version: str
    precision: str
    memory: MemoryResult
    throughput: tuple[RatePoint, ...]
    network: NetworkResult
    seconds: float = field(default=0.0, metadata=bound(0, 1e7, why="how long the calibration took"))
    # the side in pixels of the inputs the model was stepped on (its rates and memory hold for that size);
    # None in a file that does not say
    image_size: Optional[int] = field(default=None, metadata=bound(1, 100_000, why="pixels"))
    overlap: Optional[OverlapResult] = None    # None: one device in all, or a file that does not say
    input: Optional[InputResult] = None        # None: calibrated without --data (input not measured)

    def age_seconds(self, now: _dt.datetime | None = None) -> float:
        now = _dt.datetime.now(_dt.timezone.utc) if now is None else now
        return (now - parse_utc(self.measured_at)).total_seconds()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["hosts"] = list(self.hosts)
        d["throughput"] = [asdict(p) for p in self.throughput]
        d["memory"]["probes"] = [asdict(p) for p in self.memory.probes]
        if self.input is not None:
            d["input"]["rates"] = [asdict(r) for r in self.input.rates]
        return d


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_utc(text: str) -> _dt.datetime:
    return _dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=_dt.timezone.utc)


def _check(c: Calibration, path: str) -> None:
    """What the field types do not say: the time's form, a non-empty measurement, points in batch order."""
    try:
        parse_utc(c.measured_at)
    except ValueError:
        raise SpecError(f"{path}: field 'measured_at' {c.measured_at[:40]!r} is not a UTC time such as "
                        "2026-11-25T12:00:00Z") from None
    if not c.hosts:
        raise SpecError(f"{path}: field 'hosts' is empty")
    if not c.throughput:
        raise SpecError(f"{path}: field 'throughput' lists no measured local batch")
    batches = [p.local_batch for p in c.throughput]
    if batches != sorted(set(batches)):
        raise SpecError(f"{path}: field 'throughput' must list each local batch once, in increasing order "
                        f"(found {batches})")
    if c.input is not None:
        workers = [r.workers for r in c.input.rates]
        if not workers or workers != sorted(set(workers)):
            raise SpecError(f"{path}: field 'input.rates' must list each worker count once, in increasing order "
                            f"(found {workers})")


def load(path: str | Path) -> Calibration:
    """A calibration file -> Calibration; anything wrong is a SpecError (exit 2) naming the file, line and field."""
    p = Path(path)
    if not p.exists():          # one that is no regular file is refused when read (read_yaml)
        raise SpecError(f"calibration file {p} does not exist",
                        hint="run `podrun calibrate RECIPE` first, or give the file's path or its name")
    data, src = read_yaml(p, "calibration file")
    c = build_dataclass(Calibration, data, (), src)
    _check(c, str(p))
    return c


def dumps(c: Calibration) -> str:
    px = "" if c.image_size is None else f", {c.image_size} px inputs"
    head = (f"# podrun calibration: {c.recipe} on {c.cluster} ({len(c.hosts)} host(s) x {c.devices_per_host} "
            f"{c.device}{px}), measured {c.measured_at}\n")
    return head + yaml.safe_dump(c.to_dict(), sort_keys=False, default_flow_style=None, width=110)


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise SpecError(f"--name {name[:60]!r} is not a calibration name",
                        hint="use letters, digits, '.', '_' and '-' (at most 128), starting with a letter or digit")
    return name


def find(name_or_path: str, runs_dir: str | Path) -> Path:
    """--calibration FILE|NAME: a path (ends in .yaml/.yml or holds a '/'), else <runs_dir>/calibrations/NAME.yaml."""
    if not name_or_path or "\0" in name_or_path or len(name_or_path) > 4096:
        raise SpecError("--calibration: not a file name or a calibration name")
    if name_or_path.endswith((".yaml", ".yml")) or os.sep in name_or_path:
        return Path(name_or_path)
    d = Path(runs_dir) / SUBDIR
    p = d / f"{name_or_path}.yaml"
    if not p.is_file():
        have = sorted(x.stem for x in d.glob("*.yaml")) if d.is_dir() else []
        raise SpecError(f"no calibration named {name_or_path!r} in {d}",
                        hint=(f"calibrations there: {', '.join(have)}" if have else "none there yet: run "
                              "`podrun calibrate RECIPE`") + "; or give the file's path")
    return p
