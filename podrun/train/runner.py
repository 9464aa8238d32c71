"""The device-agnostic training loop every recipe's train.py calls: DDP/FSDP, GA with no_sync, AMP, checkpoints, metrics."""
from __future__ import annotations

import contextlib
import json
import math
import os
import random
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from podrun.errors import PodrunError
from podrun.runtime.distributed import Device, destroy_distributed, init_distributed, select_device
from podrun.runtime.env import WorkerInfo, read_worker_info
from podrun.train import checkpoint as ckpt
from podrun.train.data import Loader, Shard, eval_batches, load_dataset, normalize, steps_per_epoch
from podrun.train.metrics import MetricsWriter
from podrun.train.optim import build_optimizer, build_scheduler, mix_batch, soft_cross_entropy


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
    resume: bool = True
    eval_every: int = 1                     # epochs; 0: only at the end
    eval_batch: int = 256
    log_every: int = 10
    sync_every: int | None = None           # steps whose stats are fetched from the device at once; None:
                                            # log_every on CUDA (no host sync per step), 1 elsewhere
    console: bool = True
    dist_timeout: float = 120.0
    prefetch: int | None = None            # batches prefetched by a thread; None: 3 on CUDA, 0 on CPU


# ---------------------------------------------------------------------------------------- helpers

def _all_reduce(t: torch.Tensor, op=None) -> torch.Tensor:
    """In-place all-reduce of a small tensor on any device (NCCL needs CUDA tensors, gloo CPU ones)."""
    if dist.is_available() and dist.is_initialized():
        if dist.get_backend() == "nccl" and t.device.type != "cuda":
            on = t.to(f"cuda:{torch.cuda.current_device()}")
            dist.all_reduce(on, op=op or dist.ReduceOp.SUM)
            t.copy_(on.cpu())
        else:
            dist.all_reduce(t, op=op or dist.ReduceOp.SUM)
    return t


def _setup_determinism(cfg: TrainConfig) -> None:
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


