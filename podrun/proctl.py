"""Linux process controls both sides share: parent-death signal, child subreaper, whether a pid lives, /proc's stat lines, an exit that tears nothing down."""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import sys
import threading
from typing import Iterator

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def prctl(option: int, arg: int) -> bool:
    """prctl(2); False where it is not available (not Linux): process-group teardown still applies."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0) == 0
    except Exception:  # noqa: BLE001 - not Linux
        return False


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None):
    """A ``preexec_fn`` (call it in the parent: it notes the parent's pid now): in the child, get ``sig`` when
    the parent dies, and get it at once when the parent died before prctl took effect (the child was then
    already reparented, and no death would ever be signalled)."""
    parent = os.getpid() if parent is None else parent

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig))
        if os.getppid() != parent:
            os.kill(os.getpid(), int(sig))
    return preexec


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to process group ``pgid``; one that is gone (or not ours) is no error."""
    with contextlib.suppress(OSError):
        os.killpg(pgid, sig)


def signal_led_group(proc, sig: int) -> None:
    """Send ``sig`` to the process group that ``proc`` (a Popen started in a session of its own) leads. Once
    ``proc`` is reaped its group lives on only while a member does, and a member keeps the group's number from
    being given to a new process; so a process that holds that number then is a later one, leading a group of its
    own, and is left alone."""
    if proc.returncode is not None and os.path.exists(f"/proc/{proc.pid}"):
        return
    signal_group(proc.pid, sig)


def stat_fields(pid: int | str) -> list[bytes] | None:
    """The fields of /proc/<pid>/stat after the command name (state, ppid, ...); None when there is no such
    process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def proc_stats() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, the fields of /proc/<pid>/stat after the command name: state, ppid, ...) of every process, those
    gone meanwhile left out."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for d in filter(str.isdigit, names):
        fields = stat_fields(d)
        if fields is not None:
            yield int(d), fields


def proc_start(pid: int) -> str | None:
    """When process ``pid`` started (field 22 of /proc/<pid>/stat, clock ticks since boot, as text): with the pid,
    it names one process, where a pid alone may be a later process's; None when there is no such process."""
    fields = stat_fields(pid)
    return fields[19].decode() if fields is not None and len(fields) > 19 else None


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine runs: one that ended but is not yet reaped (a zombie) does not;
    one of another user that exists does."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = stat_fields(pid)
    return fields is None or not fields or fields[0] != b"Z"


def exit_now(code: int, *, join_threads: bool = False) -> None:
    """End this process as the interpreter would, but by os._exit, tearing down nothing it holds (a forked worker's
    copy of its zygote's state, a gloo group on a dead peer): with ``join_threads`` its threads joined first, then
    atexit run and output flushed."""
    try:
        if join_threads:
            threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    finally:
        for f in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                f.flush()
        os._exit(code)
