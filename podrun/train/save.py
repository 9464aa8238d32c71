"""What a checkpoint holds (the position in global samples, not per-rank steps) and the resume: find, check, restore
(from the newest in-memory snapshot a rank holds when it is newer than the disk checkpoint).

The position is ``samples``, the number of training samples consumed (update steps x global batch).
Since the data order is a function of the seed and the epoch only (podrun.train.data), a position on
a global-batch boundary names the next global batch whatever the replicas x local batch x GA split
that resumes it. A checkpoint that cannot continue the same sequence (another global batch, seed or
training set, or a position off a global-batch boundary) is refused with ResumeError (exit 2).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from podrun.train import checkpoint as ckpt
from podrun.train.setup import Session, agree, all_reduce

FORMAT = 2      # 1: "step" and "global_batch" only; 2: adds samples, seed, train_size, steps_per_epoch


class ResumeError(ckpt.CheckpointError):
    """A checkpoint this run cannot continue exactly (another global batch, seed or data set, or an odd position)."""


def new_accumulators() -> dict[str, float]:
    """The running sums of an epoch's step rows (kept in the checkpoint so an epoch row survives a resume)."""
    return {"loss": 0.0, "correct": 0.0, "count": 0.0, "seconds": 0.0}


def position_of(state: dict[str, Any]) -> tuple[int, int | None]:
    """(samples consumed, global batch) of a checkpoint; format 1 files give them as step x global batch."""
    g = state.get("global_batch")
    if "samples" in state:
        return int(state["samples"]), g
    return int(state["step"]) * int(g if g is not None else 0), g


def resume_step(path: Path | str, state: dict[str, Any], *, global_batch: int, seed: int, train_size: int) -> int:
    """The update step to continue from, once this run is checked to continue the checkpoint's global batches."""
    samples, saved_g = position_of(state)
    hint = ("resume with the global batch, seed and data the checkpoint was written with (replicas, local "
            "batch and GA may change), or start over with --no-resume or a new --checkpoint-dir")
    if saved_g != global_batch:
        raise ResumeError(f"{path}: saved at global batch {saved_g} after {samples} samples; this run uses "
                          f"global batch {global_batch}, so its global batches and learning-rate schedule "
                          "would not continue the saved run's", hint=hint)
    if samples % global_batch:
        raise ResumeError(f"{path}: position {samples} samples is not on a boundary of global batch "
                          f"{global_batch}; the next global batch cannot be continued exactly", hint=hint)
    for key, now, what in (("seed", seed, "seed"), ("train_size", train_size, "training set size")):
        if key in state and state[key] != now:
            raise ResumeError(f"{path}: saved with {what} {state[key]}, this run has {now}; the data order "
                              "(a function of the seed and the epoch) would differ", hint=hint)
    return samples // global_batch


def agree_on_checkpoint(s: Session, found: tuple[Path, dict] | None) -> None:
    """Every worker must have found the same checkpoint (a directory not shared between hosts otherwise)."""
    mark = torch.tensor([position_of(found[1])[0] if found else -1], dtype=torch.float64)
    on = dist.is_initialized()
    hi = all_reduce(mark.clone(), dist.ReduceOp.MAX if on else None)
    lo = all_reduce(mark.clone(), dist.ReduceOp.MIN if on else None)
    if hi.item() != lo.item():
        raise ckpt.CheckpointError(
            f"workers found different checkpoints in {s.ckpt_dir} (samples {lo.item():.0f}..{hi.item():.0f})",
            hint="the checkpoint directory must be shared by every host", exit_code=1)


def snapshot_writer(s: Session):
    """This host's snapshot writer (podrun.runtime.snapshot), or None: no PODRUN_SNAPSHOT_DIR, --no-snapshots,
    or FSDP (each rank holds a shard; a full state dict per update would be a collective); also None, said in one
    line, without the run's key or where the directory is not this user's private one."""
    if not s.info.snapshot_dir or not s.cfg.snapshots or s.use_fsdp:
        return None
    from podrun.runtime.snapshot import open_writer

    return open_writer(s.info.snapshot_dir, writes=s.info.local_rank == 0)    # one writer per host


