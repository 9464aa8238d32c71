"""The update loop: GA micro steps with no_sync, AMP, step stats fetched in batches, epoch rows, evaluation, checkpoints."""
from __future__ import annotations

import contextlib
import json
import math
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from podrun import safefs
from podrun.rundir.layout import TRAIN_SUMMARY
from podrun.runtime import progress
from podrun.runtime.steps import StepClock, mean_split
from podrun.train import save
from podrun.train.config import TrainError
from podrun.train.data import Loader, eval_batches, normalize, position
from podrun.train.optim import mix_batch, soft_cross_entropy
from podrun.train.setup import Session, all_reduce, no_sync
from podrun.wire.protocol import StepSplit


def resumed_from(origin: dict[str, Any] | None, step: int) -> str | None:
    """What the run record, config.json and the summary say the attempt resumed from: a checkpoint's path, or
    ``snapshot of update N (rank r)``; None for a fresh start."""
    if origin is None:
        return None
    return origin.get("path") or f"snapshot of update {step} (rank {origin['from_rank']})"


@dataclass
class Pending:
    """An update whose loss and accuracy are still on the device: fetched with the others in one all-reduce."""

    step: int
    epoch: int
    lr: float
    stats: torch.Tensor             # (loss sum, correct, count) over this rank's micro batches, on the device
    busy_s: float | None            # this rank's busy seconds for the update (podrun's slow-rank watch)
    split: StepSplit | None = None  # its split into input, compute, comm and optim (podrun.runtime.steps)


def run(s: Session, step: int, acc: dict[str, float], origin: dict[str, Any] | None, writer=None,
        inplace=None) -> dict[str, Any]:
    """Train from update ``step`` to s.total; returns the summary (also written to <run_dir>/train_summary.json).
    ``origin``: where it resumed from (save.restore); ``writer``: the host's snapshot writer, given the state after
    every update; ``inplace``: the in-place recovery (podrun.train.inplace_loop.InPlace), else None (DDP syncs)."""
    cfg, device = s.cfg, s.device
    resumed = resumed_from(origin, step)
    _record_start(s, step, origin, resumed)
    _report_empty_classes(s)
    loader_iter = iter(()) if step >= s.total else _loader(s, step)
    s.wrapped.train()
    sync_every = max(1, cfg.sync_every if cfg.sync_every is not None else
                     (cfg.log_every if device.kind == "cuda" else 1))
    rows = StepRows(s, acc, reduced=inplace is not None)
    # the step's split: host-clock stamps, each after a synchronize on CUDA (queued kernels counted where they run)
    busy = StepClock(s.wrapped, sync=torch.cuda.synchronize if device.kind == "cuda" else None,
                     loaders=_loaders(s))
    busy.start()                       # the step's start: before its batch is fetched
    first = step + 1                   # the attempt's first step: start-up (CUDA's autotune, the first allocations,
    #                                    the loader's first fill), as the run's account counts it; its split is not sent
    while True:
        try:
            epoch, estep, micro = next(loader_iter)
        except StopIteration:
            break
        if step >= s.total:
            break
        busy.fetched()                 # the wait for the loader ends
        if inplace is not None:
            inplace.begin()
        stats = _accumulate(s, micro, step)
        if inplace is not None:
            from podrun.runtime.inplace import Abandoned

            try:
                stats = inplace.sync(s, stats)
            except Abandoned:          # a new plan: the same update again, on the new group with the new share
                loader_iter = inplace.recover(s, step, loader_iter, _loader)
                rows.t_last = time.perf_counter()     # the update done again is timed from here, not the recovery
                busy.start()
                continue
        busy.synced()                  # backward returned: DDP's all-reduce completed
        lr_now = _update(s)
        busy.stepped()
        step += 1
        if inplace is not None:
            inplace.done(step)
        split = busy.split()
        rows.pending.append(Pending(step, epoch, lr_now, stats, busy.busy(), split if step != first else None))
        end_of_epoch = estep == s.steps_per_epoch - 1
        checkpoint_now = cfg.checkpoint_every > 0 and step % cfg.checkpoint_every == 0 and step < s.total
        if len(rows.pending) >= sync_every or end_of_epoch or checkpoint_now or step >= s.total:
            rows.flush()               # every rank flushes at the same steps: the all-reduce matches
        if checkpoint_now:
            progress.phase("checkpoint")      # podrun does not read a long write as a hang
            save.save(s, step, rows.acc)
        if end_of_epoch:
            rows.end_epoch(step, epoch)
        if writer is not None and step < s.total:
            save.snapshot(s, writer, step, rows.acc)     # in the background; the next optimizer step waits for it
        if step >= s.total:
            break
        busy.start()
    rows.flush()
    return _finish(s, step, rows.acc, resumed)


