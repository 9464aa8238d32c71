"""The update loop: GA micro steps with no_sync, AMP, step stats fetched in batches, epoch rows, evaluation, checkpoints."""
from __future__ import annotations

import contextlib
import json
import math
import os
import time
import warnings
from typing import Any

import torch

from podrun.runtime import progress
from podrun.runtime.distributed import Device
from podrun.runtime.env import WorkerInfo
from podrun.train import save
from podrun.train.busy import BusyClock
from podrun.train.config import TrainConfig, TrainError
from podrun.train.data import Loader, eval_batches, normalize, position
from podrun.train.optim import mix_batch, soft_cross_entropy
from podrun.train.setup import Session, all_reduce, no_sync


def resumed_from(origin: dict[str, Any] | None, step: int) -> str | None:
    """What the run record, config.json and the summary say the attempt resumed from: a checkpoint's path, or
    ``snapshot of update N (rank r)``; None for a fresh start."""
    if origin is None:
        return None
    return origin.get("path") or f"snapshot of update {step} (rank {origin['from_rank']})"


def run(s: Session, step: int, acc: dict[str, float], origin: dict[str, Any] | None, writer=None) -> dict[str, Any]:
    """Train from update ``step`` to s.total; returns the summary (also written to <run_dir>/train_summary.json).
    ``origin``: where it resumed from (save.restore); ``writer``: the host's snapshot writer, given the state after
    every update."""
    cfg, info, device, metrics = s.cfg, s.info, s.device, s.metrics
    world, rank, a, g, spe, total = s.world, s.rank, s.grad_accum, s.global_batch, s.steps_per_epoch, s.total
    wrapped, fwd, opt, sched, scaler = s.wrapped, s.fwd, s.opt, s.sched, s.scaler
    amp_dtype = s.amp_dtype
    mean, std = s.train_ds.mean, s.train_ds.std
    resumed = resumed_from(origin, step)
    metrics.write({"kind": "run", "event": "resume" if origin else "start", "step": step, **(origin or {}),
                   "samples": step * g, "world_size": world, "instances": info.num_instances,
                   "local_batch": s.local_batch, "grad_accum": a, "global_batch": g, "steps_per_epoch": spe,
                   "total_steps": total, "device": device.kind,
                   "amp": str(amp_dtype).replace("torch.", "") if amp_dtype else "off", "lr": s.lr,
                   "warmup_steps": s.warmup, "dataset": s.train_ds.name, "train_size": len(s.train_ds),
                   "resumed_from": resumed})
    last_eval: dict[str, Any] = {}
    if step >= total:
        loader_iter = iter(())
    else:
        start_epoch, start_step = position(step * g, g, len(s.train_ds))
        loader_iter = iter(Loader(s.train_ds, s.shard, seed=cfg.seed, start_epoch=start_epoch, start_step=start_step,
                                  prefetch=cfg.prefetch if cfg.prefetch is not None else (3 if device.kind == "cuda" else 0),
                                  pin_memory=device.kind == "cuda"))
    wrapped.train()
    t_last = time.perf_counter()
    sync_every = max(1, cfg.sync_every if cfg.sync_every is not None else
                     (cfg.log_every if device.kind == "cuda" else 1))
    pending: list[tuple[int, int, float, torch.Tensor, float | None]] = []   # (step, epoch, lr, stats on the device,
    busy = BusyClock(wrapped)                                                #  this rank's busy seconds)

    def flush() -> None:
        """Fetch the pending steps' stats in one all-reduce and one copy; check them; write their rows."""
        nonlocal t_last
        if not pending:
            return
        stats_all = all_reduce(torch.stack([p[3] for p in pending])).cpu()
        mine = [p[4] for p in pending if p[4] is not None]
        busy_s = sum(mine) / len(mine) if mine else None     # this rank's own, for podrun's slow-rank watch
        now = time.perf_counter()
        dt, t_last = (now - t_last) / len(pending), now        # the interval's steps share its time
        for (at, ep, lr_at, _, _), stats in zip(pending, stats_all):
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
            progress.report(step=at, total=total, epoch=ep, loss=loss_g, samples_per_sec=g / dt, step_seconds=dt,
                            busy_seconds=busy_s)
        pending.clear()

    busy.start()                       # the step's start: before its batch is fetched
    for epoch, estep, micro in loader_iter:
        if step >= total:
            break
        stats_dev = torch.zeros(3, dtype=torch.float64, device=device.torch_device)  # no sync per micro step
        for j, (x, y) in enumerate(micro):
            x = normalize(x.to(device.torch_device, non_blocking=True), mean, std,
                          channels_last=cfg.channels_last)
            y = y.to(device.torch_device, non_blocking=True)
            target = y
            if cfg.mixup > 0 or cfg.cutmix > 0:
                gen = torch.Generator().manual_seed(hash((cfg.seed, step, rank, j)) & 0x7FFFFFFF)
                x, target = mix_batch(x, y, cfg.num_classes, gen, cfg.mixup, cfg.cutmix)
            sync = j == a - 1 or world == 1
            ctx = contextlib.nullcontext() if sync else no_sync(wrapped, s.use_fsdp)
            with ctx:
                with torch.autocast(device.kind if device.kind == "cuda" else "cpu", dtype=amp_dtype or torch.bfloat16,
                                    enabled=amp_dtype is not None):
                    logits = fwd(x)
                    loss = soft_cross_entropy(logits, target, cfg.label_smoothing)
                # a mean over the local batch, divided by GA, averaged over replicas by DDP: the mean
                # over the global batch, whatever replicas x local batch x GA make it up
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
        pending.append((step, epoch, lr_now, stats_dev, busy.seconds()))
        end_of_epoch = estep == spe - 1
        checkpoint_now = cfg.checkpoint_every > 0 and step % cfg.checkpoint_every == 0 and step < total
        if len(pending) >= sync_every or end_of_epoch or checkpoint_now or step >= total:
            flush()                    # every rank flushes at the same steps: the all-reduce matches
        if checkpoint_now:
            progress.phase("checkpoint")      # podrun does not read a long write as a hang
            save.save(s, step, acc)
        if end_of_epoch:
            metrics.write({"kind": "epoch", "step": step, "epoch": epoch, "loss": acc["loss"] / acc["count"],
                           "accuracy": acc["correct"] / acc["count"], "seconds": acc["seconds"],
                           "images_per_sec": acc["count"] / max(acc["seconds"], 1e-9),
                           "images_per_sec_instance": acc["count"] / max(acc["seconds"], 1e-9)
                           * info.local_world_size / world})
            acc = save.new_accumulators()
            if cfg.eval_every > 0 and (epoch + 1) % cfg.eval_every == 0 and step < total:
                progress.phase("eval")
                last_eval = evaluate(s.eval_model, s.val_ds, cfg, device, info, amp_dtype, mean, std, s.use_fsdp)
                metrics.write({"kind": "eval", "step": step, "epoch": epoch, **last_eval})
                wrapped.train()
            t_last = time.perf_counter()
        if writer is not None and step < total:
            save.snapshot(s, writer, step, acc)     # in the background; the next optimizer step waits for it
        if step >= total:
            break
        busy.start()
    flush()
    if step > 0:
        progress.phase("checkpoint")
    save.final(s, step, acc)
    progress.phase("eval")
    last_eval = evaluate(s.eval_model, s.val_ds, cfg, device, info, amp_dtype, mean, std, s.use_fsdp)
    metrics.write({"kind": "eval", "step": step, "epoch": (step - 1) // spe if step else 0, **last_eval})
    summary = {"steps": step, "total_steps": total, "global_batch": g, "local_batch": s.local_batch,
               "grad_accum": a, "world_size": world, "seconds": time.time() - s.t_start, "run_dir": str(s.run_dir),
               "resumed_from": resumed, **last_eval}
    kept = save.finish(s)              # where the kept checkpoints are, in the end record and the summary
    summary.update(kept)
    metrics.write({"kind": "run", "event": "end", "step": step, **kept,
                   **{k: v for k, v in summary.items() if k in ("val_accuracy", "val_loss", "seconds")}})
    metrics.close()
    unwritten = [f"{metrics.lost} metrics record(s) ({metrics.error})"] if metrics.lost else []
    if rank == 0:
        path = s.run_dir / "train_summary.json"
        try:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps(summary, indent=2) + "\n")
            os.replace(tmp, path)
        except OSError as exc:
            unwritten.append(f"{path.name} ({exc.strerror or exc})")
            try:
                tmp.unlink()
            except OSError:
                pass
    summary["not_written"] = unwritten
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
        all_reduce(stats)
    n = max(stats[2].item(), 1.0)
    return {"val_loss": stats[0].item() / n, "val_accuracy": stats[1].item() / n, "val_samples": int(stats[2].item())}
