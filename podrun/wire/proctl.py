"""Linux process controls the agent, the store host and the local transport share: parent-death signal, child subreaper."""
from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def prctl(option: int, arg: int) -> bool:
    """prctl(2); False where it is not available (not Linux): process-group teardown still applies."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0) == 0
    except Exception:  # noqa: BLE001 - not Linux
        return False


def pdeathsig(sig: int = signal.SIGKILL) -> None:
    """In the child before exec: get ``sig`` when the parent dies (workers: SIGKILL when the agent dies)."""
    prctl(PR_SET_PDEATHSIG, int(sig))


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None):
    """A ``preexec_fn`` (call it in the parent: it notes the parent's pid now): in the child, get ``sig`` when
    the parent dies, and get it at once when the parent died before prctl took effect (the child was then
    already reparented, and no death would ever be signalled)."""
    import os

    parent = os.getpid() if parent is None else parent

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig))
        if os.getppid() != parent:
            os.kill(os.getpid(), int(sig))
    return preexec
