"""The worker side of the progress channel: ``report()`` tells the podrun agent what this worker is doing.

A recipe's runner or any user script calls ``podrun.runtime.report(step=..., total=..., loss=...)``; the
record goes as one JSON line to the pipe the agent named in PODRUN_PROGRESS_FD (never the worker's
stdout), and on to the controller as a ``prog`` protocol line. Outside podrun (plain torchrun, srun,
python) the variable is unset and the call does nothing. A report never blocks training: the pipe is
non-blocking and a report the agent has no room for is dropped. Reports closer than MIN_INTERVAL_S
apart are merged (the newest wins) unless the phase changes or the last step is reached. Each rank's step split
(the ``split`` field: podrun.runtime.steps) travels in the same record.
"""
from __future__ import annotations

import json
import os
import time

from podrun.wire.protocol import PHASES, Progress
from podrun.wire.worker_env import PROGRESS_FD_ENV as FD_ENV

MIN_INTERVAL_S = 0.25

_state = {"fd": None, "checked": False, "last": 0.0, "phase": None}


def _fd() -> int | None:
    if not _state["checked"]:
        _state["checked"] = True
        raw = os.environ.get(FD_ENV, "")
        if raw.isdigit():
            fd = int(raw)
            try:
                os.set_blocking(fd, False)
                _state["fd"] = fd
            except OSError:
                _state["fd"] = None
    return _state["fd"]


def report(step: int | None = None, total: int | None = None, *, epoch: int | None = None,
           loss: float | None = None, samples_per_sec: float | None = None, step_seconds: float | None = None,
           busy_seconds: float | None = None, phase: str = "train", force: bool = False, split=None) -> bool:
    """Tell podrun this worker made progress; returns whether a record was sent (False outside podrun,
    when merged with the next one, or when the agent's pipe is full). ``busy_seconds``: this rank's own work
    in its last step, without the time it waited for the other ranks (podrun names a rank whose busy time
    stays well above the others'). ``split``: a podrun.wire.protocol.StepSplit, the rank's step split into input,
    compute, comm and optim (podrun.runtime.steps), from which podrun names why a slow rank is slow."""
    fd = _fd()
    if fd is None:
        return False
    if phase not in PHASES:
        raise ValueError(f"phase {phase!r}: use one of {', '.join(PHASES)}")
    now = time.monotonic()
    last_step = step is not None and total is not None and step >= total
    if (not force and not last_step and phase == _state["phase"]
            and now - _state["last"] < MIN_INTERVAL_S):
        return False
    if not _write(fd, Progress(phase, step, total, epoch, loss, samples_per_sec, step_seconds, busy_seconds,
                               split).encode()):
        return False
    _state["last"], _state["phase"] = now, phase
    return True


def send(record: dict) -> bool:
    """One record as it is, sent at once (never merged): what the in-place recovery tells the controller
    (podrun.runtime.inplace.tell); False outside podrun or when the agent's pipe is full."""
    fd = _fd()
    return fd is not None and _write(fd, json.dumps(record, separators=(",", ":"), default=float))


def _write(fd: int, line: str) -> bool:
    """``line`` and its newline on the agent's pipe in one write (< PIPE_BUF: never interleaved with another
    thread's); False when the pipe is full, or the agent is gone (then no more tries)."""
    try:
        os.write(fd, (line + "\n").encode())
    except (BlockingIOError, ValueError):
        return False
    except OSError:                     # the agent is gone: stop trying
        _state["fd"] = None
        return False
    return True


def phase(name: str) -> bool:
    """Say that this worker enters ``name`` ("eval", "checkpoint", "train"): sent at once."""
    return report(phase=name, force=True)