def _record_start(s: Session, step: int, origin: dict[str, Any] | None, resumed: str | None) -> None:
    """The run record that opens the attempt's metrics: where it starts and the decomposition it runs."""
    decomposition = {k: v for k, v in s.resolved().items() if k not in ("fsdp", "run_dir", "checkpoint_dir")}
    s.metrics.write({"kind": "run", "event": "resume" if origin else "start", "step": step, **(origin or {}),
                     "samples": step * s.global_batch, **decomposition, "resumed_from": resumed})


def _loaders(s: Session) -> int:
    """What feeds the step, for the step split: the loader worker processes, else the prefetch thread (1) or none."""
    return s.loader_workers if s.loader_workers > 0 else (1 if _prefetch(s) > 0 else 0)


def _prefetch(s: Session) -> int:
    """Batches the loader's thread makes ahead: --prefetch, else 3 on CUDA and none (no thread) elsewhere."""
    return s.cfg.prefetch if s.cfg.prefetch is not None else (3 if s.device.kind == "cuda" else 0)


def _loader(s: Session, step: int) -> Iterator:
    """The training batches from update ``step`` on: the data order is a function of the seed and the epoch."""
    start_epoch, start_step = position(step * s.global_batch, s.global_batch, len(s.train_ds))
    ds, transform = _device_decoder(s)
    return iter(Loader(ds, s.shard, seed=s.cfg.seed, start_epoch=start_epoch, start_step=start_step,
                       prefetch=_prefetch(s), pin_memory=s.device.kind == "cuda", workers=s.loader_workers,
                       on_skip=lambda bad: _skipped(s, bad, "train"), transform=transform))


def _device_decoder(s: Session):
    """(the dataset the loader reads, the transform of its batches): a folder's JPEGs decoded by the device where
    podrun.train.data_device can (CUDA with torchvision), else the training split as it is."""
    from podrun.train import data_device
    from podrun.train.data import FolderDataset

    if not isinstance(s.train_ds, FolderDataset) or not data_device.usable(s.device.kind):
        return s.train_ds, None
    ds, where = s.train_ds, s.device.torch_device
    return data_device.RawFolder(ds), lambda raw: data_device.decode_batch(raw, ds, where)


def _skipped(s: Session, bad, split: str) -> None:
    """A sample that ``--bad-samples skip`` replaced: counted every time for the summary; the first time, one line on
    this rank's stderr and a metrics record."""
    key = (split, bad.index)
    s.skipped[key] = s.skipped.get(key, 0) + 1
    if s.skipped[key] == 1:
        print(f"podrun: rank {s.rank}: skipped {bad.line()}", file=sys.stderr, flush=True)
        s.metrics.write({"kind": "bad_sample", "split": split, "path": bad.path, "index": bad.index,
                         "reason": bad.reason})


def _report_empty_classes(s: Session) -> None:
    """Class folders kept without samples under ``--bad-samples skip``: named once, by rank 0, and recorded."""
    empty = getattr(s.train_ds, "empty_classes", [])
    if s.rank == 0:
        for folder in empty:
            print(f"podrun: skipped empty class folder {folder}", file=sys.stderr, flush=True)
    if empty:
        s.metrics.write({"kind": "bad_sample", "split": "train", "empty_classes": list(empty)})


def _bad_samples(s: Session) -> dict[str, Any] | None:
    """The summary's count of skipped samples over every rank (None for data held in memory)."""
    if not s.train_ds.decodes_files:
        return None
    skipped = all_reduce(torch.tensor([float(sum(s.skipped.values()))], dtype=torch.float64))
    return {"mode": s.cfg.bad_samples, "skipped": int(skipped.item()),
            "empty_classes": list(getattr(s.train_ds, "empty_classes", []))}


