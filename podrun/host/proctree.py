"""The agent's process tree, read from /proc: its children, a worker tree's CPU time, ending every descendant."""
from __future__ import annotations

import contextlib
import os
import signal
import time

from podrun.proctl import proc_stats, stat_fields


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, state) of the live processes whose parent is ``pid``, from /proc: from the kernel's list of each of
    its threads' children (/proc/PID/task/TID/children: a few reads, however many processes the host runs), or,
    without that list, from every process's stat (a read per process on the host). The kernel's list may miss a
    child while a sibling ends during the read (proc(5): reliable only for stopped children); a caller that must
    see every child takes an empty answer only when a second read agrees."""
    listed = _listed_children(pid)
    return _scanned_children(pid) if listed is None else listed


def _scanned_children(pid: int) -> list[tuple[int, str]]:
    """(pid, state) of ``pid``'s children from every process's stat."""
    return [(p, fields[0].decode()) for p, fields in proc_stats() if len(fields) > 1 and int(fields[1]) == pid]


def _listed_children(pid: int) -> list[tuple[int, str]] | None:
    """The children of every thread of ``pid`` from /proc/PID/task/TID/children, each with its state, checked
    against its stat's parent; None when this kernel has no such list (CONFIG_PROC_CHILDREN off)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    found: set[int] = set()
    readable = False
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found.update(int(x) for x in f.read().split())
            readable = True
        except (OSError, ValueError):
            continue                          # a thread that ended meanwhile, or no such file on this kernel
    if not readable:
        return None
    out = []
    for child in sorted(found):
        fields = stat_fields(child)           # None: gone meanwhile
        if fields is not None and len(fields) > 1 and int(fields[1]) == pid:
            out.append((child, fields[0].decode()))
    return out


def _forest() -> tuple[dict[int, list[int]], dict[int, float]]:
    """Every process's children, and its CPU seconds (user + system, every thread, and the reaped children's),
    from /proc in one pass."""
    tick = os.sysconf("SC_CLK_TCK")
    kids: dict[int, list[int]] = {}
    used = {}
    for pid, fields in proc_stats():
        if len(fields) > 14:      # after the name: state ppid ... utime(12) stime(13) cutime(14) cstime(15)
            kids.setdefault(int(fields[1]), []).append(pid)
            used[pid] = sum(int(x) for x in fields[11:15]) / tick
    return kids, used


def _tree(root: int, kids: dict[int, list[int]]) -> list[int]:
    """``root`` and its live descendants."""
    out, todo, seen = [], [root], {root}
    while todo:
        pid = todo.pop()
        out.append(pid)
        for k in kids.get(pid, ()):
            if k not in seen:
                seen.add(k)
                todo.append(k)
    return out


def tree_cpu(roots: list[int]) -> dict[int, float]:
    """CPU seconds (user + system, every thread, and the reaped children's) of each root's process tree:
    the process and all its live descendants, read from /proc in one pass."""
    kids, used = _forest()
    return {root: round(sum(used.get(pid, 0.0) for pid in _tree(root, kids)), 3) for root in roots if root in used}


# the system calls of a main thread blocked reading its fd 0, by machine: read(2)-like ones on fd 0, and
# select(2)-like ones over fd 0 alone (nfds 1: readline's wait for a key at a terminal, pdb's prompt there)
_STDIN_CALLS = {"x86_64": ({0, 17, 19}, {23, 270}), "aarch64": ({63, 65, 67}, {72})}


def reading_stdin(roots: list[int], stdin: tuple[int, int]) -> set[int]:
    """The roots one of whose tree's processes has its main thread blocked reading its fd 0 where that is
    ``stdin`` ((st_dev, st_ino): the launcher's stdin, a terminal or pipe), seen in /proc/PID/syscall: a rank
    waiting for its user (input(), pdb's prompt). Empty on a machine whose system calls are not listed here, and
    for a process whose syscall file cannot be read (another user's, or under ptrace restrictions)."""
    calls = _STDIN_CALLS.get(os.uname().machine)
    if calls is None:
        return set()
    kids, _ = _forest()
    return {root for root in roots if any(_reads_stdin(pid, stdin, calls) for pid in _tree(root, kids))}


def _reads_stdin(pid: int, stdin: tuple[int, int], calls: tuple[set[int], set[int]]) -> bool:
    try:
        with open(f"/proc/{pid}/syscall", "rb") as f:
            words = f.read().split()
        nr, fd = int(words[0]), int(words[1], 16)
        st = os.stat(f"/proc/{pid}/fd/0")
    except (OSError, ValueError, IndexError):       # gone, unreadable, or "running" (no call)
        return False
    return (fd == 0 and nr in calls[0] or fd == 1 and nr in calls[1]) and (st.st_dev, st.st_ino) == stdin


def _reap(pid: int) -> bool:
    """Collect ``pid`` if it has ended; True when it is gone."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return True


def _describe(pid: int) -> str:
    """``pid N (command line)`` of a live process, its command line cut at 300 characters."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        cmd = ""
    return f"pid {pid} ({cmd[:300] or '?'})"


def end_descendants(timeout: float = 5.0, spare: frozenset[int] = frozenset()) -> list[str]:
    """Kill every child of this process (and, as a subreaper, every orphan that reparents to it) but the
    ``spare`` ones (the agent's own helpers, ended by their owners) until none is left or ``timeout``
    passes; returns each killed process as ``pid N (command line)``."""
    me, killed = os.getpid(), {}
    deadline = time.monotonic() + timeout
    empty = 0                                  # reads in a row that found no child: two end it (_children)
    while time.monotonic() < deadline:
        kids = [(pid, state) for pid, state in _children(me) if pid not in spare]
        empty = 0 if kids else empty + 1
        if empty >= 2:
            break
        for pid, state in kids:
            if state != "Z":
                if pid not in killed:
                    killed[pid] = _describe(pid)
                for kill in (os.killpg, os.kill):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        kill(pid, signal.SIGKILL)
            _reap(pid)
        time.sleep(0.01)
    return list(killed.values())


def reap_orphans(workers: set[int]) -> None:
    """Collect ended orphans that reparented to this subreaper (never one of ``workers``: Popen owns those)."""
    for pid, state in _children(os.getpid()):
        if state == "Z" and pid not in workers:
            _reap(pid)
