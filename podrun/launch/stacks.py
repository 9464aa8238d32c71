"""The workers' stacks: what faulthandler wrote, parsed (``parse_dump``), grouped by identical main-thread stack with
the odd ranks first (``merge``), described (``describe``: "time.sleep <- hang.py:12") and rendered for the console,
the stacks/ files and JSON."""
from __future__ import annotations

import itertools
import os
import re
from dataclasses import asdict, dataclass, field

DUMP_WAIT_S = 5.0              # how long the controller waits for every worker's stacks
SHOWN_FRAMES = 4               # frames of a stack on the console (the files have them all)

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


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
    problem: str | None = None         # why there is no stack (not a Python process, no answer in time)
    processes: tuple[ProcessStack, ...] = ()

    def main_frames(self) -> tuple[Frame, ...]:
        return self.processes[0].main_frames() if self.processes else ()

    def summary(self) -> str | None:
        """Its worker's main stack described, or why it has none."""
        return describe(self.main_frames()) if self.processes else self.problem

    def key(self) -> tuple:
        return tuple((f.file, f.line, f.func) for f in self.main_frames()) if self.processes else \
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
    return any(f"{os.sep}torch{os.sep}distributed{os.sep}" in f.file for f in w.main_frames())


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


def rank_ranges(ranks, limit: int | None = None) -> str:
    """(0, 2, 3, 4, 7) -> "0, 2-4, 7"; with a ``limit``, at most that many ranges, then how many more ranks."""
    # runs of consecutive ranks: each rank less its place in the sorted ranks is the same along a run
    runs = [[r for _, r in run] for _, run in itertools.groupby(enumerate(sorted(ranks)), lambda p: p[1] - p[0])]
    shown = runs[:limit]
    more = len(ranks) - sum(len(run) for run in shown)
    return ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in shown) + \
        (f" and {more} more" if more > 0 else "")


def render_lines(groups: list[Group]) -> list[str]:
    """The merged view, one line per group (then its hosts), odd ranks first."""
    lines = []
    for g in groups:
        w = g.workers[0]
        lines.append(f"{g.label()}: " + (w.summary() if w.processes else f"no stack ({w.problem})"))
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
    """Each group as JSON: its ranks, its summary, and every worker whole (dataclasses.asdict: its fields in order)."""
    return [{"ranks": list(g.ranks), "summary": g.workers[0].summary() if g.workers[0].processes else None,
             "workers": [asdict(w) for w in g.workers]} for g in groups]


@dataclass
class StackCollection:
    """One collection of every running worker's stacks in flight: on a hang, or asked over the control socket."""

    reason: str                                    # "hang" | "probe" (a plain script's first sample) | "request"
    window: float | None                           # the hang window that ran out (None for a request)
    want: list[tuple[int, int]]                    # (instance, local rank) of each worker running when it began
    deadline: float                                # monotonic time after which it ends with what it has
    silent_s: float                                # seconds without progress when it began
    got: dict = field(default_factory=dict)        # (instance, local rank) -> its agent's protocol.Stacks
    asks: list = field(default_factory=list)       # (event, holder) of each control-socket request it answers
    progress_at: float = 0.0                       # the supervisor's last progress when it began

    def complete(self, now: float) -> bool:
        return set(self.want) <= set(self.got) or now >= self.deadline
