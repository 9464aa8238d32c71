"""RecipeSpec: model, batch limits per device kind, LR rule, optimiser, schedule, dataset, throughput."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional, Union

from podrun.errors import SpecError
from podrun.specs.limits import MAX_BATCH, MAX_SECONDS, MAX_SPEC_INT, MIN_HANG_S
from podrun.specs.loader import bound

_BATCH = bound(1, MAX_BATCH, why=f"samples: at least 1; more than {MAX_BATCH} (2**24) is a typo")
_FRACTION = bound(0, 1, why="a fraction")
_DECAY = bound(0, 0.999999, why="a decay factor below 1")
HANG_TIMEOUT = bound(MIN_HANG_S, MAX_SECONDS, why="seconds without progress from any rank before the run counts "
                     f"as hung (at least {MIN_HANG_S:g}, at most a week), or auto, or off")


@dataclass(frozen=True)
class ModelSpec:
    name: str                        # podrun.models.build name
    params: int = field(metadata=bound(1, MAX_SPEC_INT, why="the parameter count"))   # gradient bytes in the estimate
    norm: Optional[str] = None       # batch | group
    stem: Optional[str] = None       # imagenet | cifar
    classifier: Optional[str] = None  # token | pooled (ViT)


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    train_size: int = field(metadata=bound(1, MAX_SPEC_INT, why="samples in one epoch"))
    val_size: int = field(metadata=bound(0, MAX_SPEC_INT, why="validation samples; 0 for none"))
    image_size: int = field(metadata=bound(1, 65536, why="pixels per side"))
    num_classes: int = field(metadata=bound(1, 10 ** 8, why="at least one class"))


@dataclass(frozen=True)
class LRSpec:
    base: float = field(metadata=bound(above=0, high=1e6, why="the learning rate at reference_batch"))
    reference_batch: int = field(metadata=_BATCH)
    rule: Literal["linear", "sqrt", "none"] = "linear"
    warmup_rule: Literal["linear", "sqrt", "none"] = "none"   # how warmup epochs scale with batch


@dataclass(frozen=True)
class OptimizerSpec:
    name: Literal["lars", "sgd", "rmsprop", "adamw"]
    momentum: float = field(default=0.9, metadata=_DECAY)
    weight_decay: float = field(default=0.0, metadata=bound(0, 1e3, why="an L2 factor"))
    nesterov: bool = False
    eeta: float = field(default=0.001, metadata=bound(above=0, high=1e3, why="the LARS trust coefficient"))
    exclude_bias_and_norm: bool = True
    eps: float = field(default=1e-8, metadata=bound(above=0, high=1, why="a small constant that keeps a division finite"))
    alpha: float = field(default=0.9, metadata=_DECAY)               # RMSProp decay
    betas: tuple[float, float] = field(default=(0.9, 0.999), metadata=_DECAY)


@dataclass(frozen=True)
class ScheduleSpec:
    name: Literal["polynomial", "cosine", "step", "constant"]
    warmup_epochs: float = field(default=0.0, metadata=bound(0, 1e6, why="epochs; 0 for no warmup"))
    power: float = field(default=2.0, metadata=bound(0, 1e3, why="the polynomial's exponent"))
    end_factor: float = field(default=0.0, metadata=_FRACTION)          # final lr as a fraction of peak
    milestones: tuple[float, ...] = field(default=(), metadata=bound(0, 1e6, why="epochs"))   # step
    gamma: float = field(default=0.1, metadata=bound(above=0, high=1e3, why="the factor at each milestone"))


@dataclass(frozen=True)
class Throughput:
    # per device, at max local batch, steady state
    images_per_second: float = field(metadata=bound(0.001, 1e9, why="images per second per device; the estimate divides by it"))
    source: str                      # where the figure comes from, or 'measured here' / 'assumed'


@dataclass(frozen=True)
class RecipeFile:
    """The YAML schema of recipe.yaml (see docs/recipes.md)."""

    name: str
    model: ModelSpec
    dataset: DatasetSpec
    devices_per_replica: dict[str, int] = field(metadata=bound(1, MAX_BATCH, why="devices that hold one replica"))
    max_local_batch: dict[str, int] = field(metadata=_BATCH)
    global_batch: int = field(metadata=_BATCH)
    lr: LRSpec
    optimizer: OptimizerSpec
    schedule: ScheduleSpec
    epochs: float = field(metadata=bound(above=0, high=1e6, why="passes over the training set"))
    throughput: dict[str, Throughput]
    description: str = ""
    min_grad_accum: dict[str, int] = field(default_factory=dict, metadata=bound(1, MAX_BATCH, why="micro batches per update"))
    precision: Literal["fp32", "fp16", "bf16", "amp"] = "fp32"
    gradient_bytes: int = 4          # bytes per gradient element on the wire (2 for fp16 comms)
    label_smoothing: float = field(default=0.0, metadata=_FRACTION)
    mixup: float = field(default=0.0, metadata=bound(0, 1e3, why="the Beta distribution's alpha; 0 for off"))
    cutmix: float = field(default=0.0, metadata=bound(0, 1e3, why="the Beta distribution's alpha; 0 for off"))
    train_script: str = "train.py"
    reference_results: dict[str, str] = field(default_factory=dict)
    sources: tuple[str, ...] = ()
    # `podrun launch`'s default --hang-timeout for this recipe (None: the cluster's, else auto; YAML's bare off is False)
    hang_timeout: Union[float, Literal["auto", "off", False], None] = field(default=None, metadata=HANG_TIMEOUT)


@dataclass(frozen=True)
class RecipeSpec(RecipeFile):
    """A loaded recipe: the file's fields plus where it lives."""

    path: str = ""                   # the recipe folder

    def lookup(self, table: str, device_key: str, device_kind: str):
        """A per-device-kind value: '<kind>-<model>' first, then '<kind>'; None when absent."""
        values = getattr(self, table)
        return values[device_key] if device_key in values else values.get(device_kind)


def validate(r: RecipeFile, path: str) -> None:
    def bad(field_: str, msg: str):
        raise SpecError(f"{path}: field '{field_}' {msg}")

    # numeric ranges are checked by the loader (field metadata); what remains is a choice
    if r.gradient_bytes not in (1, 2, 4, 8):
        bad("gradient_bytes", "must be 1, 2, 4 or 8")
