"""Atomic checkpoints: write to a temporary file, fsync, os.replace; find and load the newest good one."""
from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from podrun.errors import PodrunError
from podrun.train.config import TrainConfig

_NAME = re.compile(r"^ckpt-(\d{9})\.pt$")


class CheckpointError(PodrunError):
    """A checkpoint that cannot be read, or a resume that does not match the run."""


def path_for(directory: str | os.PathLike, step: int) -> Path:
    return Path(directory) / f"ckpt-{step:09d}.pt"


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def check_keep(keep: int) -> int:
    """``keep`` if it is a count of checkpoints to keep (0 included); else a CheckpointError (exit 2)."""
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 0:
        raise CheckpointError(f"--keep-checkpoints {keep!r}: must be a whole number >= 0",
                              hint=f"N keeps the newest N checkpoints (default {TrainConfig.keep_checkpoints}); "
                                   "0 removes them all when the run finishes")
    return keep


def save(state: dict[str, Any], directory: str | os.PathLike, step: int, keep: int) -> Path:
    """Write ``state`` as checkpoint ``step`` atomically, then remove all but the newest ``keep`` (at least the
    newest one: a restart resumes from it); a crash at any point leaves the older ones intact."""
    check_keep(keep)
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    final = path_for(d, step)
    for stale in d.glob(".ckpt-*.tmp-*"):  # left by a saver killed mid-write (one saver per directory)
        if not stale.name.endswith(f"-{os.getpid()}"):
            stale.unlink(missing_ok=True)
    tmp = d / f".{final.name}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        try:  # make the rename itself durable
            fd = os.open(d, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            pass
    finally:
        if tmp.exists():
            tmp.unlink()
    prune(d, max(keep, 1))
    return final


def prune(directory: str | os.PathLike, keep: int) -> list[Path]:
    """Remove all complete checkpoints but the newest ``keep`` (by step); returns the ones left, oldest first."""
    found = list_checkpoints(directory)
    cut = len(found) - keep if keep < len(found) else 0
    for old in found[:cut]:
        try:
            old.unlink()
        except FileNotFoundError:
            pass
    return found[cut:]


def finish(directory: str | os.PathLike, keep: int) -> dict[str, Any]:
    """At the end of a finished run, keep the newest ``keep`` checkpoints (none for 0); returns where they are,
    for the run's end record: checkpoint_dir, checkpoints (names, oldest first), checkpoint_bytes, keep_checkpoints."""
    left = prune(directory, check_keep(keep))
    size = 0
    for p in left:
        try:
            size += p.stat().st_size
        except FileNotFoundError:
            pass
    return {"checkpoint_dir": str(directory), "checkpoints": [p.name for p in left], "checkpoint_bytes": size,
            "keep_checkpoints": keep}


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Complete checkpoints (never the temporary files), oldest first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    return sorted((p for p in d.iterdir() if _NAME.match(p.name)), key=lambda p: int(_NAME.match(p.name).group(1)))


def load_latest(directory: str | os.PathLike, map_location="cpu") -> tuple[Path, dict] | None:
    """The newest checkpoint that loads; an unreadable newest one (e.g. a disk error) falls back to older ones."""
    errors = []
    for p in reversed(list_checkpoints(directory)):
        try:
            return p, torch.load(p, map_location=map_location, weights_only=False)
        except Exception as exc:  # noqa: BLE001 - report every unreadable file if none loads
            errors.append(f"{p.name}: {type(exc).__name__}: {exc}")
    if errors:
        raise CheckpointError(f"{directory}: no checkpoint could be read ({'; '.join(errors)})",
                              hint="remove the unreadable files to start from scratch")
    return None
