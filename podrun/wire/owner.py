"""Who owns a run's control socket: ``control.pid`` names the controller (boot id, pid and the process's start time);
a record whose process is gone, or is another process under a reused pid, is a dead controller's. A socket whose
controller is dead on this machine, or unrecorded, and on which no one listens is a dead run's and is removed, never
trusted. The controller writes the record (podrun.launch.control.claim) after clear_dead; the controller and a host's
zygote read it, through podrun.safefs.read_trusted."""
from __future__ import annotations

import contextlib
import os
import time

from podrun.errors import PodrunError
from podrun.rundir.layout import CONTROL_PID, CONTROL_SOCKET
from podrun.safefs import read_trusted
from podrun.wire import unixsock
from podrun.proctl import pid_alive, proc_start

# a dead controller's socket can still answer for a moment: its main thread is a zombie (dead to pid_alive) while
# its other threads, under load, are still exiting and the listening socket with them
EXITING_S = 1.0
RECORD_LIMIT = 4096            # bytes of control.pid read at most


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return "?"


def _start(pid: int) -> str:
    """The start time of process ``pid`` (proctl.proc_start), "?" when unknown."""
    return proc_start(pid) or "?"


def record_text() -> str:
    """What this process writes into control.pid as the run's controller."""
    return f"{boot_id()} {os.getpid()} {_start(os.getpid())}\n"


def _recorded(run_dir: str) -> tuple[int, bool] | None:
    """(the pid recorded in <run_dir>/control.pid, whether that process lives and is the recorder), or None when
    that is not known here: no record, one that fails read_trusted or does not parse, or one of another boot
    (another machine, or this one before a reboot)."""
    try:
        parts = read_trusted(os.path.join(run_dir, CONTROL_PID), "controller record", limit=RECORD_LIMIT).split()
        boot, pid = parts[0].decode("ascii"), int(parts[1])
    except (OSError, PodrunError, ValueError, IndexError):
        return None
    if boot != boot_id() or pid <= 0:
        return None
    start = parts[2].decode("ascii", "replace") if len(parts) > 2 else "?"
    return pid, pid_alive(pid) and start in ("?", _start(pid))     # a later process under a reused pid is not it


def owner_alive(run_dir: str) -> bool | None:
    """Whether the controller named in <run_dir>/control.pid lives: None when that is not known here (no
    record, or one of another machine), else True or False."""
    found = _recorded(run_dir)
    return None if found is None else found[1]


def clear_dead(run_dir: str) -> None:
    """Before a controller claims the run (holding its launch lock, which a live controller holds for its life):
    a control.pid left there is removed unless it names a live controller of this machine, which is refused
    (PodrunError, exit 2) naming its pid."""
    found = _recorded(run_dir)
    if found is not None and found[1]:
        raise PodrunError(f"run directory {run_dir} is held by its controller, pid {found[0]} (alive, named in "
                          f"{CONTROL_PID}); nothing was started",
                          hint="wait for that run to end (or end it: `kill PID`), then resume")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(run_dir, CONTROL_PID))


def listening(run_dir) -> bool:
    """Whether a live controller may listen on <run_dir>/control.sock (a dead run's socket is removed here)."""
    try:
        return os.path.lexists(os.path.join(run_dir, CONTROL_SOCKET)) and not remove_if_stale(str(run_dir))
    except OSError:
        return False


def remove_if_stale(run_dir: str) -> bool:
    """Remove <run_dir>/control.sock (and control.pid) when it is a dead run's: no one listens on it, and its
    controller is dead on this machine or unrecorded; True when removed. A socket whose controller runs on
    another machine (a shared filesystem) is left alone."""
    path = os.path.join(run_dir, CONTROL_SOCKET)
    if not os.path.lexists(path) or owner_alive(run_dir):
        return False
    deadline = time.monotonic() + EXITING_S
    while not unixsock.stale(path):            # someone listens: a live controller, or a dead one still exiting
        if owner_alive(run_dir) is not False or time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    if owner_alive(run_dir) is None and os.path.lexists(os.path.join(run_dir, CONTROL_PID)):
        return False                              # recorded by a controller on another machine
    removed = unixsock.remove_stale(path)
    if removed:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(run_dir, CONTROL_PID))
    return removed
