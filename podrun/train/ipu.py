"""The IPU path of the runner: poptorch drives the instance's replicas, GA and device iterations in one call.

One worker per instance (see podrun.wire.worker_env.workers_per_instance); poptorch.Options carries
replicationFactor = local replicas, Training.gradientAccumulation = GA and, across instances,
Distributed.configureProcessId(instance index, instances), as popdist.poptorch.Options would.
Images reach the device as uint8 and are normalised there (inside the wrapped model). They come from poptorch's
own DataLoader in its asynchronous mode (it reads ahead while the device runs, the conversion MMCV's IPU runner
makes), over StepSamples: this instance's samples in the order its steps take them, so that the global batches
are podrun.train.data.Loader's whatever the decomposition.
Only the poptorch API is used; tests run it against a fake poptorch (poptorch is not on PyPI).
"""
from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import nn

from podrun.runtime import progress
from podrun.runtime.distributed import Device
from podrun.runtime.steps import StepClock
from podrun.runtime.env import WorkerInfo
from podrun.train import checkpoint as ckpt
from podrun.train.config import TrainError, decompose, sched_name, write_config
from podrun.train.data import Shard, epoch_permutation, load_dataset, step_indices, steps_per_epoch
from podrun.rundir.metrics import MetricsWriter
from podrun.train.optim import lr_factor, soft_cross_entropy
from podrun.train.save import FORMAT, resume_step
from podrun.train.setup import build_model, checkpoint_dir, resolve_run_dir


class TrainingWrapper(nn.Module):
    """uint8 images -> normalise -> model -> (logits, loss): the loss must live inside the IPU graph."""

    def __init__(self, model: nn.Module, mean, std, smoothing: float, half: bool):
        super().__init__()
        self.model, self.smoothing, self.half = model, smoothing, half
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1) * 255, persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1) * 255, persistent=False)

    def forward(self, x, y):
        import poptorch

        x = (x.float() - self.mean) / self.std
        if self.half:
            x = x.half()
        logits = self.model(x)
        loss = poptorch.identity_loss(soft_cross_entropy(logits.float(), y, self.smoothing), reduction="mean")
        return logits, loss


