"""Watching a live run: hang options, slow ranks, the workers' stacks (parsed, grouped, rendered) and the run's control socket.

Pure parts: ``parse_dump`` reads what faulthandler wrote, ``merge`` groups identical main-thread stacks
by rank (the odd ranks out first), ``describe`` turns a group into "time.sleep <- hang.py:12". The
control socket (``serve`` / ``ask``) is how ``podrun stack`` reaches a running controller: a unix
socket ``control.sock`` in the run directory, mode 0600, one JSON request and one JSON reply per
connection, bound private and reached as podrun.launch.unixsock says (long paths, 0600 from the start, lstat
checks). Beside it ``control.pid`` (0600) names the controller (this machine's boot id and its pid): a socket
that refuses connections and whose controller is dead on this machine, or that has no such record, is a
dead run's and is removed (``remove_if_stale``), never trusted.
"""
from __future__ import annotations

import json
import os
import re
import socket
import threading
from dataclasses import dataclass, field

SOCKET_NAME = "control.sock"
OWNER_NAME = "control.pid"     # "<boot id> <pid>" of the controller listening on SOCKET_NAME
STACKS_DIR = "stacks"
REQUEST_FILE = "stacks-request"   # in the run dir: agents with no stdin (mpirun, srun) watch it for a new token
HANG_EXIT = 125                # the run was ended because no rank made progress for --hang-timeout seconds
AUTO_FLOOR_S = 120.0           # --hang-timeout auto: never less than this
AUTO_STEPS = 20                # ... and this many times the median of the last AUTO_WINDOW step times
AUTO_WINDOW = 20
AUTO_NO_STEPS_S = 600.0        # --hang-timeout auto before any step was reported (plain scripts, start-up)
STARTUP_S = 60.0               # until the first progress of an attempt the window is at least this (imports)
DUMP_WAIT_S = 5.0              # how long the controller waits for every worker's stacks
SHOWN_FRAMES = 4               # frames of a stack on the console (the files have them all)

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


