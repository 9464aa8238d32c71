"""What a worker builds before the first step: seeds, threads, run dir, data, schedule lengths, model, DDP/FSDP, optimiser, AMP."""
from __future__ import annotations

import contextlib
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from podrun.runtime.distributed import Device
from podrun.runtime.env import WorkerInfo
from podrun.train.config import TrainConfig, TrainError, decompose, sched_name
from podrun.train.data import ImageDataset, Shard, load_dataset, steps_per_epoch
from podrun.train.data_pool import default_workers
from podrun.rundir.layout import CHECKPOINTS
from podrun.rundir.metrics import MetricsWriter
from podrun.train.optim import build_optimizer, build_scheduler
from podrun.wire.worker_env import cpus_here


_GROUP: list = []      # the in-place recovery's group (podrun.train.inplace_loop), which all_reduce goes through


def use_group(group) -> None:
    """Make ``all_reduce`` go through ``group`` (a podrun.runtime.inplace.Group) from now on."""
    _GROUP[:] = [group]


def all_reduce(t: torch.Tensor, op=None) -> torch.Tensor:
    """In-place all-reduce of a small tensor on any device (NCCL needs CUDA tensors, gloo CPU ones)."""
    if _GROUP:
        return _GROUP[0].all_reduce(t, op or dist.ReduceOp.SUM)
    if dist.is_available() and dist.is_initialized():
        if dist.get_backend() == "nccl" and t.device.type != "cuda":
            on = t.to(f"cuda:{torch.cuda.current_device()}")
            dist.all_reduce(on, op=op or dist.ReduceOp.SUM)
            t.copy_(on.cpu())
        else:
            dist.all_reduce(t, op=op or dist.ReduceOp.SUM)
    return t


def agree(refusal: Exception | None, elsewhere: Exception) -> None:
    """Every rank calls it once rank 0 has looked: rank 0 raises its ``refusal``, and then every other rank
    raises ``elsewhere``; nothing happens when rank 0 found nothing to refuse."""
    if dist.is_available() and dist.is_initialized():
        flag = all_reduce(torch.tensor([0.0 if refusal is None else 1.0]), dist.ReduceOp.MAX)
        if refusal is None and flag.item() > 0:
            raise elsewhere
    if refusal is not None:
        raise refusal


def setup_determinism(cfg: TrainConfig) -> None:
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    if cfg.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    elif torch.cuda.is_available():
        torch.backends.cudnn.benchmark = True


def set_threads(cfg: TrainConfig, info: WorkerInfo, device: Device) -> None:
    """torch's threads on CPU: --threads, else OMP_NUM_THREADS as set (podrun's agent sets the worker's share of its
    host's cores, podrun.wire.worker_env), else this worker's share: PODRUN_CPUS, or the cores it may run on shared by
    the workers on its host. The loader's prefetch thread (podrun.train.data.Loader) is the one thread beside."""
    if device.kind != "cpu":
        return
    n = cfg.threads
    if n is None and "OMP_NUM_THREADS" not in os.environ:
        n = cpus_here(info.local_world_size)
    if n is not None and n > 0:
        torch.set_num_threads(n)


def build_model(cfg: TrainConfig) -> nn.Module:
    if callable(cfg.model):
        return cfg.model()
    from podrun import models

    return models.build(cfg.model, num_classes=cfg.num_classes, **cfg.model_kwargs)