class StepSamples(torch.utils.data.Dataset):
    """This instance's training samples from update ``start`` on, in the order its steps take them: item k is
    sample k % S of update start + k // S (S = local batch x local replicas x GA, laid out as
    podrun.train.data.step_indices' micro batches one after the other), decoded and augmented by (seed, epoch,
    index) as the Loader does. poptorch's DataLoader (batch_size = the local batch, not shuffled, not partitioned
    again) reads S of them per call: the instance's whole step."""

    def __init__(self, dataset, shard: Shard, seed: int, start: int, steps: int):
        self.ds, self.shard, self.seed, self.start, self.steps = dataset, shard, seed, start, steps
        self.per_step = shard.local_batch * shard.local_replicas * shard.grad_accum
        self.spe = steps_per_epoch(len(dataset), shard)
        self._perm: tuple[int, object] | None = None

    def __len__(self) -> int:
        return self.steps * self.per_step

    def key(self, k: int) -> tuple[int, int]:
        """(epoch, dataset index) of item ``k``."""
        update, at = divmod(k, self.per_step)
        epoch, step = divmod(self.start + update, self.spe)
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, epoch_permutation(len(self.ds), self.seed, epoch))
        ix = step_indices(self._perm[1], step, self.shard)
        return epoch, int(ix[at // (self.shard.local_batch * self.shard.local_replicas)]
                          [at % (self.shard.local_batch * self.shard.local_replicas)])

    def __getitem__(self, k: int):
        epoch, i = self.key(k)
        x, y = self.ds.batch([i], epoch, train=True)
        return x[0], y[0]


def _optimizer(poptorch, params, cfg, lr: float, half: bool):
    name = cfg.optimizer.lower()
    kw: dict[str, Any] = {"lr": lr, "weight_decay": cfg.weight_decay}
    if half:
        kw["loss_scaling"] = 128.0
    if name in ("sgd", "lars"):  # poptorch has no LARS: SGD with the same momentum (said in the notes)
        return poptorch.optim.SGD(params, momentum=cfg.momentum, **kw)
    if name in ("rmsprop", "rmsprop_tf"):
        return poptorch.optim.RMSprop(params, alpha=cfg.rho, momentum=cfg.momentum, **kw)
    return poptorch.optim.AdamW(params, betas=tuple(cfg.betas), **kw)


def train_ipu(cfg, info: WorkerInfo, device: Device) -> dict[str, Any]:
    import poptorch

    t0 = time.time()
    b, a, g = decompose(cfg, info, replicas=info.num_replicas)
    shard = Shard(local_batch=b, grad_accum=a, replicas=info.num_replicas, replica_offset=info.replica_offset,
                  local_replicas=info.local_replicas)
    run_dir = resolve_run_dir(cfg, info)
    main = info.instance_index == 0
    metrics = MetricsWriter(run_dir, enabled=main, console=cfg.console and main, log_every=cfg.log_every)
    train_ds, _ = load_dataset(cfg.data, image_size=cfg.image_size, num_classes=cfg.num_classes,
                               synthetic_size=cfg.synthetic_size, seed=cfg.seed)
    spe = steps_per_epoch(len(train_ds), shard)
    total = cfg.steps if cfg.steps is not None else int(math.ceil((1 if cfg.epochs is None else cfg.epochs) * spe))
    from podrun.plan.lr import scale

    lr = cfg.lr if cfg.lr is not None else scale(cfg.lr_base, cfg.lr_rule, g, cfg.lr_reference_batch)
    warmup_epochs = cfg.warmup_epochs if cfg.warmup_epochs is not None else cfg.warmup_base
    warmup = int(round(warmup_epochs * spe))

    torch.manual_seed(cfg.seed)  # the same on every instance: equal weights without a broadcast
    model = build_model(cfg)
    half = cfg.amp in ("fp16", "auto_fp16", "half")
    if half:
        model = model.half()
    wrapper = TrainingWrapper(model, train_ds.mean, train_ds.std, cfg.label_smoothing, half)

    opts = poptorch.Options()
    opts.randomSeed(cfg.seed)
    opts.deviceIterations(1)
    opts.replicationFactor(info.local_replicas)
    opts.Training.gradientAccumulation(a)
    if info.num_instances > 1:
        opts.Distributed.configureProcessId(info.instance_index, info.num_instances)

    def sched(step: int) -> float:
        return lr * lr_factor(step, total_steps=total, warmup_steps=warmup, schedule=sched_name(cfg.schedule),
                              power=cfg.power, end_factor=cfg.end_factor, gamma=cfg.gamma)

    step = 0
    ckpt_dir = checkpoint_dir(cfg, run_dir)
    ckpt.check_keep(cfg.keep_checkpoints)
    if cfg.resume:
        found = ckpt.load_latest(ckpt_dir)
        if found:
            step = resume_step(found[0], found[1], global_batch=g, seed=cfg.seed, train_size=len(train_ds))
            model.load_state_dict(found[1]["model"])

    def state(at: int) -> dict:
        return {"format": FORMAT, "model": model.state_dict(), "samples": at * g, "step": at, "global_batch": g,
                "seed": cfg.seed, "train_size": len(train_ds), "steps_per_epoch": spe}

    if main:
        write_config(run_dir, cfg, {"world_size": info.world_size, "instances": info.num_instances,
                                    "replicas": info.num_replicas, "local_batch": b, "grad_accum": a,
                                    "global_batch": g, "steps_per_epoch": spe, "total_steps": total, "lr": lr,
                                    "warmup_steps": warmup, "device": "ipu", "train_size": len(train_ds),
                                    "run_dir": str(run_dir), "checkpoint_dir": str(ckpt_dir),
                                    "resumed_at_step": step})
    optimizer = _optimizer(poptorch, wrapper.parameters(), cfg, sched(step), half)
    tm = poptorch.trainingModel(wrapper, options=opts, optimizer=optimizer)
    metrics.write({"kind": "run", "event": "start", "step": step, "world_size": info.world_size,
                   "instances": info.num_instances, "replicas": info.num_replicas, "local_batch": b,
                   "grad_accum": a, "global_batch": g, "total_steps": total, "device": "ipu", "lr": lr})
    t_last = time.perf_counter()
    from podrun.train.data_pool import default_workers

    workers = default_workers(train_ds, 1, cfg.loader_workers)      # one worker per instance: the host's share
    # poptorch takes the instance's whole step at once (local batch x replicas x GA), read ahead asynchronously
    loader = poptorch.DataLoader(opts, StepSamples(train_ds, shard, cfg.seed, step, max(total - step, 0)),
                                 batch_size=b, shuffle=False, drop_last=True, num_workers=workers,
                                 auto_distributed_partitioning=False, mode=poptorch.DataLoaderMode.Async)
    # the step's split: poptorch runs forward, backward, the replicas' all-reduce and the optimiser in one call on
    # the device, so that call is compute (comm 0); optim is the new optimiser's upload (setOptimizer)
    clock = StepClock(None, loaders=max(1, workers))
    clock.start()
    for x, y in loader:
        if step >= total:
            break
        clock.fetched()
        epoch = step // spe
        logits, loss = tm(x, y)
        loss_v = float(torch.as_tensor(loss).float().mean())
        if not math.isfinite(loss_v):
            raise TrainError(f"loss became {loss_v} at step {step + 1}", exit_code=1)
        clock.synced()
        step += 1
        optimizer = _optimizer(poptorch, wrapper.parameters(), cfg, sched(step), half)
        tm.setOptimizer(optimizer)
        clock.stepped()
        now = time.perf_counter()
        dt, t_last = now - t_last, now
        acc = float((torch.as_tensor(logits).argmax(-1) == y[: len(logits)]).float().mean())
        metrics.write({"kind": "step", "step": step, "epoch": epoch, "loss": loss_v, "accuracy": acc,
                       "lr": sched(step - 1), "images_per_sec": g / dt,
                       "images_per_sec_instance": len(y) / dt, "step_seconds": dt})
        progress.report(step=step, total=total, epoch=epoch, loss=loss_v, samples_per_sec=g / dt, step_seconds=dt,
                        split=clock.split())
        if cfg.checkpoint_every > 0 and step % cfg.checkpoint_every == 0 and main:
            tm.copyWeightsToHost()
            ckpt.save(state(step), ckpt_dir, step, cfg.keep_checkpoints)
        clock.start()
    tm.copyWeightsToHost()
    if main and step > 0 and cfg.keep_checkpoints > 0:
        ckpt.save(state(step), ckpt_dir, step, cfg.keep_checkpoints)
    kept = ckpt.finish(ckpt_dir, cfg.keep_checkpoints) if main else {}
    tm.detachFromDevice()
    summary = {"steps": step, "total_steps": total, "global_batch": g, "local_batch": b, "grad_accum": a,
               "replicas": info.num_replicas, "seconds": time.time() - t0, "run_dir": str(run_dir)}
    metrics.write({"kind": "run", "event": "end", "step": step, "seconds": summary["seconds"], **kept})
    metrics.close()
    return summary
