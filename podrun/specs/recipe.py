"""RecipeSpec: model, batch limits per device kind, LR rule, optimiser, schedule, dataset, throughput."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from podrun.errors import SpecError


@dataclass(frozen=True)
class ModelSpec:
    name: str                        # podrun.models.build name
    params: int                      # parameter count (for gradient bytes in the estimate)
    norm: Optional[str] = None       # batch | group
    stem: Optional[str] = None       # imagenet | cifar
    classifier: Optional[str] = None  # token | pooled (ViT)


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    train_size: int
    val_size: int
    image_size: int
    num_classes: int


@dataclass(frozen=True)
class LRSpec:
    base: float                      # learning rate at reference_batch
    reference_batch: int
    rule: Literal["linear", "sqrt", "none"] = "linear"
    warmup_rule: Literal["linear", "sqrt", "none"] = "none"   # how warmup epochs scale with batch


@dataclass(frozen=True)
class OptimizerSpec:
    name: Literal["lars", "sgd", "rmsprop", "adamw"]
    momentum: float = 0.9
    weight_decay: float = 0.0
    nesterov: bool = False
    eeta: float = 0.001              # LARS trust coefficient
    exclude_bias_and_norm: bool = True
    eps: float = 1e-8
    alpha: float = 0.9               # RMSProp decay
    betas: tuple[float, float] = (0.9, 0.999)


@dataclass(frozen=True)
class ScheduleSpec:
    name: Literal["polynomial", "cosine", "step", "constant"]
    warmup_epochs: float = 0.0
    power: float = 2.0               # polynomial
    end_factor: float = 0.0          # final lr as a fraction of peak
    milestones: tuple[float, ...] = ()   # step: epochs
    gamma: float = 0.1               # step


@dataclass(frozen=True)
class Throughput:
    images_per_second: float         # per device, at max local batch, steady state
    source: str                      # where the figure comes from, or 'measured here' / 'assumed'


@dataclass(frozen=True)
class RecipeFile:
    """The YAML schema of recipe.yaml (see docs/recipes.md)."""

    name: str
    model: ModelSpec
    dataset: DatasetSpec
    devices_per_replica: dict[str, int]
    max_local_batch: dict[str, int]
    global_batch: int
    lr: LRSpec
    optimizer: OptimizerSpec
    schedule: ScheduleSpec
    epochs: float
    throughput: dict[str, Throughput]
    description: str = ""
    min_grad_accum: dict[str, int] = field(default_factory=dict)
    precision: Literal["fp32", "fp16", "bf16", "amp"] = "fp32"
    gradient_bytes: int = 4          # bytes per gradient element on the wire (2 for fp16 comms)
    label_smoothing: float = 0.0
    mixup: float = 0.0
    cutmix: float = 0.0
    train_script: str = "train.py"
    reference_results: dict[str, str] = field(default_factory=dict)
    sources: tuple[str, ...] = ()


@dataclass(frozen=True)
class RecipeSpec(RecipeFile):
    """A loaded recipe: the file's fields plus where it lives."""

    path: str = ""                   # the recipe folder

    def lookup(self, table: str, device_key: str, device_kind: str):
        """A per-device-kind value: '<kind>-<model>' first, then '<kind>'; None when absent."""
        values = getattr(self, table)
        if device_key in values:
            return values[device_key]
        return values.get(device_kind)


def validate(r: RecipeFile, path: str) -> None:
    def bad(field_: str, msg: str):
        raise SpecError(f"{path}: field '{field_}' {msg}")

    for table in ("devices_per_replica", "max_local_batch", "min_grad_accum"):
        for k, v in getattr(r, table).items():
            if v < 1:
                bad(f"{table}.{k}", f"must be at least 1, got {v}")
    if r.global_batch < 1:
        bad("global_batch", f"must be at least 1, got {r.global_batch}")
    if r.lr.reference_batch < 1:
        bad("lr.reference_batch", "must be at least 1")
    if r.epochs <= 0:
        bad("epochs", "must be positive")
    if r.gradient_bytes not in (1, 2, 4, 8):
        bad("gradient_bytes", "must be 1, 2, 4 or 8")
    for k, t in r.throughput.items():
        if t.images_per_second <= 0:
            bad(f"throughput.{k}.images_per_second", "must be positive")
