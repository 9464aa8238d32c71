"""The training configuration: TrainConfig, the decomposition it resolves to, and config.json in the run directory."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from podrun import safefs
from podrun.errors import PodrunError
from podrun.rundir.layout import CONFIG as CONFIG_FILE
from podrun.specs.recipe_args import KEEP_CHECKPOINTS

if TYPE_CHECKING:
    from torch import nn

    from podrun.runtime.env import WorkerInfo


class TrainError(PodrunError):
    """Training cannot go on: diverged loss, workers that disagree, a decomposition that does not add up."""


@dataclass
class TrainConfig:
    """Everything the runner needs; train.py fills it from recipe.yaml, the plan and its arguments."""

    model: str | Callable[[], nn.Module] = "resnet18"
    model_kwargs: dict = field(default_factory=dict)
    name: str = "run"                       # recipe name (run directory default)
    data: str = "synthetic"                 # digits | synthetic | CIFAR-10 folder | ImageNet-style folder
    image_size: int = 32
    num_classes: int = 10
    synthetic_size: int = 10_000
    epochs: float | None = None
    steps: int | None = None                # update steps in total (caps epochs)
    local_batch: int | None = None          # None: PODRUN_LOCAL_BATCH, else global/(replicas*GA)
    grad_accum: int | None = None           # None: PODRUN_GRAD_ACCUM, else 1
    global_batch: int | None = None         # None: PODRUN_GLOBAL_BATCH, else local x replicas x GA
    lr: float | None = 0.1                  # peak learning rate; None: lr_base scaled by lr_rule
    warmup_epochs: float | None = 0.0       # None: warmup_base scaled by warmup_rule
    lr_base: float = 0.1                    # recipe's lr at lr_reference_batch
    lr_reference_batch: int = 256
    lr_rule: str = "linear"                 # linear | sqrt | none
    warmup_base: float = 0.0
    warmup_rule: str = "none"
    optimizer: str = "sgd"
    momentum: float = 0.9
    weight_decay: float = 0.0
    nesterov: bool = False
    eeta: float = 0.001
    eps: float | None = None
    betas: tuple[float, float] = (0.9, 0.999)
    rho: float = 0.9
    exclude_bias_and_norm: bool = True
    schedule: str = "cosine"
    power: float = 2.0
    end_factor: float = 0.0
    step_epochs: float | None = None        # step decay period
    gamma: float = 0.1
    label_smoothing: float = 0.0
    mixup: float = 0.0
    cutmix: float = 0.0
    amp: str = "auto"                       # auto (bf16 on CUDA, off elsewhere) | off | bf16 | fp16
    channels_last: bool = False
    compile: bool = False
    fsdp: bool = False
    deterministic: bool = False
    seed: int = 0
    device: str = "auto"                    # auto | cuda | cpu | ipu
    threads: int | None = None              # CPU threads per worker (default: cores / local workers)
    run_dir: str | None = None              # None: PODRUN_RUN_DIR, else runs/<name>-<time>
    checkpoint_dir: str | None = None       # None: <run_dir>/checkpoints
    checkpoint_every: int = 0               # update steps; 0: only at the end
    keep_checkpoints: int = KEEP_CHECKPOINTS  # the newest N are kept; 0: none once the run finishes
    resume: bool = True
    snapshots: bool = True                  # an in-memory snapshot after every update (PODRUN_SNAPSHOT_DIR)
    inplace: bool = True                    # recover in place from a lost host where it can (inplace_loop)
    eval_every: int = 1                     # epochs; 0: only at the end
    eval_batch: int = 256
    log_every: int = 10
    sync_every: int | None = None           # steps whose stats are fetched from the device at once; None:
                                            # log_every on CUDA (no host sync per step), 1 elsewhere
    console: bool = True
    dist_timeout: float = 120.0
    prefetch: int | None = None            # batches prefetched by a thread; None: 3 on CUDA, 0 on CPU
    loader_workers: int | None = None      # loader processes per worker; None: its share of the host's cores for
                                           # a folder of images, 0 for data in memory (podrun.train.data_pool)
    bad_samples: str = "fail"              # fail | skip: a file that does not decode (podrun.train.data)
    stage: bool = False                    # copy the shards to the node-local disk first (podrun.train.stage)


def decompose(cfg: TrainConfig, info: WorkerInfo, replicas: int) -> tuple[int, int, int]:
    """(local batch, GA, global batch): arguments first, then the env contract, checked to multiply out."""
    b = cfg.local_batch if cfg.local_batch is not None else info.local_batch
    a = cfg.grad_accum if cfg.grad_accum is not None else info.grad_accum
    g = cfg.global_batch if cfg.global_batch is not None else info.global_batch
    for what, v in (("local batch", b), ("GA", a), ("global batch", g)):
        if v is not None and v < 1:
            raise TrainError(f"{what} {v} must be at least 1",
                             hint="it comes from the script's arguments, else PODRUN_LOCAL_BATCH / PODRUN_GRAD_ACCUM / "
                                  "PODRUN_GLOBAL_BATCH")
    if b is None and a is None:
        a = 1
    if b is None:
        if g is None:
            raise TrainError("no local batch: pass --local-batch or --global-batch, or launch with podrun")
        if g % (replicas * a):
            raise TrainError(f"global batch {g} is not divisible by {replicas} replicas x GA {a}",
                             hint="pick a global batch that is a multiple of replicas x GA (podrun plan shows them)")
        b = g // (replicas * a)
    if a is None:
        if g is None:
            a = 1
        elif g % (replicas * b):
            raise TrainError(f"global batch {g} is not divisible by {replicas} replicas x local batch {b}",
                             hint="pick a global batch that is a multiple of replicas x local batch")
        else:
            a = g // (replicas * b)
    if g is not None and b * replicas * a != g:
        raise TrainError(f"local batch {b} x {replicas} replicas x GA {a} = {b * replicas * a}, "
                         f"not the global batch {g}",
                         hint="the launcher's plan and the script's arguments disagree; drop one of them")
    if b < 1 or a < 1:
        raise TrainError(f"local batch {b} and GA {a} must be at least 1")
    return b, a, b * replicas * a


def sched_name(name: str) -> str:
    return {"polynomial": "poly"}.get(name, name)


def config_dict(cfg: TrainConfig) -> dict:
    """The configuration as plain JSON values (a callable model becomes its name)."""
    d = asdict(cfg)
    if callable(cfg.model):
        d["model"] = getattr(cfg.model, "__name__", "callable")
    d["betas"] = list(cfg.betas)
    return d


def write_config(run_dir: str | os.PathLike, cfg: TrainConfig, resolved: dict[str, Any]) -> Path:
    """<run_dir>/config.json: the TrainConfig as given and what it resolved to in this attempt (rewritten on resume),
    written whole through safefs into a directory of this user's (UnsafePath or OSError when it cannot be)."""
    return safefs.write_file(safefs.own_dir(run_dir, "run directory") / CONFIG_FILE, json.dumps(
        {"config": config_dict(cfg), "resolved": resolved}, indent=2, default=str) + "\n", CONFIG_FILE,
        durable=False)
