"""Checkpoint files: written whole through safefs with a digest of their bytes (a new random O_EXCL temporary file,
fsync, rename) into a directory only this user may write, one writer per directory (a lock), loaded only when no
one but this user (or root) can have written them and their digest matches; the newest good one found, the bad
ones named."""
from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import random
import re
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import torch

from podrun import safefs
from podrun.errors import PodrunError
from podrun.train.config import TrainConfig
from podrun.rundir.lock import writer_alive

_NAME = re.compile(r"^ckpt-(\d{9})\.pt$")
_TMP = re.compile(r"^\.ckpt-\d{9}\.pt\.tmp-(?P<tail>.+)$")       # safefs.replacing's temporary files
_OLD_TMP = re.compile(r"^(?:(?P<host>.+)-)?(?P<pid>\d+)$")        # the tail of an older podrun's: host-pid
# The digest travels inside the file as its zip comment (torch.save writes a zip archive; torch.load and any zip
# reader pass the comment over): ``podrun-sha256:<hex>`` of the archive as torch.save wrote it (comment length 0).
_MARK = b"podrun-sha256:"
_COMMENT = len(_MARK) + 64
_EOCD = 22                      # the zip end-of-central-directory record, without its comment
_EOCD_SIG = b"PK\x05\x06"


class CheckpointError(PodrunError):
    """A checkpoint that cannot be read, or a resume that does not match the run."""


def path_for(directory: str | os.PathLike, step: int) -> Path:
    return Path(directory) / f"ckpt-{step:09d}.pt"