def _accumulate(s: Session, micro, step: int) -> torch.Tensor:
    """Forward and backward over one update's GA micro batches (gradients synced on the last one only); returns
    this rank's (loss sum, correct, count), kept on the device (no sync per micro step)."""
    cfg, device, mean, std = s.cfg, s.device, s.train_ds.mean, s.train_ds.std
    stats = torch.zeros(3, dtype=torch.float64, device=device.torch_device)
    for j, (x, y) in enumerate(micro):
        x = normalize(x.to(device.torch_device, non_blocking=True), mean, std, channels_last=cfg.channels_last)
        y = y.to(device.torch_device, non_blocking=True)
        target = y
        if cfg.mixup > 0 or cfg.cutmix > 0:
            gen = torch.Generator().manual_seed(hash((cfg.seed, step, s.rank, j)) & 0x7FFFFFFF)
            x, target = mix_batch(x, y, cfg.num_classes, gen, cfg.mixup, cfg.cutmix)
        sync = j == s.grad_accum - 1 or s.world == 1 or s.wrapped is s.core    # bare: the loop syncs (in place)
        ctx = contextlib.nullcontext() if sync else no_sync(s.wrapped, s.use_fsdp)
        with ctx:
            with torch.autocast(device.kind if device.kind == "cuda" else "cpu", dtype=s.amp_dtype or torch.bfloat16,
                                enabled=s.amp_dtype is not None):
                logits = s.fwd(x)
                loss = soft_cross_entropy(logits, target, cfg.label_smoothing)
            # a mean over the local batch, divided by GA, averaged over replicas by DDP: the mean
            # over the global batch, whatever replicas x local batch x GA make it up
            s.scaler.scale(loss / s.grad_accum).backward()
        with torch.no_grad():
            stats[0] += loss.detach().double() * len(y)
            stats[1] += (logits.argmax(-1) == y).sum()
            stats[2] += len(y)
    return stats


def _update(s: Session) -> float:
    """The optimizer step and the schedule's; returns the learning rate the step used."""
    s.scaler.step(s.opt)
    s.scaler.update()
    s.opt.zero_grad(set_to_none=True)
    lr_now = s.opt.param_groups[0]["lr"]
    with warnings.catch_warnings():  # fp16: the scaler skips steps with inf grads; expected
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
        s.sched.step()
    return lr_now


class StepRows:
    """The step and epoch rows of metrics.jsonl: the pending updates' stats fetched at once, checked, summed into
    the epoch's accumulators (``acc``, kept in the checkpoint so an epoch row survives a resume)."""

    def __init__(self, s: Session, acc: dict[str, float], reduced: bool = False):
        self.s, self.acc = s, acc
        self.reduced = reduced     # the stats were summed over the ranks with the gradients (in place)
        self.pending: list[Pending] = []
        self.t_last = time.perf_counter()

    def flush(self) -> None:
        """Fetch the pending steps' stats in one all-reduce and one copy; check them; write their rows."""
        if not self.pending:
            return
        s, g = self.s, self.s.global_batch
        stacked = torch.stack([p.stats for p in self.pending])
        stats_all = (stacked if self.reduced else all_reduce(stacked)).cpu()
        mine = [p.busy_s for p in self.pending if p.busy_s is not None]
        busy_s = sum(mine) / len(mine) if mine else None     # this rank's own, for podrun's slow-rank watch
        split = mean_split([p.split for p in self.pending if p.split is not None])
        now = time.perf_counter()
        dt, self.t_last = (now - self.t_last) / len(self.pending), now   # the interval's steps share its time
        for p, stats in zip(self.pending, stats_all):
            loss_g, acc_g = stats[0].item() / stats[2].item(), stats[1].item() / stats[2].item()
            if not math.isfinite(loss_g):
                raise TrainError(f"loss became {loss_g} at step {p.step}",
                                 hint="lower the learning rate, or use --amp fp16 loss scaling / bf16", exit_code=1)
            for key, value in zip(("loss", "correct", "count", "seconds"), (*stats.tolist(), dt)):
                self.acc[key] += value
            s.metrics.write({"kind": "step", "step": p.step, "epoch": p.epoch, "loss": loss_g, "accuracy": acc_g,
                             "lr": p.lr, "images_per_sec": g / dt,
                             "images_per_sec_instance": g / dt * s.info.local_world_size / s.world,
                             "step_seconds": dt, **({"split": p.split.to_dict()} if p.split is not None else {})})
            progress.report(step=p.step, total=s.total, epoch=p.epoch, loss=loss_g, samples_per_sec=g / dt,
                            step_seconds=dt, busy_seconds=busy_s, split=split)
        self.pending.clear()

    def end_epoch(self, step: int, epoch: int) -> None:
        """The epoch's row, fresh accumulators, and the evaluation every --eval-every epochs (not after the last
        update: the final evaluation follows it)."""
        s, acc = self.s, self.acc
        rate = acc["count"] / max(acc["seconds"], 1e-9)
        s.metrics.write({"kind": "epoch", "step": step, "epoch": epoch, "loss": acc["loss"] / acc["count"],
                         "accuracy": acc["correct"] / acc["count"], "seconds": acc["seconds"],
                         "images_per_sec": rate, "images_per_sec_instance": rate * s.info.local_world_size / s.world})
        self.acc = save.new_accumulators()
        if s.cfg.eval_every > 0 and (epoch + 1) % s.cfg.eval_every == 0 and step < s.total:
            _evaluate(s, step, epoch)
            s.wrapped.train()
        self.t_last = time.perf_counter()