def _checksum(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        s = torch.zeros(2, dtype=torch.float64)
        for i, p in enumerate(model.parameters()):
            v = p.detach().double().cpu()
            s[0] += v.sum()
            s[1] += (v.abs() * ((i % 7) + 1)).sum()
    return s


def assert_same_start(model: nn.Module, device: Device) -> None:
    """Same seed everywhere -> equal weights without a broadcast; check it (fail loudly when not)."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    dev = device.torch_device if device.kind == "cuda" else "cpu"
    s = _checksum(model).to(dev)
    hi, lo = s.clone(), s.clone()
    all_reduce(hi, dist.ReduceOp.MAX)
    all_reduce(lo, dist.ReduceOp.MIN)
    if not torch.equal(hi, lo):
        raise TrainError(
            f"workers start with different weights (parameter checksums range {lo.tolist()} .. {hi.tolist()})",
            hint="every worker must use the same --seed and the same model options", exit_code=1)


def amp_mode(cfg: TrainConfig, device: Device) -> tuple[torch.dtype | None, bool]:
    """(autocast dtype or None, whether a GradScaler is needed)."""
    mode = cfg.amp.lower()
    if mode == "auto":
        mode = "bf16" if device.kind == "cuda" else "off"
    if mode in ("off", "fp32", "none"):
        return None, False
    if mode == "bf16":
        return torch.bfloat16, False
    if mode in ("fp16", "half"):
        return torch.float16, True
    raise TrainError(f"unknown --amp {cfg.amp!r}", hint="use auto, off, bf16 or fp16", exit_code=2)


def resolve_run_dir(cfg: TrainConfig, info: WorkerInfo) -> Path:
    d = cfg.run_dir or info.run_dir
    if d is None:
        name = [f"runs/{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"]
        if dist.is_available() and dist.is_initialized():
            dist.broadcast_object_list(name, src=0)  # every worker agrees on rank 0's choice
        d = name[0]
    return Path(d)


def checkpoint_dir(cfg: TrainConfig, run_dir: Path) -> Path:
    return Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else run_dir / CHECKPOINTS


CKPT_DIR_HINT = ("pass --checkpoint-dir with a directory of your own that no one else may write (`chmod go-w` it), "
                 "or a new one (made 0700)")
SAME_RUN_WAIT_S = 60.0      # how long a restart waits for its run's earlier attempt to let go of its directories


def claim_dirs(cfg: TrainConfig, info: WorkerInfo, run_dir: Path, ckpt_dir: Path) -> list:
    """Rank 0, before any training: the run directory and the checkpoint directory made 0700 or, existing,
    accepted only as this user's with no group/other write (safefs.own_dir: another user's directory, one others
    may write, or a link is refused naming its owner and mode; a --checkpoint-dir whose parent is missing is
    refused), locked for this process (one writer each: a second is refused naming the run and host holding it)
    and so known writable; the temporary files of dead writers removed. Every rank calls it (it agrees on the
    outcome: a refusal on rank 0 ends every rank with exit 2). Returns the locks."""
    from podrun import safefs
    from podrun.rundir import lock
    from podrun.train.checkpoint import check_keep, remove_dead_temps

    check_keep(cfg.keep_checkpoints)          # every rank: a bad count is refused before anything is made
    refusal: Exception | None = None
    held: list = []
    if info.rank == 0:
        run = info.run_id or run_dir.name
        try:
            safefs.own_dir(run_dir, "run directory", hint="pass --run-dir with a directory of your own that no one "
                                                         "else may write (`chmod go-w` it), or a new one")
            # a restart may start while the attempt before it still ends (a lost host's worker is ended by its
            # agent within the liveness bound and the grace period): wait for it, never for another run
            wait = SAME_RUN_WAIT_S if info.restart_count > 0 else 0.0
            held.append(lock.DirLock(run_dir, run, "run directory").acquire(wait))
            if cfg.checkpoint_dir and not os.path.lexists(ckpt_dir) and not ckpt_dir.parent.is_dir():
                raise lock.LockError(f"--checkpoint-dir {ckpt_dir}: neither it nor its parent "
                                     f"{ckpt_dir.parent} exists",
                                     hint="pass an existing directory (or one inside an existing one)")
            safefs.own_dir(ckpt_dir, "checkpoint directory", hint=CKPT_DIR_HINT)
            if ckpt_dir.resolve() != run_dir.resolve():
                held.append(lock.DirLock(ckpt_dir, run, "checkpoint directory").acquire(wait))
            for p in remove_dead_temps(ckpt_dir):
                print(f"podrun: removed {p.name}, the partial checkpoint of a writer that died", flush=True)
        except Exception as exc:  # noqa: BLE001 - raised below, after every rank heard of it
            refusal = exc
            for h in held:
                h.release()
            held = []
    agree(refusal, TrainError("rank 0 refused the run directory or checkpoint directory (its message says why)",
                              exit_code=2))
    return held


def schedule_lengths(cfg: TrainConfig, spe: int, global_batch: int) -> tuple[int, float, int]:
    """(total update steps, peak learning rate, warmup steps): functions of the global batch, never of the split."""
    from podrun.plan.lr import scale

    total = cfg.steps if cfg.steps is not None else None
    if cfg.epochs is not None:
        by_epochs = int(math.ceil(cfg.epochs * spe))
        total = by_epochs if total is None else min(total, by_epochs)
    if total is None:
        raise TrainError("neither --steps nor --epochs given")
    lr = cfg.lr if cfg.lr is not None else scale(cfg.lr_base, cfg.lr_rule, global_batch, cfg.lr_reference_batch)
    warmup_epochs = cfg.warmup_epochs if cfg.warmup_epochs is not None else \
        scale(cfg.warmup_base, cfg.warmup_rule, global_batch, cfg.lr_reference_batch)
    return total, lr, int(round(warmup_epochs * spe))


class Unwrap:
    """Access to the raw module and its full (unsharded) state, whether DDP, FSDP or compile wrap it."""

    def __init__(self, core: nn.Module, wrapped: nn.Module, fsdp: bool):
        self.core, self.wrapped, self.fsdp = core, wrapped, fsdp

    def _options(self):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=True, cpu_offload=True)

    def state_dict(self) -> dict:
        if self.fsdp:  # a collective: every rank calls it
            from torch.distributed.checkpoint.state_dict import get_model_state_dict

            return get_model_state_dict(self.core, options=self._options())
        return self.core.state_dict()

    def optim_state_dict(self, opt) -> dict:
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

            return get_optimizer_state_dict(self.core, opt, options=self._options())
        return opt.state_dict()

    def load(self, state: dict, opt, opt_state: dict) -> None:
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                                 set_optimizer_state_dict)

            options = StateDictOptions(full_state_dict=True)
            set_model_state_dict(self.core, state, options=options)
            set_optimizer_state_dict(self.core, opt, optim_state_dict=opt_state, options=options)
            return
        self.core.load_state_dict(state)
        opt.load_state_dict(opt_state)


def shard_fsdp(model: nn.Module) -> nn.Module:
    """FSDP2: shard every block of every ModuleList (ViT encoder layers, ResNet stages), then the root."""
    from torch.distributed.fsdp import fully_shard

    for m in list(model.modules()):
        if isinstance(m, nn.ModuleList):
            for block in m:
                fully_shard(block)
    fully_shard(model)
    return model


@contextlib.contextmanager
def no_sync(wrapped: nn.Module, fsdp: bool):
    """Skip the gradient all-reduce / reduce-scatter on a non-update micro step."""
    if fsdp:
        wrapped.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            wrapped.set_requires_gradient_sync(True)
    else:
        with wrapped.no_sync():
            yield


@dataclass
class Session:
    """One worker's training state, built once by ``prepare`` and used by the loop and the checkpoints."""

    cfg: TrainConfig
    info: WorkerInfo
    device: Device
    local_batch: int
    grad_accum: int
    global_batch: int
    shard: Shard
    run_dir: Path
    ckpt_dir: Path
    metrics: MetricsWriter
    train_ds: ImageDataset
    val_ds: ImageDataset
    steps_per_epoch: int
    total: int
    lr: float
    warmup: int
    core: nn.Module
    wrapped: nn.Module
    fwd: Any
    eval_model: nn.Module
    opt: Any
    sched: Any
    scaler: Any
    amp_dtype: torch.dtype | None
    use_scaler: bool
    use_fsdp: bool
    unwrap: Unwrap
    t_start: float
    locks: list = field(default_factory=list)      # rank 0's locks on the run and checkpoint directories
    loader_workers: int = 0                        # loader processes of this rank (podrun.train.data_pool)
    skipped: dict = field(default_factory=dict)    # (split, index) -> times --bad-samples skip replaced it here

    @property
    def rank(self) -> int:
        return self.info.rank

    @property
    def world(self) -> int:
        return self.info.world_size

    def resolved(self) -> dict[str, Any]:
        """What the configuration resolved to in this attempt (config.json's ``resolved``)."""
        return {"world_size": self.world, "instances": self.info.num_instances, "local_batch": self.local_batch,
                "grad_accum": self.grad_accum, "global_batch": self.global_batch,
                "steps_per_epoch": self.steps_per_epoch, "total_steps": self.total, "lr": self.lr,
                "warmup_steps": self.warmup, "device": self.device.kind,
                "amp": str(self.amp_dtype).removeprefix("torch.") if self.amp_dtype else "off",
                "fsdp": self.use_fsdp, "dataset": self.train_ds.name, "train_size": len(self.train_ds),
                "run_dir": str(self.run_dir), "checkpoint_dir": str(self.ckpt_dir),
                "loader_workers": self.loader_workers, "decoder": getattr(self.train_ds, "decoder", None)}