def rng_state() -> dict[str, Any]:
    """Every generator's state, as values torch.load(weights_only=True) reads (numpy's key array as a tensor)."""
    kind, key, pos, has_gauss, cached = np.random.get_state()
    state = {"python": random.getstate(),
             "numpy": (kind, torch.from_numpy(key.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    kind, key, pos, has_gauss, cached = state["numpy"]
    key = key.cpu().numpy() if isinstance(key, torch.Tensor) else np.asarray(key)   # loaded onto a device
    np.random.set_state((kind, key.astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([t.cpu() for t in state["cuda"]])


def check_keep(keep: int) -> int:
    """``keep`` if it is a count of checkpoints to keep (0 included); else a CheckpointError (exit 2)."""
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 0:
        raise CheckpointError(f"--keep-checkpoints {keep!r}: must be a whole number >= 0",
                              hint=f"N keeps the newest N checkpoints (default {TrainConfig.keep_checkpoints}); "
                                   "0 removes them all when the run finishes")
    return keep


class _Digesting:
    """A binary file torch.save writes through: the bytes go on to ``f`` and into a sha256; the last ones are
    kept (the archive's end record, whose comment length ``seal`` sets)."""

    def __init__(self, f):
        self.f, self.sha, self.n, self.tail = f, hashlib.sha256(), 0, b""

    def write(self, b) -> int:
        b = bytes(b) if not isinstance(b, bytes) else b
        self.f.write(b)
        self.sha.update(b)
        self.n += len(b)
        self.tail = (self.tail + b[-_EOCD:])[-_EOCD:]
        return len(b)

    def flush(self) -> None:
        self.f.flush()

    def seal(self) -> None:
        """Give the archive its digest as its comment."""
        if self.n < _EOCD or self.tail[:4] != _EOCD_SIG or self.tail[-2:] != b"\0\0":
            raise CheckpointError("torch.save wrote no zip archive ending in an empty comment: cannot add the digest")
        self.f.seek(self.n - 2)
        self.f.write(struct.pack("<H", _COMMENT) + _MARK + self.sha.hexdigest().encode())


def verify(data: bytes) -> str | None:
    """None when ``data`` carries a digest its bytes match; else why not."""
    n = len(data)
    if n == 0:
        return "empty (0 bytes)"
    tail = _EOCD + _COMMENT
    if n < tail or data[-_COMMENT:-64] != _MARK:
        return f"no digest at its end ({n:,} bytes: truncated, or not written by podrun)"
    eocd = data[-tail:-_COMMENT]
    if eocd[:4] != _EOCD_SIG or struct.unpack("<H", eocd[20:22])[0] != _COMMENT:
        return f"its end is damaged ({n:,} bytes)"
    sha = hashlib.sha256(memoryview(data)[:-_COMMENT - 2])
    sha.update(b"\0\0")                    # the comment length as torch.save wrote it
    want, got = data[-64:].decode("ascii", "replace"), sha.hexdigest()
    if got != want:
        return f"digest mismatch: its bytes changed after it was written (sha256 {got[:12]}.., recorded {want[:12]}..)"
    return None


def decode(path: Path, map_location="cpu") -> tuple[dict | None, str | None]:
    """(state, None) for a checkpoint that no one but this user (or root) can have written (safefs: the file and
    every directory on its way this user's or root's, writable by no one else, no link), whose digest matches and
    that loads (weights_only); else (None, why). Only this user can change the file once it is checked."""
    problem = safefs.trusted_problem(path)
    if problem is not None:
        return None, f"not trusted: {problem}"
    try:
        data = path.read_bytes()
    except OSError as exc:
        return None, f"unreadable: {exc.strerror or exc}"
    why = verify(data)
    if why is not None:
        return None, why
    try:
        state = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure makes the file unusable; the message says which
        return None, f"does not load: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if not isinstance(state, dict):
        return None, "does not hold a state dictionary"
    return state, None


def remove_dead_temps(directory: str | os.PathLike) -> list[Path]:
    """Remove the temporary files of writers that are dead; returns those removed. Called by the directory's one
    writer (it holds the lock, or is the one saver): a temporary file with a random name is a dead writer's; one
    an older podrun named by host and pid stays while that writer may live (another host's, or a live pid)."""
    d, gone = Path(directory), []
    try:
        names = list(d.iterdir())
    except OSError:
        return gone
    for p in names:
        m = _TMP.match(p.name)
        old = _OLD_TMP.match(m.group("tail")) if m is not None else None
        if m is None or old is not None and writer_alive(old.group("host"), int(old.group("pid"))):
            continue
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
            gone.append(p)
    return gone


def free_bytes(directory: str | os.PathLike) -> int | None:
    """The bytes free on ``directory``'s device; None when that cannot be told."""
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def no_space(path: Path, needed: int, free: int | None, exact: bool = True) -> CheckpointError:
    """The one paragraph of a full disk: the path, the bytes needed (``exact`` False: at least those, written
    when the disk refused more) and free."""
    room = f"{free:,} bytes free" if free is not None else "free space unknown"
    need = f"{needed:,} bytes" if exact else f"more than {needed:,} bytes"
    return CheckpointError(
        f"no space left on the device of {path.parent} for checkpoint {path.name}: it needs {need}, "
        f"{room}; the older checkpoints are intact",
        hint="free space there, lower --keep-checkpoints, or pass --checkpoint-dir on a larger disk, then "
             "resume (podrun resume RUN, or the same command)", exit_code=1)


def save(state: dict[str, Any], directory: str | os.PathLike, step: int, keep: int) -> Path:
    """Write ``state`` as checkpoint ``step`` with its digest (computed as it is written), atomically, then remove
    all but the newest ``keep`` (at least the newest one: a restart resumes from it); a crash at any point leaves
    the older ones intact. ENOSPC (checked before the write against the newest checkpoint's size, and during
    it) is a CheckpointError naming the path, the bytes needed and free."""
    check_keep(keep)
    d = safefs.own_dir(directory, "checkpoint directory")
    final = path_for(d, step)
    remove_dead_temps(d)
    needed = newest_size(d)     # what this one needs, about (a state's size changes little)
    free = free_bytes(d)
    if needed is not None and free is not None and free < needed:
        raise no_space(final, needed, free)
    w = None
    try:
        with safefs.replacing(final, "checkpoint", error=CheckpointError) as f:
            w = _Digesting(f)
            try:
                torch.save(state, w)
            except RuntimeError as exc:     # torch's zip writer turns a failed write into this; the cause says
                cause = exc.__cause__ or exc.__context__
                if isinstance(cause, OSError):
                    raise cause from None
                raise
            w.seal()
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise no_space(final, needed if needed is not None else (w.n if w is not None else 0), free_bytes(d),
                           exact=needed is not None) from None
        raise CheckpointError(f"cannot write checkpoint {final}: {exc.strerror or exc}",
                              hint="check that --checkpoint-dir is writable and its disk healthy",
                              exit_code=1) from None
    prune(d, max(keep, 1))
    return final


def prune(directory: str | os.PathLike, keep: int) -> list[Path]:
    """Remove all complete checkpoints but the newest ``keep`` (by step); returns the ones left, oldest first."""
    found = list_checkpoints(directory)
    cut = len(found) - keep if keep < len(found) else 0
    for old in found[:cut]:
        with contextlib.suppress(FileNotFoundError):
            old.unlink()
    return found[cut:]


def finish(directory: str | os.PathLike, keep: int) -> dict[str, Any]:
    """At the end of a finished run, keep the newest ``keep`` checkpoints (none for 0); returns where they are,
    for the run's end record: checkpoint_dir, checkpoints (names, oldest first), checkpoint_bytes, keep_checkpoints."""
    left = prune(directory, check_keep(keep))
    size = 0
    for p in left:
        with contextlib.suppress(FileNotFoundError):
            size += p.stat().st_size
    return {"checkpoint_dir": str(directory), "checkpoints": [p.name for p in left], "checkpoint_bytes": size,
            "keep_checkpoints": keep}


def newest_size(directory: str | os.PathLike) -> int | None:
    """The bytes of the newest complete checkpoint; None when there is none (or it went away)."""
    found = list_checkpoints(directory)
    try:
        return found[-1].stat().st_size if found else None
    except OSError:
        return None


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Complete checkpoints (never the temporary files), oldest first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    return sorted((p for p in d.iterdir() if _NAME.match(p.name)), key=lambda p: int(_NAME.match(p.name).group(1)))


def newest_good(directory: str | os.PathLike,
                map_location="cpu") -> tuple[tuple[Path, dict] | None, list[tuple[Path, str]]]:
    """(the newest checkpoint whose digest matches and that loads, or None; the newer ones passed over, each with
    why, newest first)."""
    bad: list[tuple[Path, str]] = []
    for p in reversed(list_checkpoints(directory)):
        state, why = decode(p, map_location)
        if state is not None:
            return (p, state), bad
        bad.append((p, why))
    return None, bad


def none_good(directory: str | os.PathLike, bad: list[tuple[Path, str]]) -> CheckpointError:
    listed = "; ".join(f"{p.name}: {why}" for p, why in bad)
    return CheckpointError(f"{directory}: no checkpoint is good, so the run cannot resume ({listed})",
                           hint="restore a good copy, or start over with --no-resume (or a new --checkpoint-dir)")


def load_latest(directory: str | os.PathLike, map_location="cpu") -> tuple[Path, dict] | None:
    """The newest good checkpoint; None when there is none; a CheckpointError (exit 2) naming each file and why
    when there are checkpoints but none is good."""
    found, bad = newest_good(directory, map_location)
    if found is None and bad:
        raise none_good(directory, bad)
    return found
