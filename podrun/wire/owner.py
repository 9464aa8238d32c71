"""Who owns a run's control socket: ``control.pid`` names the controller (boot id and pid); a socket whose controller
is dead on this machine, or unrecorded, and on which no one listens is a dead run's and is removed, never trusted.
The controller writes the record (podrun.launch.claim); the controller and a host's zygote read it."""
from __future__ import annotations

import os
import time

from podrun.wire.proctl import pid_alive

SOCKET_NAME = "control.sock"   # in the run dir: the controller's control socket (podrun stack)
# a dead controller's socket can still answer for a moment: its main thread is a zombie (dead to pid_alive) while
# its other threads, under load, are still exiting and the listening socket with them
EXITING_S = 1.0
OWNER_NAME = "control.pid"     # in the run dir: "<boot id> <pid>" of the controller listening on SOCKET_NAME


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return "?"


def owner_alive(run_dir: str) -> bool | None:
    """Whether the controller named in <run_dir>/control.pid lives: None when that is not known here (no
    record, or one of another machine), else True or False."""
    try:
        with open(os.path.join(run_dir, OWNER_NAME), encoding="ascii", errors="replace") as f:
            boot, pid = f.read().split()
        pid_n = int(pid)
    except (OSError, ValueError):
        return None
    if boot != boot_id() or pid_n <= 0:
        return None
    return pid_alive(pid_n)


def remove_if_stale(run_dir: str) -> bool:
    """Remove <run_dir>/control.sock (and control.pid) when it is a dead run's: no one listens on it, and its
    controller is dead on this machine or unrecorded; True when removed. A socket whose controller runs on
    another machine (a shared filesystem) is left alone."""
    from podrun.wire import unixsock

    path = os.path.join(run_dir, SOCKET_NAME)
    if not os.path.lexists(path) or owner_alive(run_dir):
        return False
    deadline = time.monotonic() + EXITING_S
    while not unixsock.stale(path):            # someone listens: a live controller, or a dead one still exiting
        if owner_alive(run_dir) is not False or time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    if owner_alive(run_dir) is None and os.path.lexists(os.path.join(run_dir, OWNER_NAME)):
        return False                              # recorded by a controller on another machine
    removed = unixsock.remove_stale(path)
    if removed:
        try:
            os.unlink(os.path.join(run_dir, OWNER_NAME))
        except OSError:
            pass
    return removed
