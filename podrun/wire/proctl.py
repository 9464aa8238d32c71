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
