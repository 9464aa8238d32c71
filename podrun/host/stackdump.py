"""An agent's collection of its workers' faulthandler dumps: every registered process signalled first, then every dump read together."""
from __future__ import annotations

import os
import signal
import time

from podrun.proctl import proc_start

STACK_SIGNAL = int(signal.SIGRTMIN) + 4   # faulthandler's dump signal in workers (podrun/runtime/site)
SITE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runtime", "site")
STACK_WAIT_S = 2.0         # how long the workers may take to write their stacks (all of them, together)
STACK_TEXT = 48 * 1024     # characters of one process's dump relayed (a stack line stays under READ_LIMIT)
STACK_PROCS = 4            # Python processes of one worker whose stacks are relayed (the worker's own first)
POLL_S = 0.03              # how often the dump files are looked at
STILL_POLLS = 3            # a dump is whole once its file kept its size (above 0) this many looks in a row

NOT_REGISTERED = ("no Python process of this worker registered for stacks (not Python, "
                  "or started with -I/-S so podrun's sitecustomize did not run)")
EXITING = "its program has returned: the process is exiting"


def _exiting(where: str, worker_pid: int) -> bool:
    """The worker's own process has run its program to the end and is exiting: it turned its registration into
    <pid>.exit (podrun/runtime/site), and the process with that pid started when the one that wrote it did."""
    return _started(where, worker_pid, ".exit") == proc_start(worker_pid) is not None


def _registered(where: str, worker_pid: int) -> list[int]:
    """The live processes of one worker that registered for stacks under ``where``, the worker's own first: a pid
    counts only while the process that has it started when the one that registered did (a registered process
    that ended leaves its file behind, and its pid may be another process's by now, one without the handler)."""
    try:
        pids = [int(n[:-5]) for n in os.listdir(where) if n.endswith(".main") and n[:-5].isdigit()]
    except OSError:
        pids = []
    pids = [p for p in pids if (began := _started(where, p)) is not None and began == proc_start(p)]
    pids.sort(key=lambda p: (p != worker_pid, p))
    return pids[:STACK_PROCS]


def _started(where: str, pid: int, ext: str = ".main") -> str | None:
    """The start time process ``pid`` wrote when it registered (the second line of its .main file, or of the
    .exit file it became)."""
    lines = _read(os.path.join(where, f"{pid}{ext}")).split()
    return lines[1] if len(lines) > 1 else None


def _read(path: str) -> str:
    """The text of file ``path`` ("" when it cannot be read)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def collect(root: str, workers: list[tuple[int, int]], wait: float = STACK_WAIT_S) -> dict[int, dict]:
    """Each worker ``(pos, pid)``'s stacks -> {pos: {"procs": [{"pid", "main", "text"}], "problem": why there
    is none, "exiting": its program has returned}}. Every registered process of every worker is signalled before
    any dump is read, and the dumps are read together within ``wait`` seconds in all: the time taken does not grow
    with the number of workers."""
    out: dict[int, dict] = {}
    sent: dict[int, list[tuple[int, str, str]]] = {}
    for pos, worker_pid in workers:
        where = os.path.join(root, f"w{pos}")
        exiting = _exiting(where, worker_pid)
        pids = [] if exiting else _registered(where, worker_pid)
        if not pids:
            out[pos] = {"procs": [], "problem": EXITING if exiting else NOT_REGISTERED, "exiting": exiting}
            continue
        sent[pos] = []
        for pid in pids:
            txt = os.path.join(where, f"{pid}.txt")
            try:
                os.truncate(txt, 0)
                os.kill(pid, STACK_SIGNAL)
            except OSError:
                continue
            sent[pos].append((pid, txt, os.path.join(where, f"{pid}.main")))
    texts = _settled([txt for files in sent.values() for _, txt, _ in files], wait)
    for pos, files in sent.items():
        procs = [{"pid": pid, "main": _read(main_file).split("\n", 1)[0].strip(),
                  "text": texts.get(txt, "")[-STACK_TEXT:]} for pid, txt, main_file in files]
        out[pos] = {"procs": procs, "problem": None if any(p["text"] for p in procs) else
                    f"no stack written within {wait:g} s", "exiting": False}
    return out


def _settled(paths: list[str], timeout: float) -> dict[str, str]:
    """The text of each file once something was written to it and it stopped growing (or at ``timeout``)."""
    deadline = time.monotonic() + timeout
    last, still = dict.fromkeys(paths, -1), dict.fromkeys(paths, 0)   # per file: its last size, looks it kept it
    pending = set(paths)
    while pending and time.monotonic() < deadline:
        for p in list(pending):
            try:
                size = os.path.getsize(p)
            except OSError:
                size = 0
            if size > 0 and size == last[p]:
                still[p] += 1
                if still[p] >= STILL_POLLS:
                    pending.discard(p)
            else:
                still[p] = 0
            last[p] = size
        if pending:
            time.sleep(POLL_S)
    return {p: _read(p) for p in paths}


def kernel_waits(pid: int) -> str:
    """What each thread of ``pid`` waits on in the kernel (``/proc/<pid>/task/*``: its name, state and wchan), one
    line each: a process past its Python stack dump (its exit's finalization) still shows where it is stuck."""
    lines = []
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError:
        return ""
    for tid in tids:
        comm = _read(f"/proc/{pid}/task/{tid}/comm").strip()
        state = _read(f"/proc/{pid}/task/{tid}/stat").rsplit(")", 1)[-1].split()[:1]
        wchan = _read(f"/proc/{pid}/task/{tid}/wchan").strip() or "-"
        lines.append(f"thread {tid} ({comm}): state {''.join(state) or '?'}, waiting in {wchan}")
    return "\n".join(lines)