def _finish(s: Session, step: int, acc: dict[str, float], resumed: str | None) -> dict[str, Any]:
    """After the last update: the final checkpoint and evaluation, the end record, and the summary (rank 0 writes
    train_summary.json); the summary's ``not_written`` says what could not be written."""
    if step > 0:
        progress.phase("checkpoint")
    save.final(s, step, acc)
    last_eval = _evaluate(s, step, (step - 1) // s.steps_per_epoch if step else 0)
    summary = {"steps": step, "total_steps": s.total, "global_batch": s.global_batch, "local_batch": s.local_batch,
               "grad_accum": s.grad_accum, "world_size": s.world, "seconds": time.time() - s.t_start,
               "run_dir": str(s.run_dir), "resumed_from": resumed, **last_eval}
    bad = _bad_samples(s)
    if bad is not None:
        summary["bad_samples"] = bad
    kept = save.finish(s)              # where the kept checkpoints are, in the end record and the summary
    summary.update(kept)
    s.metrics.write({"kind": "run", "event": "end", "step": step, **kept,
                     **{k: v for k, v in summary.items() if k in ("val_accuracy", "val_loss", "seconds")}})
    s.metrics.close()
    unwritten = [f"{s.metrics.lost} metrics record(s) ({s.metrics.error})"] if s.metrics.lost else []
    if s.rank == 0:
        path = s.run_dir / TRAIN_SUMMARY
        try:
            safefs.write_file(path, json.dumps(summary, indent=2) + "\n", path.name, durable=False)
        except (OSError, safefs.UnsafePath) as exc:
            why = exc.message if isinstance(exc, safefs.UnsafePath) else exc.strerror or exc
            unwritten.append(f"{path.name} ({why})")
    summary["not_written"] = unwritten
    return summary


def _evaluate(s: Session, step: int, epoch: int) -> dict[str, Any]:
    """Top-1 accuracy and loss on the validation split, sharded by rank and summed over workers (under FSDP every
    rank evaluates every sample, no reduction), in phase "eval"; written as the eval record of ``step`` and
    ``epoch`` with its seconds (the run's account)."""
    progress.phase("eval")
    t0 = time.perf_counter()
    cfg, device, amp_dtype, model = s.cfg, s.device, s.amp_dtype, s.eval_model
    model.eval()
    stats = torch.zeros(3, dtype=torch.float64)
    rank, world = (0, 1) if s.use_fsdp else (s.rank, s.world)
    with torch.no_grad():
        for x, y in eval_batches(s.val_ds, cfg.eval_batch, rank, world, lambda bad: _skipped(s, bad, "val"),
                                 workers=s.loader_workers):
            x = normalize(x.to(device.torch_device), s.train_ds.mean, s.train_ds.std, channels_last=cfg.channels_last)
            y = y.to(device.torch_device)
            with torch.autocast(device.kind if device.kind == "cuda" else "cpu", dtype=amp_dtype or torch.bfloat16,
                                enabled=amp_dtype is not None):
                logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.float(), y, reduction="sum")
            stats += torch.tensor([loss.item(), (logits.argmax(-1) == y).sum().item(), len(y)], dtype=torch.float64)
    if not s.use_fsdp:
        all_reduce(stats)
    n = max(stats[2].item(), 1.0)
    ev = {"val_loss": stats[0].item() / n, "val_accuracy": stats[1].item() / n, "val_samples": int(stats[2].item())}
    s.metrics.write({"kind": "eval", "step": step, "epoch": epoch, **ev, "seconds": round(time.perf_counter() - t0, 4)})
    return ev
