"""The plan's data: frozen dataclasses returned by the planner and serialised to plan.json."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Placement:
    """One instance: where it runs and which replicas it drives."""

    index: int              # instance index, 0..instances-1
    host: str               # host name the instance runs on
    local_index: int        # instance index within its host (0 when one instance per host)
    replica_offset: int     # global index of its first replica
    local_replicas: int     # replicas this instance drives
    devices: tuple[int, ...]  # device ids on the host used by this instance


@dataclass(frozen=True)
class Estimate:
    images_per_second: float
    scaling_efficiency: float
    time_to_train_hours: float
    step_seconds: float          # one weight update: GA micro batches + the gradient all-reduce
    allreduce_seconds: float
    per_replica_images_per_second: float
    assumptions: tuple[str, ...] = ()
    allreduce_hidden_fraction: float = 0.0     # of allreduce_seconds, behind the backward pass (measured)
    compute_seconds: float | None = None       # the devices' part of the step (GA micro batches); None: not said
    input_seconds: float | None = None         # a host's input pipeline for its share of the step; None: not measured
    input_bound: bool = False                  # the input, not the device, bounds the step
    input_levers: tuple[str, ...] = ()         # what would change an input-bound step, each with its figure


@dataclass(frozen=True)
class Plan:
    """The pure result of (cluster spec, recipe, overrides)."""

    cluster: str
    recipe: str
    model: str
    device_kind: str             # e.g. "ipu-gc200", "gpu-v100", "cpu"
    hosts: tuple[str, ...]
    devices_per_host: int
    devices: int
    devices_per_replica: int
    replicas: int
    instances_per_host: int
    instances: int
    replicas_per_instance: int
    local_batch: int
    grad_accum: int
    global_batch: int
    reference_global_batch: int
    learning_rate: float
    reference_learning_rate: float
    lr_rule: str                 # linear | sqrt | none
    warmup_epochs: float
    epochs: float
    pipeline_bubble: float       # (P-1)/(GA+P-1); 0 when P == 1
    placement: tuple[Placement, ...]
    estimate: Estimate
    notes: tuple[str, ...] = field(default=())   # what the planner decided and why
    lr_reference_batch: int | None = None        # the batch reference_learning_rate is given for; None: no recipe
    local_disk: str | None = None                # the cluster spec's node-local disk folder (--stage), if it names one

    def to_dict(self) -> dict:
        d = asdict(self)
        d["hosts"] = list(self.hosts)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        d = dict(d)
        d["hosts"] = tuple(d["hosts"])
        d["placement"] = tuple(
            Placement(**{**p, "devices": tuple(p["devices"])}) for p in d["placement"]
        )
        e = dict(d["estimate"])
        e["assumptions"] = tuple(e.get("assumptions", ()))
        e["input_levers"] = tuple(e.get("input_levers", ()))
        d["estimate"] = Estimate(**e)
        d["notes"] = tuple(d.get("notes", ()))
        return cls(**d)