@dataclass(frozen=True)
class WatchOptions:
    """How the controller watches a run: --hang-timeout (None: off, "auto", or seconds) and --on-hang."""

    hang_timeout: float | str | None = "auto"
    on_hang: str = "end"              # "end": dump the stacks, then end the run; "dump": dump and go on
    progress: bool = True             # forward the workers' progress reports to the console
    source: str = "--hang-timeout"    # where hang_timeout came from (the option, a recipe's or cluster's field)

    def window(self, step_times: list[float], started: bool = True) -> float | None:
        """The hang window in seconds now, given the recent step times (seconds) reported by the runtime;
        before the first progress (``started`` False: imports, rendezvous) at least STARTUP_S."""
        if self.hang_timeout is None:
            return None
        if self.hang_timeout != "auto":
            return float(self.hang_timeout) if started else max(float(self.hang_timeout), STARTUP_S)
        if not step_times:
            return AUTO_NO_STEPS_S
        recent = sorted(step_times[-AUTO_WINDOW:])
        return max(AUTO_FLOOR_S, AUTO_STEPS * recent[len(recent) // 2])


SLOW_FACTOR = 1.5              # a rank is slow when its busy time stays at least this times the others' median
SLOW_CLEAR = 1.25              # ... and no longer slow once back under this (no flapping at the edge)
SLOW_WINDOW = 10               # busy times kept per rank; the rule compares medians over them
SLOW_MIN_GAP_S = 0.005         # and at least this many seconds apart (timer noise on tiny steps)


class SlowRanks:
    """The slow-rank watch (pure): each rank's last SLOW_WINDOW busy times (its own work per step, without the
    wait for the others: podrun.train.busy); a rank whose median stays at least SLOW_FACTOR x the median of
    the other ranks' medians (and SLOW_MIN_GAP_S above it) is named once, and can be named again only after
    its median fell back under SLOW_CLEAR x. A median over SLOW_WINDOW reports ignores a few slow steps
    (a checkpoint, a page fault, a noisy neighbour): the rank must be slow in most of its last reports."""

    def __init__(self, window: int = SLOW_WINDOW):
        self.window = window
        self.busy: dict[int, list[float]] = {}
        self.hosts: dict[int, str] = {}
        self.slow: dict[int, dict] = {}        # rank -> its record while it is slow
        self.records: list[dict] = []          # every rank named, in order (summary.json's slow_ranks)

    @staticmethod
    def _median(xs: list[float]) -> float:
        ys = sorted(xs)
        n = len(ys)
        return ys[n // 2] if n % 2 else (ys[n // 2 - 1] + ys[n // 2]) / 2

    def add(self, rank: int, host: str, busy_s: float, step: int | None = None) -> dict | None:
        """One busy time of ``rank``; the rank's new record when this makes it slow, else None."""
        xs = self.busy.setdefault(rank, [])
        xs.append(float(busy_s))
        del xs[:-self.window]
        self.hosts[rank] = host
        if len(xs) < self.window:
            return None
        others = [self._median(v) for r, v in self.busy.items() if r != rank and len(v) >= self.window]
        if not others:
            return None
        mine, rest = self._median(xs), self._median(others)
        if rank in self.slow:
            rec = self.slow[rank]
            if mine < SLOW_CLEAR * rest:
                rec["until_step"] = step
                del self.slow[rank]
            elif rest > 0 and (rec["max_ratio"] is None or mine / rest > rec["max_ratio"]):
                rec["max_ratio"] = round(mine / rest, 3)
            return None
        if mine >= SLOW_FACTOR * rest and mine - rest >= SLOW_MIN_GAP_S:
            rec = {"rank": rank, "host": host, "busy_s": round(mine, 6), "others_median_s": round(rest, 6),
                   "ratio": round(mine / rest, 3) if rest > 0 else None, "steps": self.window, "from_step": step,
                   "until_step": None}
            rec["max_ratio"] = rec["ratio"]
            self.slow[rank] = rec
            self.records.append(rec)
            return rec
        return None


def slow_rank_line(rec: dict) -> str:
    """The console line for a rank named slow (numbers rounded)."""
    ratio = f" ({rec['ratio']:.1f}x)" if rec.get("ratio") is not None else ""
    return (f"rank {rec['rank']} on {rec['host']} is slow: busy {rec['busy_s']:.3g} s per step against a median of "
            f"{rec['others_median_s']:.3g} s on the other ranks{ratio}, over its last {rec['steps']} reports "
            f"(a straggler holds every rank back; a hang often starts as one)")


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    def where(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"


@dataclass(frozen=True)
class Thread:
    ident: str
    main: bool
    frames: tuple[Frame, ...]          # innermost first, as faulthandler writes them


@dataclass(frozen=True)
class ProcessStack:
    pid: int
    threads: tuple[Thread, ...]        # the main thread first

    def main_frames(self) -> tuple[Frame, ...]:
        return self.threads[0].frames if self.threads else ()


@dataclass(frozen=True)
class WorkerStack:
    """One worker's stacks: its rank, where it runs, and each of its Python processes (the worker first)."""

    rank: int
    instance: int
    local_rank: int
    host: str
    processes: tuple[ProcessStack, ...] = ()
    problem: str | None = None         # why there is no stack (not a Python process, no answer in time)

    def key(self) -> tuple:
        return tuple((f.file, f.line, f.func) for f in self.processes[0].main_frames()) if self.processes else \
            ("?", self.problem or "no stack")


@dataclass(frozen=True)
class Group:
    ranks: tuple[int, ...]
    workers: tuple[WorkerStack, ...] = field(repr=False)

    def label(self) -> str:
        return ("rank " if len(self.ranks) == 1 else "ranks ") + rank_ranges(self.ranks)


def parse_dump(text: str, main_ident: str | None) -> tuple[Thread, ...]:
    """faulthandler's all-threads dump -> threads, the main one (``main_ident``, else the current one) first.
    Only the last dump in ``text`` counts."""
    threads: list[Thread] = []
    cur: tuple[str, bool] | None = None
    frames: list[Frame] = []

    def close():
        if cur is not None:
            threads.append(Thread(cur[0], cur[1], tuple(frames)))

    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            close()
            ident = m.group(2).lower()
            if threads and any(t.ident == ident for t in threads):   # a second dump begins: keep the newest
                threads.clear()
            cur, frames = (ident, m.group(1) == "Current thread"), []
            continue
        f = _FRAME.match(line)
        if f and cur is not None:
            frames.append(Frame(f.group(1), int(f.group(2)), f.group(3)))
    close()
    want = (main_ident or "").lower()
    main = [t for t in threads if t.ident == want] or [t for t in threads if t.main]
    rest = [t for t in threads if not main or t is not main[0]]
    return tuple(Thread(t.ident, bool(main) and t is main[0], t.frames) for t in main[:1] + rest)


def in_collective(w: WorkerStack) -> bool:
    """Whether the worker's main thread waits inside torch.distributed (a collective, a barrier, the store)."""
    return bool(w.processes) and any(f"{os.sep}torch{os.sep}distributed{os.sep}" in f.file
                                     for f in w.processes[0].main_frames())


def merge(workers: list[WorkerStack]) -> list[Group]:
    """Workers grouped by identical main-thread stacks, the odd ranks out first: groups not waiting in
    torch.distributed before those that are (the others wait on the odd one), then the smallest."""
    by: dict[tuple, list[WorkerStack]] = {}
    for w in sorted(workers, key=lambda w: w.rank):
        by.setdefault(w.key(), []).append(w)
    groups = [Group(tuple(w.rank for w in ws), tuple(ws)) for ws in by.values()]
    return sorted(groups, key=lambda g: (in_collective(g.workers[0]), len(g.ranks), g.ranks[0]))


def library(f: Frame) -> bool:
    """A frame of Python's own library or an installed package (not the user's code)."""
    return f.file.startswith("<") or "site-packages" in f.file or "dist-packages" in f.file or \
        f"{os.sep}lib{os.sep}python" in f.file


def describe(frames: tuple[Frame, ...], limit: int = SHOWN_FRAMES) -> str:
    """"all_reduce (distributed_c10d.py:3252) <- ... <- train.py:88": the innermost function and where it
    stands, then the callers in the user's code (library frames between them shown as "...")."""
    if not frames:
        return "(no Python frame)"
    parts = [f"{frames[0].func} ({frames[0].where()})"]
    skipped = False
    for f in frames[1:]:
        if library(f):
            skipped = True
            continue
        if len(parts) >= limit:
            parts.append("...")
            break
        if skipped:
            parts.append("...")
            skipped = False
        parts.append(f.where())
    return " <- ".join(parts)


def rank_ranges(ranks) -> str:
    """(0, 2, 3, 4, 7) -> "0, 2-4, 7"."""
    out: list[str] = []
    rs = sorted(ranks)
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ", ".join(out)


def render_lines(groups: list[Group]) -> list[str]:
    """The merged view, one line per group (then its hosts), odd ranks first."""
    lines = []
    for g in groups:
        w = g.workers[0]
        if w.processes:
            lines.append(f"{g.label()}: {describe(w.processes[0].main_frames())}")
        else:
            lines.append(f"{g.label()}: no stack ({w.problem})")
        hosts = sorted({x.host for x in g.workers})
        where = ", ".join(hosts) if len(hosts) <= 4 else f"{', '.join(hosts[:4])} and {len(hosts) - 4} more"
        lines.append(f"    on {where}" + (f" (pid {w.processes[0].pid})" if len(g.workers) == 1 and w.processes
                                             else ""))
    return lines


def stack_file_text(w: WorkerStack) -> str:
    """What stacks/rank-<N>.txt holds: every process and thread of the worker, every frame."""
    out = [f"rank {w.rank} (instance {w.instance}, local rank {w.local_rank}) on {w.host}"]
    if w.problem:
        out.append(f"no stack: {w.problem}")
    for p in w.processes:
        out.append(f"\nprocess {p.pid}:")
        for t in p.threads:
            out.append(f"  thread {t.ident}{' (main)' if t.main else ''}, most recent call first:")
            out.extend(f'    File "{f.file}", line {f.line} in {f.func}' for f in t.frames)
    return "\n".join(out) + "\n"


def to_json(groups: list[Group]) -> list[dict]:
    return [{"ranks": list(g.ranks), "summary": describe(g.workers[0].processes[0].main_frames())
             if g.workers[0].processes else None,
             "workers": [{"rank": w.rank, "instance": w.instance, "local_rank": w.local_rank, "host": w.host,
                          "problem": w.problem,
                          "processes": [{"pid": p.pid, "threads": [
                              {"ident": t.ident, "main": t.main,
                               "frames": [{"file": f.file, "line": f.line, "func": f.func} for f in t.frames]}
                              for t in p.threads]} for p in w.processes]} for w in g.workers]}
            for g in groups]


# -- the control socket ----------------------------------------------------------------------

def write_request(run_dir: str) -> None:
    """Ask the agents that have no stdin (mpirun, srun: they share the run dir) for stacks: a new token in
    <run_dir>/stacks-request, written whole (rename)."""
    import time

    from podrun.launch.rundir import new_private_open

    path = os.path.join(run_dir, REQUEST_FILE)
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8", opener=new_private_open) as f:
        f.write(f"{time.time_ns()}\n")
    os.replace(tmp, path)


def read_request(run_dir: str) -> str:
    """The current token of <run_dir>/stacks-request ("" when there is none)."""
    try:
        with open(os.path.join(run_dir, REQUEST_FILE), encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return ""


def _boot_id() -> str:
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
    if boot != _boot_id() or pid_n <= 0:
        return None
    try:
        os.kill(pid_n, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:                              # killed but not yet collected by its parent: dead all the same
        with open(f"/proc/{pid_n}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def remove_if_stale(run_dir: str) -> bool:
    """Remove <run_dir>/control.sock (and control.pid) when it is a dead run's: no one listens on it, and its
    controller is dead on this machine or unrecorded; True when removed. A socket whose controller runs on
    another machine (a shared filesystem) is left alone."""
    from podrun.launch import unixsock

    path = os.path.join(run_dir, SOCKET_NAME)
    if not os.path.lexists(path) or owner_alive(run_dir) or not unixsock.stale(path):
        return False
    if owner_alive(run_dir) is None and os.path.lexists(os.path.join(run_dir, OWNER_NAME)):
        return False                              # recorded by a controller on another machine
    removed = unixsock.remove_stale(path)
    if removed:
        try:
            os.unlink(os.path.join(run_dir, OWNER_NAME))
        except OSError:
            pass
    return removed


def claim(run_dir: str) -> None:
    """Record this process as the run's controller in <run_dir>/control.pid (new, 0600), for the run's life."""
    from podrun.launch.rundir import new_private_open

    with open(os.path.join(run_dir, OWNER_NAME), "w", encoding="ascii", opener=new_private_open) as f:
        f.write(f"{_boot_id()} {os.getpid()}\n")


def release(run_dir: str) -> None:
    try:
        os.unlink(os.path.join(run_dir, OWNER_NAME))
    except OSError:
        pass


def serve(run_dir: str, handle) -> socket.socket:
    """Listen on <run_dir>/control.sock (0600); each connection's JSON request goes to ``handle(request)``,
    whose dict is the reply. Returns the listening socket; close it with ``stop``."""
    from podrun.launch import unixsock

    s = unixsock.bind(os.path.join(run_dir, SOCKET_NAME), 8)

    def one(conn):
        with conn:
            try:
                conn.settimeout(DUMP_WAIT_S * 4)
                data = b""
                while not data.endswith(b"\n") and len(data) < 4096:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                reply = handle(json.loads(data or b"{}"))
            except (OSError, ValueError) as exc:
                reply = {"error": f"bad request: {exc}"}
            try:
                conn.sendall(json.dumps(reply, default=str).encode() + b"\n")
            except OSError:
                pass

    def accept():
        while True:
            try:
                conn, _ = s.accept()
            except OSError:
                return
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return s


def stop(run_dir: str, server: socket.socket | None) -> None:
    if server is None:
        return
    try:
        os.unlink(os.path.join(run_dir, SOCKET_NAME))
    except OSError:
        pass
    server.close()


MAX_REPLY = 64 * 1024 * 1024     # bytes of a control-socket reply read at most


def ask(run_dir: str, request: dict, timeout: float = DUMP_WAIT_S * 4):
    """Send ``request`` to the controller of the run in ``run_dir``; its reply (parsed JSON, any shape: the
    caller checks it). OSError when none listens, ValueError for a reply that is not JSON."""
    from podrun.launch import unixsock

    with unixsock.connect(os.path.join(run_dir, SOCKET_NAME), timeout) as s:
        s.sendall(json.dumps(request).encode() + b"\n")
        data = b""
        while len(data) <= MAX_REPLY:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    if len(data) > MAX_REPLY:
        raise ValueError(f"a reply longer than {MAX_REPLY} bytes")
    return json.loads(data)