def _threads(cfg: TrainConfig, info: WorkerInfo, device: Device) -> None:
    if device.kind != "cpu":
        return
    n = cfg.threads
    if n is None and "OMP_NUM_THREADS" not in os.environ:
        n = max(1, (os.cpu_count() or 1) // max(1, info.local_world_size))
    if n is not None and n >= 1:
        torch.set_num_threads(n)


def decompose(cfg: TrainConfig, info: WorkerInfo, replicas: int) -> tuple[int, int, int]:
    """(local batch, GA, global batch): arguments first, then the env contract, checked to multiply out."""
    b = cfg.local_batch or info.local_batch
    a = cfg.grad_accum or info.grad_accum
    g = cfg.global_batch or info.global_batch
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


def _build_model(cfg: TrainConfig) -> nn.Module:
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
    _all_reduce(hi, dist.ReduceOp.MAX)
    _all_reduce(lo, dist.ReduceOp.MIN)
    if not torch.equal(hi, lo):
        raise TrainError(
            f"workers start with different weights (parameter checksums range {lo.tolist()} .. {hi.tolist()})",
            hint="every worker must use the same --seed and the same model options", exit_code=1)


def _amp(cfg: TrainConfig, device: Device) -> tuple[torch.dtype | None, bool]:
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


def _resolve_run_dir(cfg: TrainConfig, info: WorkerInfo) -> Path:
    d = cfg.run_dir or info.run_dir
    if d is None:
        name = [f"runs/{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"]
        if dist.is_available() and dist.is_initialized():
            dist.broadcast_object_list(name, src=0)  # every worker agrees on rank 0's choice
        d = name[0]
    return Path(d)


class _Unwrap:
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
def _no_sync(wrapped: nn.Module, fsdp: bool):
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


# ---------------------------------------------------------------------------------------- the loop

def train(cfg: TrainConfig, info: WorkerInfo | None = None) -> dict[str, Any]:
    """Train to cfg.steps / cfg.epochs; returns the summary (also written to <run_dir>/train_summary.json)."""
    info = info or read_worker_info()
    device = select_device(cfg.device, info)
    _threads(cfg, info, device)
    if device.kind == "ipu":
        from podrun.train.ipu import train_ipu

        return train_ipu(cfg, info, device)
    _setup_determinism(cfg)
    init_distributed(info=info, device=device, timeout=cfg.dist_timeout)
    try:
        return _train(cfg, info, device)
    finally:
        destroy_distributed()


def _train(cfg: TrainConfig, info: WorkerInfo, device: Device) -> dict[str, Any]:
    t_start = time.time()
    world, rank = info.world_size, info.rank
    b, a, g = decompose(cfg, info, replicas=world)
    shard = Shard(local_batch=b, grad_accum=a, replicas=world, replica_offset=rank)
    run_dir = _resolve_run_dir(cfg, info)
    ckpt_dir = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else run_dir / "checkpoints"
    metrics = MetricsWriter(run_dir, enabled=rank == 0, console=cfg.console and rank == 0, log_every=cfg.log_every)

    train_ds, val_ds = load_dataset(cfg.data, image_size=cfg.image_size, num_classes=cfg.num_classes,
                                    synthetic_size=cfg.synthetic_size, seed=cfg.seed)
    if train_ds.num_classes > cfg.num_classes:
        raise TrainError(f"dataset {cfg.data} has {train_ds.num_classes} classes but the model has "
                         f"{cfg.num_classes} outputs", hint="set dataset.num_classes in recipe.yaml")
    spe = steps_per_epoch(len(train_ds), shard)
    total = cfg.steps if cfg.steps is not None else None
    if cfg.epochs is not None:
        by_epochs = int(math.ceil(cfg.epochs * spe))
        total = by_epochs if total is None else min(total, by_epochs)
    if total is None:
        raise TrainError("neither --steps nor --epochs given")
    from podrun.plan.lr import scale

    lr = cfg.lr if cfg.lr is not None else scale(cfg.lr_base, cfg.lr_rule, g, cfg.lr_reference_batch)
    warmup_epochs = cfg.warmup_epochs if cfg.warmup_epochs is not None else \
        scale(cfg.warmup_base, cfg.warmup_rule, g, cfg.lr_reference_batch)
    warmup = int(round(warmup_epochs * spe))

    # identical seeds on every worker: equal weights without a broadcast (asserted)
    torch.manual_seed(cfg.seed)
    core = _build_model(cfg).to(device.torch_device)
    if cfg.channels_last:
        core = core.to(memory_format=torch.channels_last)
    assert_same_start(core, device)

    use_fsdp = cfg.fsdp and world > 1
    if use_fsdp:
        wrapped = shard_fsdp(core)   # in place: core's parameters become sharded DTensors
    elif world > 1:
        wrapped = nn.parallel.DistributedDataParallel(
            core, device_ids=[device.index] if device.kind == "cuda" else None)
    else:
        wrapped = core
    opt = build_optimizer(core, cfg.optimizer, lr,
                          momentum=cfg.momentum, weight_decay=cfg.weight_decay, eeta=cfg.eeta, eps=cfg.eps,
                          betas=cfg.betas, rho=cfg.rho, nesterov=cfg.nesterov,
                          exclude_bias_and_norm=cfg.exclude_bias_and_norm,
                          fused=True if (cfg.optimizer in ("sgd", "adamw") and device.kind == "cuda") else None)
    sched = build_scheduler(opt, total_steps=total, warmup_steps=warmup, schedule=_sched_name(cfg.schedule),
                            power=cfg.power, end_factor=cfg.end_factor, gamma=cfg.gamma,
                            step_every=int(cfg.step_epochs * spe) if cfg.step_epochs else None)
    amp_dtype, use_scaler = _amp(cfg, device)
    scaler = torch.amp.GradScaler(device.kind if device.kind == "cuda" else "cpu", enabled=use_scaler)
    unwrap = _Unwrap(core, wrapped, use_fsdp)
    fwd = torch.compile(wrapped) if cfg.compile else wrapped
    # evaluation runs on the raw module (no collectives in DDP's forward, ranks may see unequal
    # numbers of validation batches); under FSDP every rank evaluates the whole split through FSDP
    fsdp_eval = use_fsdp
    eval_model = wrapped if fsdp_eval else core

    # resume from the newest good checkpoint
    step, acc = 0, {"loss": 0.0, "correct": 0.0, "count": 0.0, "seconds": 0.0}
    resumed_from = None
    if cfg.resume:
        found = ckpt.load_latest(ckpt_dir, map_location=device.torch_device if device.kind == "cuda" else "cpu")
        found_step = torch.tensor([found[1]["step"] if found else -1], dtype=torch.float64)
        hi, lo = _all_reduce(found_step.clone(), dist.ReduceOp.MAX if dist.is_initialized() else None), \
            _all_reduce(found_step.clone(), dist.ReduceOp.MIN if dist.is_initialized() else None)
        if hi.item() != lo.item():
            raise TrainError(f"workers found different checkpoints in {ckpt_dir} (steps {lo.item():.0f}..{hi.item():.0f})",
                             hint="the checkpoint directory must be shared by every host", exit_code=1)
        if found:
            path, state = found
            if state.get("global_batch") != g:
                raise TrainError(f"{path}: saved at global batch {state.get('global_batch')}, this run uses {g}",
                                 hint="resume with the same global batch, or pass a new --checkpoint-dir")
            unwrap.load(state["model"], opt, state["optimizer"])
            sched.load_state_dict(state["scheduler"])
            if state.get("scaler"):
                scaler.load_state_dict(state["scaler"])
            ckpt.set_rng_state(state["rng"])
            step, acc = state["step"], state.get("epoch_acc", acc)
            resumed_from = str(path)

    def save_checkpoint(at: int) -> None:
        model_state, opt_state = unwrap.state_dict(), unwrap.optim_state_dict(opt)  # collective under FSDP
        if rank == 0:
            ckpt.save({"model": model_state, "optimizer": opt_state, "scheduler": sched.state_dict(),
                       "scaler": scaler.state_dict() if use_scaler else None, "step": at,
                       "global_batch": g, "rng": ckpt.rng_state(), "epoch_acc": dict(acc)}, ckpt_dir, at)

    mean, std = train_ds.mean, train_ds.std
    metrics.write({"kind": "run", "event": "resume" if resumed_from else "start", "step": step,
                   "world_size": world, "instances": info.num_instances, "local_batch": b, "grad_accum": a,
                   "global_batch": g, "steps_per_epoch": spe, "total_steps": total, "device": device.kind,
                   "amp": str(amp_dtype).replace("torch.", "") if amp_dtype else "off", "lr": lr,
                   "warmup_steps": warmup, "dataset": train_ds.name, "train_size": len(train_ds),
                   "resumed_from": resumed_from})
    last_eval: dict[str, Any] = {}
    if step >= total:
        loader_iter = iter(())
    else:
        loader_iter = iter(Loader(train_ds, shard, seed=cfg.seed, start_epoch=step // spe,
                                  start_step=step % spe,
                                  prefetch=cfg.prefetch if cfg.prefetch is not None else (3 if device.kind == "cuda" else 0),
                                  pin_memory=device.kind == "cuda"))
    wrapped.train()
    t_last = time.perf_counter()
    sync_every = max(1, cfg.sync_every if cfg.sync_every is not None else (cfg.log_every if device.kind == "cuda" else 1))
    pending: list[tuple[int, int, float, torch.Tensor]] = []     # (step, epoch, lr, stats on the device)

    def flush() -> None:
        """Fetch the pending steps' stats in one all-reduce and one copy; check them; write their rows."""
        nonlocal t_last
        if not pending:
            return
        stats_all = _all_reduce(torch.stack([p[3] for p in pending])).cpu()
        now = time.perf_counter()
        dt, t_last = (now - t_last) / len(pending), now        # the interval's steps share its time
        for (at, ep, lr_at, _), stats in zip(pending, stats_all):
            loss_g, acc_g = stats[0].item() / stats[2].item(), stats[1].item() / stats[2].item()
            if not math.isfinite(loss_g):
                raise TrainError(f"loss became {loss_g} at step {at}",
                                 hint="lower the learning rate, or use --amp fp16 loss scaling / bf16", exit_code=1)
            acc["loss"] += stats[0].item()
            acc["correct"] += stats[1].item()
            acc["count"] += stats[2].item()
            acc["seconds"] += dt
            metrics.write({"kind": "step", "step": at, "epoch": ep, "loss": loss_g, "accuracy": acc_g,
                           "lr": lr_at, "images_per_sec": g / dt,
                           "images_per_sec_instance": g / dt * info.local_world_size / world,
                           "step_seconds": dt})
        pending.clear()

    for epoch, estep, micro in loader_iter:
        if step >= total:
            break
        stats_dev = torch.zeros(3, dtype=torch.float64, device=device.torch_device)  # no sync per micro step
        for j, (x, y) in enumerate(micro):
            x = normalize(x.to(device.torch_device, non_blocking=True), mean, std,
                          channels_last=cfg.channels_last)
            y = y.to(device.torch_device, non_blocking=True)
            target = y
            if cfg.mixup or cfg.cutmix:
                gen = torch.Generator().manual_seed(hash((cfg.seed, step, rank, j)) & 0x7FFFFFFF)
                x, target = mix_batch(x, y, cfg.num_classes, gen, cfg.mixup, cfg.cutmix)
            sync = j == a - 1 or world == 1
            ctx = contextlib.nullcontext() if sync else _no_sync(wrapped, use_fsdp)
            with ctx:
                with torch.autocast(device.kind if device.kind == "cuda" else "cpu", dtype=amp_dtype or torch.bfloat16,
                                    enabled=amp_dtype is not None):
                    logits = fwd(x)
                    loss = soft_cross_entropy(logits, target, cfg.label_smoothing)
                scaler.scale(loss / a).backward()
            with torch.no_grad():
                stats_dev[0] += loss.detach().double() * len(y)
                stats_dev[1] += (logits.argmax(-1) == y).sum()
                stats_dev[2] += len(y)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        lr_now = opt.param_groups[0]["lr"]
        with warnings.catch_warnings():  # fp16: the scaler skips steps with inf grads; expected
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
            sched.step()
        step += 1
        pending.append((step, epoch, lr_now, stats_dev))
        end_of_epoch = estep == spe - 1
        checkpoint_now = cfg.checkpoint_every > 0 and step % cfg.checkpoint_every == 0 and step < total
        if len(pending) >= sync_every or end_of_epoch or checkpoint_now or step >= total:
            flush()                    # every rank flushes at the same steps: the all-reduce matches
        if checkpoint_now:
            save_checkpoint(step)
        if end_of_epoch:
            metrics.write({"kind": "epoch", "step": step, "epoch": epoch, "loss": acc["loss"] / acc["count"],
                           "accuracy": acc["correct"] / acc["count"], "seconds": acc["seconds"],
                           "images_per_sec": acc["count"] / max(acc["seconds"], 1e-9),
                           "images_per_sec_instance": acc["count"] / max(acc["seconds"], 1e-9)
                           * info.local_world_size / world})
            acc = {"loss": 0.0, "correct": 0.0, "count": 0.0, "seconds": 0.0}
            if cfg.eval_every > 0 and (epoch + 1) % cfg.eval_every == 0 and step < total:
                last_eval = evaluate(eval_model, val_ds, cfg, device, info, amp_dtype, mean, std, fsdp_eval)
                metrics.write({"kind": "eval", "step": step, "epoch": epoch, **last_eval})
                wrapped.train()
            t_last = time.perf_counter()
        if step >= total:
            break
    flush()
    if step > 0:
        save_checkpoint(step)
    last_eval = evaluate(eval_model, val_ds, cfg, device, info, amp_dtype, mean, std, fsdp_eval)
    metrics.write({"kind": "eval", "step": step, "epoch": (step - 1) // spe if step else 0, **last_eval})
    summary = {"steps": step, "total_steps": total, "global_batch": g, "local_batch": b, "grad_accum": a,
               "world_size": world, "seconds": time.time() - t_start, "run_dir": str(run_dir),
               "resumed_from": resumed_from, **last_eval}
    metrics.write({"kind": "run", "event": "end", "step": step, **{k: v for k, v in summary.items()
                                                                      if k in ("val_accuracy", "val_loss", "seconds")}})
    metrics.close()
    if rank == 0:
        (run_dir / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def evaluate(model, val_ds, cfg: TrainConfig, device: Device, info: WorkerInfo, amp_dtype, mean, std,
             whole: bool = False) -> dict:
    """Top-1 accuracy and loss on the validation split, sharded by rank and summed over workers
    (``whole``: every rank evaluates every sample, no reduction)."""
    model.eval()
    stats = torch.zeros(3, dtype=torch.float64)
    rank, world = (0, 1) if whole else (info.rank, info.world_size)
    with torch.no_grad():
        for x, y in eval_batches(val_ds, cfg.eval_batch, rank, world):
            x = normalize(x.to(device.torch_device), mean, std, channels_last=cfg.channels_last)
            y = y.to(device.torch_device)
            with torch.autocast(device.kind if device.kind == "cuda" else "cpu", dtype=amp_dtype or torch.bfloat16,
                                enabled=amp_dtype is not None):
                logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.float(), y, reduction="sum")
            stats += torch.tensor([loss.item(), (logits.argmax(-1) == y).sum().item(), len(y)], dtype=torch.float64)
    if not whole:
        _all_reduce(stats)
    n = max(stats[2].item(), 1.0)
    return {"val_loss": stats[0].item() / n, "val_accuracy": stats[1].item() / n, "val_samples": int(stats[2].item())}


def _sched_name(name: str) -> str:
    return {"polynomial": "poly"}.get(name, name)


def config_dict(cfg: TrainConfig) -> dict:
    d = asdict(cfg)
    if callable(cfg.model):
        d["model"] = getattr(cfg.model, "__name__", "callable")
    return d