def restore(s: Session, writer=None) -> tuple[int, dict[str, float], dict[str, Any] | None]:
    """(step, epoch accumulators, where it resumed from) from the newest in-memory snapshot any rank holds when it
    is newer than the newest good checkpoint, else that checkpoint, else a fresh start (None). Where: ``source``
    "snapshot" or "checkpoint", ``path`` (the checkpoint's), ``from_rank`` and ``fetched_by`` (a snapshot's),
    ``why`` (the choice, in words) and ``rejected`` (newer checkpoints passed over: path and why). Checkpoints
    that exist but none of which is good: a CheckpointError (exit 2) naming each and why."""
    acc = new_accumulators()
    ckpt.check_keep(s.cfg.keep_checkpoints)
    if not s.cfg.resume:
        return 0, acc, None
    found, bad = ckpt.newest_good(s.ckpt_dir, map_location=s.device.torch_device if s.device.kind == "cuda" else "cpu")
    rejected = [{"path": str(p), "why": why} for p, why in bad]
    if s.rank == 0:
        for p, why in bad:
            print(f"podrun: checkpoint {p} passed over: {why}", file=sys.stderr, flush=True)
    agree_on_checkpoint(s, found)
    check = dict(global_batch=s.global_batch, seed=s.cfg.seed, train_size=len(s.train_ds))
    disk = resume_step(found[0], found[1], **check) if found else -1
    if writer is not None:
        from podrun.runtime.snapshot import recover

        got = recover(writer, disk, s.info.restart_count)
        if got is not None:
            step = resume_step(f"the snapshot of update {got.step} (rank {got.from_rank})", got.state, **check)
            _load(s, got.state)
            newest = f"the newest good checkpoint's (update {disk})" if found else "any checkpoint's (none is good)"
            return step, got.state.get("epoch_acc", acc), {
                "source": "snapshot", "from_rank": got.from_rank, "fetched_by": list(got.fetched_by),
                "why": f"the snapshot of update {got.step} is newer than {newest}", "rejected": rejected}
    if not found:
        if bad:
            raise ckpt.none_good(s.ckpt_dir, bad)
        return 0, acc, None
    path, state = found
    _load(s, state)
    why = f"the newest good checkpoint (update {disk})"
    why += "; no snapshot is newer" if writer is not None else "; no snapshots in this run"
    if bad:
        why += f"; {len(bad)} newer one(s) passed over"
    return disk, state.get("epoch_acc", acc), {"source": "checkpoint", "path": str(path), "why": why,
                                               "rejected": rejected}


def _load(s: Session, state: dict[str, Any]) -> None:
    s.unwrap.load(state["model"], s.opt, state["optimizer"])
    s.sched.load_state_dict(state["scheduler"])
    if state.get("scaler"):
        s.scaler.load_state_dict(state["scaler"])
    ckpt.set_rng_state(state["rng"])


def state(s: Session, step: int, acc: dict[str, float], model_state: dict, opt_state: dict) -> dict[str, Any]:
    """What a checkpoint and a snapshot hold after ``step`` updates."""
    return {"format": FORMAT, "model": model_state, "optimizer": opt_state,
            "scheduler": s.sched.state_dict(), "scaler": s.scaler.state_dict() if s.use_scaler else None,
            "samples": step * s.global_batch, "step": step, "global_batch": s.global_batch,
            "seed": s.cfg.seed, "train_size": len(s.train_ds), "steps_per_epoch": s.steps_per_epoch,
            "rng": ckpt.rng_state(), "epoch_acc": dict(acc)}


class _Counter:
    """A file-like object that only counts the bytes written to it."""

    def __init__(self):
        self.n = 0

    def write(self, b) -> int:
        self.n += len(b)
        return len(b)

    def flush(self) -> None:
        pass