def prepare(cfg: TrainConfig, info: WorkerInfo, device: Device, inplace: bool = False) -> Session:
    """Resolve the decomposition, load the data, build and wrap the model (equal start checked), optimiser, schedule."""
    t_start = time.time()
    world, rank = info.world_size, info.rank
    b, a, g = decompose(cfg, info, replicas=world)
    shard = Shard(local_batch=b, grad_accum=a, replicas=world, replica_offset=rank)
    run_dir = resolve_run_dir(cfg, info)
    locks = claim_dirs(cfg, info, run_dir, checkpoint_dir(cfg, run_dir))
    metrics = MetricsWriter(run_dir, enabled=rank == 0, console=cfg.console and rank == 0, log_every=cfg.log_every)

    data = cfg.data
    if cfg.stage:
        from podrun.train.stage import stage

        from podrun.runtime.env import read_plan

        plan = read_plan(info)
        staged = stage(cfg.data, spec_disk=None if plan is None else plan.get("local_disk"))
        metrics.write(staged.record())
        data = str(staged.root)
    train_ds, val_ds = load_dataset(data, image_size=cfg.image_size, num_classes=cfg.num_classes,
                                    synthetic_size=cfg.synthetic_size, seed=cfg.seed, bad_samples=cfg.bad_samples)
    if train_ds.num_classes > cfg.num_classes:
        raise TrainError(f"dataset {cfg.data} has {train_ds.num_classes} classes but the model has "
                         f"{cfg.num_classes} outputs", hint="set dataset.num_classes in recipe.yaml")
    spe = steps_per_epoch(len(train_ds), shard)
    total, lr, warmup = schedule_lengths(cfg, spe, g)

    # identical seeds on every worker: equal weights without a broadcast (asserted)
    torch.manual_seed(cfg.seed)
    core = build_model(cfg).to(device.torch_device)
    if cfg.channels_last:
        core = core.to(memory_format=torch.channels_last)
    assert_same_start(core, device)

    use_fsdp = cfg.fsdp and world > 1
    if use_fsdp:
        wrapped = shard_fsdp(core)   # in place: core's parameters become sharded DTensors
    elif world > 1 and not inplace:      # in place: the loop all-reduces the gradients (podrun.train.inplace_loop)
        wrapped = nn.parallel.DistributedDataParallel(
            core, device_ids=[device.index] if device.kind == "cuda" else None)
    else:
        wrapped = core
    opt = build_optimizer(core, cfg.optimizer, lr,
                          momentum=cfg.momentum, weight_decay=cfg.weight_decay, eeta=cfg.eeta, eps=cfg.eps,
                          betas=cfg.betas, rho=cfg.rho, nesterov=cfg.nesterov,
                          exclude_bias_and_norm=cfg.exclude_bias_and_norm,
                          fused=True if (cfg.optimizer in ("sgd", "adamw") and device.kind == "cuda") else None)
    sched = build_scheduler(opt, total_steps=total, warmup_steps=warmup, schedule=sched_name(cfg.schedule),
                            power=cfg.power, end_factor=cfg.end_factor, gamma=cfg.gamma,
                            step_every=(int(cfg.step_epochs * spe)
                                        if cfg.step_epochs is not None and cfg.step_epochs > 0 else None))
    amp_dtype, use_scaler = amp_mode(cfg, device)
    scaler = torch.amp.GradScaler(device.kind if device.kind == "cuda" else "cpu", enabled=use_scaler)
    # evaluation runs on the raw module (no collectives in DDP's forward, ranks may see unequal
    # numbers of validation batches); under FSDP every rank evaluates the whole split through FSDP
    return Session(cfg=cfg, info=info, device=device, local_batch=b, grad_accum=a, global_batch=g, shard=shard,
                   run_dir=run_dir, ckpt_dir=checkpoint_dir(cfg, run_dir), metrics=metrics, train_ds=train_ds,
                   val_ds=val_ds, steps_per_epoch=spe, total=total, lr=lr, warmup=warmup, core=core,
                   wrapped=wrapped, fwd=torch.compile(wrapped) if cfg.compile else wrapped,
                   eval_model=wrapped if use_fsdp else core, opt=opt, sched=sched, scaler=scaler,
                   amp_dtype=amp_dtype, use_scaler=use_scaler, use_fsdp=use_fsdp,
                   unwrap=Unwrap(core, wrapped, use_fsdp), t_start=t_start, locks=locks,
                   loader_workers=default_workers(train_ds, info.local_world_size, cfg.loader_workers))