def optimizer_slots(cfg) -> int:
    """Tensors of the weights' size the optimizer keeps per parameter once it has stepped (momentum, moments)."""
    momentum = 1 if cfg.momentum != 0 else 0
    return {"rmsprop": 1 + momentum, "sgd": momentum, "lars": momentum}.get(str(cfg.optimizer).lower(), 2)


def checkpoint_bytes(s: Session, step: int = 0) -> int:
    """About the size of one checkpoint of this run: the state as it is now (serialised to a counter), plus the
    optimizer's per-parameter tensors it does not hold before its first step (under FSDP, where the full state
    is a collective: the weights and those tensors only)."""
    params = sum(p.numel() * p.element_size() for p in s.core.parameters())
    slots = 0 if len(s.opt.state) > 0 else optimizer_slots(s.cfg)
    if s.use_fsdp:
        return params * (1 + optimizer_slots(s.cfg))
    counter = _Counter()
    torch.save(state(s, step, new_accumulators(), s.unwrap.state_dict(), s.unwrap.optim_state_dict(s.opt)), counter)
    return counter.n + params * slots


def check_room(s: Session, step: int) -> None:
    """Before training, when the run will write a checkpoint: the checkpoint directory has room for one more
    (rank 0 looks; every rank calls it and ends with it); else a CheckpointError (exit 2) naming it, the bytes
    needed and free."""
    refusal = None
    if s.rank == 0 and step < s.total and (s.cfg.checkpoint_every > 0 or s.cfg.keep_checkpoints > 0):
        size = max(checkpoint_bytes(s, step), ckpt.newest_size(s.ckpt_dir) or 0)
        free = ckpt.free_bytes(s.ckpt_dir)
        if free is not None and free < size:
            every = s.cfg.checkpoint_every
            first = min((step // every + 1) * every, s.total) if every > 0 else s.total
            err = ckpt.no_space(ckpt.path_for(s.ckpt_dir, first), size, free)
            refusal = ckpt.CheckpointError(err.message.removesuffix("; the older checkpoints are intact")
                                           + "; refused before training", hint=err.hint, exit_code=2)
    agree(refusal, ckpt.CheckpointError("rank 0 found no room for a checkpoint (its message says how much)"))


def save(s: Session, step: int, acc: dict[str, float]) -> None:
    """Checkpoint after ``step`` updates (a collective under FSDP: every rank calls it; rank 0 writes); the
    seconds the training waited for it go to the metrics (the run's account: checkpoint stalls)."""
    t0 = time.perf_counter()
    model_state, opt_state = s.unwrap.state_dict(), s.unwrap.optim_state_dict(s.opt)
    if s.rank == 0:
        ckpt.save(state(s, step, acc, model_state, opt_state), s.ckpt_dir, step, s.cfg.keep_checkpoints)
    s.metrics.write({"kind": "checkpoint", "step": step, "seconds": round(time.perf_counter() - t0, 4)})


def snapshot(s: Session, writer, step: int, acc: dict[str, float]) -> None:
    """Hand the state after ``step`` updates to this host's snapshot writer (a background write, DDP only)."""
    from podrun.runtime.snapshot import freeze

    writer.submit(step, state(s, step, acc, freeze(s.core), s.opt.state_dict()))


def final(s: Session, step: int, acc: dict[str, float]) -> None:
    """The checkpoint at the end of the training loop; none under --keep-checkpoints 0, which keeps none."""
    if step > 0 and s.cfg.keep_checkpoints > 0:
        save(s, step, acc)


def finish(s: Session) -> dict[str, Any]:
    """After the last evaluation (every rank is past training): rank 0 keeps the newest --keep-checkpoints
    checkpoints and says where they are (the run's end record); {} on the other ranks."""
    return ckpt.finish(s.ckpt_dir, s.cfg.keep_checkpoints) if s.rank == 0 else {}
