"""Slow ranks: a rank whose reported busy time stays well above the others' is named once (the straggler a hang
often starts as) with its cause from its step split (input, compute, comm, optim: StepSplits, cause_of); a run
where every rank waits for input is named once (input_bound); and each host's own work per step over the run
(HostBusy), where a slow host shows."""
from __future__ import annotations

from statistics import median

from podrun.rundir.layout import SPLIT_PARTS
from podrun.wire.protocol import StepSplit

SLOW_FACTOR = 1.5              # a rank is slow when its busy time stays at least this times the others' median
SLOW_CLEAR = 1.25              # ... and no longer slow once back under this (no flapping at the edge)
SLOW_WINDOW = 10               # steps of busy times kept per rank; the rule compares medians over them
SLOW_MIN_REPORTS = 3           # and at least this many reports (a report may cover several short steps)
SLOW_MIN_GAP_S = 0.005         # and at least this many seconds apart (timer noise on tiny steps)
INPUT_BOUND_SHARE = 0.30      # a run is input-bound when every rank waits for input this share of its step or more
HOST_POINTS = 240              # points kept per host over a run (past it, every other one goes and the stride doubles)


class SlowRanks:
    """The slow-rank watch (pure): each rank's busy times (its own work per step, without the wait for the
    others: podrun.runtime.steps.StepClock) over its last SLOW_WINDOW steps; a rank whose median stays at least SLOW_FACTOR x
    the median of the other ranks' medians (and SLOW_MIN_GAP_S above it) is named once, and can be named again only
    after its median fell back under SLOW_CLEAR x. A report covers the steps since the rank's last one (a worker
    merges steps shorter than its report interval, podrun.runtime.progress), so the window is full once its reports
    cover SLOW_WINDOW steps, in at least SLOW_MIN_REPORTS reports: a straggler is named within about SLOW_WINDOW
    steps however short they are. A median over the window ignores a few slow steps (a checkpoint, a page fault, a
    noisy neighbour): the rank must be slow in most of its last reports.
    The others are every other rank that has reported, however few reports it has so far: reports from
    different hosts arrive out of step, and a rank compared only with the ranks whose windows filled first
    is compared with whichever came first (a straggler's reports come last)."""

    def __init__(self, window: int = SLOW_WINDOW):
        self.window = window
        self.busy: dict[int, list[tuple[float, int]]] = {}   # rank -> its window: (busy s, steps the report covers)
        self.last_step: dict[int, int] = {}
        self.slow: dict[int, dict] = {}        # rank -> its record while it is slow
        self.records: list[dict] = []          # every rank named, in order (summary.json's slow_ranks)

    def add(self, rank: int, host: str, busy_s: float, step: int | None = None) -> dict | None:
        """One busy time of ``rank`` (a report at ``step``: it covers the steps since the rank's last report, one
        when either is unknown); the rank's new record when this makes it slow, else None."""
        last = self.last_step.get(rank)
        covers = step - last if step is not None and last is not None and step > last else 1
        if step is not None:
            self.last_step[rank] = step
        xs = self.busy.setdefault(rank, [])
        xs.append((float(busy_s), covers))
        while len(xs) > 1 and sum(n for _, n in xs[1:]) >= self.window:
            xs.pop(0)
        if sum(n for _, n in xs) < self.window or len(xs) < min(SLOW_MIN_REPORTS, self.window):
            return None
        others = [median(b for b, _ in v) for r, v in self.busy.items() if r != rank]
        if not others:
            return None
        mine, rest = median(b for b, _ in xs), median(others)
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
                   "ratio": round(mine / rest, 3) if rest > 0 else None, "steps": sum(n for _, n in xs),
                   "reports": len(xs), "from_step": step,
                   "until_step": None}
            rec["max_ratio"] = rec["ratio"]
            self.slow[rank] = rec
            self.records.append(rec)
            return rec
        return None


def slow_rank_line(rec: dict) -> str:
    """The console line for a rank named slow (numbers rounded), with its cause when its split is known."""
    ratio = f" ({rec['ratio']:.1f}x)" if rec.get("ratio") is not None else ""
    cause = f"; the cause: {cause_text(rec)}" if rec.get("cause") in SPLIT_PARTS else ""
    return (f"rank {rec['rank']} on {rec['host']} is slow: busy {rec['busy_s']:.3g} s per step against a median of "
            f"{rec['others_median_s']:.3g} s on the other ranks{ratio}, over its last {rec['steps']} steps{cause} "
            f"(a straggler holds every rank back; a hang often starts as one)")


_DOING = {"input": "it waits {} per step for input", "compute": "its forward and backward take {} per step",
          "comm": "its gradient all-reduce not hidden behind compute takes {} per step",
          "optim": "its optimiser step takes {} per step"}


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def cause_text(rec: dict) -> str:
    """'input: it waits 210 ms per step for input (the other ranks 12 ms); it has 4 cores for 1 loader thread'."""
    part = rec["cause"]
    text = f"{part}: {_DOING[part].format(_ms(rec['cause_s']))} (the other ranks {_ms(rec['others_cause_s'])})"
    if part == "input" and rec.get("cpus") is not None:
        loaders = rec.get("loaders")
        feeds = "makes its batches in its training thread" if loaders == 0 else \
            f"{loaders} loader thread{'s' if loaders != 1 else ''}" if loaders is not None else "its loading"
        text += f"; it has {rec['cpus']} core{'s' if rec['cpus'] != 1 else ''} for its compute and " + feeds
    return text


def cause_of(mine: StepSplit, others: list[StepSplit]) -> tuple[str, float, float] | None:
    """Why a rank is slower than ``others`` (pure): the part of its split with the largest excess over the others'
    median of that part, as (part, its seconds, the others' median); None with no other rank or no excess."""
    if not others:
        return None
    rests = {part: median(getattr(o, part) for o in others) for part in SPLIT_PARTS}
    part = max(SPLIT_PARTS, key=lambda k: getattr(mine, k) - rests[k])     # the first of the largest excess
    return (part, getattr(mine, part), rests[part]) if getattr(mine, part) > rests[part] else None


def input_bound(means: dict[int, StepSplit], share: float = INPUT_BOUND_SHARE) -> dict | None:
    """The run is input-bound (pure) when every rank (two or more, or one alone) waits for input at least ``share``
    of its step: the record (the least and the greatest share, the median wait and step), else None."""
    if not means or any(m.total <= 0 for m in means.values()):
        return None
    shares = [m.input / m.total for m in means.values()]
    if min(shares) < share:
        return None
    return {"ranks": len(means), "min_share": round(min(shares), 3), "max_share": round(max(shares), 3),
            "input_s": round(median(m.input for m in means.values()), 6),
            "step_s": round(median(m.total for m in means.values()), 6), "share_bound": share}


def input_bound_line(rec: dict) -> str:
    """The console line, said once, for an input-bound run: the figures and what to change."""
    low, high = f"{rec['min_share'] * 100:.0f}", f"{rec['max_share'] * 100:.0f}"
    shares = low if low == high else f"{low}-{high}"
    return (f"the run is input-bound: every rank ({rec['ranks']}) waits for its next batch {shares} % of "
            f"its step ({_ms(rec['input_s'])} of {_ms(rec['step_s'])}, median); to feed it: more loader workers "
            f"working ahead (a DataLoader's num_workers, the runner's prefetch), fewer workers per host (more cores "
            f"each), a smaller image size (--image-size), or the data on local disk")


class StepSplits:
    """Each rank's step splits (its progress reports' ``split``): the last ``window`` per rank, where a slow rank's
    cause is read, and the mean over the run per rank (summary.json's ``step_split``); the input-bound run, once."""

    def __init__(self, window: int = SLOW_WINDOW, share: float = INPUT_BOUND_SHARE):
        self.window, self.share = window, share
        self.recent: dict[int, list[StepSplit]] = {}
        self.sums: dict[int, list] = {}           # rank -> [host, count, StepSplit of the sums]
        self.bound: dict | None = None            # the input-bound record, once named

    def add(self, rank: int, host: str, split: StepSplit) -> dict | None:
        """One split of ``rank``; the input-bound record when this makes the run input-bound (once a run)."""
        xs = self.recent.setdefault(rank, [])
        xs.append(split)
        del xs[:-self.window]
        _, n, total = self.sums.get(rank, (host, 0, StepSplit()))
        self.sums[rank] = [host, n + 1, StepSplit(*(getattr(total, k) + getattr(split, k) for k in SPLIT_PARTS),
                                                   split.cpus, split.loaders)]
        # judged once a round of reports (at the first rank's), once every rank's window is full
        if self.bound is not None or rank != next(iter(self.recent)) or \
                any(len(v) < self.window for v in self.recent.values()):
            return None
        self.bound = input_bound({r: self._median(r) for r in self.recent}, self.share)
        return self.bound

    def _median(self, rank: int) -> StepSplit:
        xs = self.recent[rank]
        return StepSplit(*(median(getattr(x, k) for x in xs) for k in SPLIT_PARTS), xs[-1].cpus, xs[-1].loaders)

    def cause(self, rank: int) -> dict:
        """The fields a slow rank's record gets: cause, cause_s, others_cause_s, cpus, loaders ({} unknown)."""
        if rank not in self.recent:
            return {}
        found = cause_of(self._median(rank), [self._median(r) for r in self.recent if r != rank])
        if found is None:
            return {}
        last = self.recent[rank][-1]
        return {"cause": found[0], "cause_s": round(found[1], 6), "others_cause_s": round(found[2], 6),
                "cpus": last.cpus, "loaders": last.loaders}

    def to_dict(self) -> dict:
        """summary.json's ``step_split``: each rank's mean split over the run, its host, and the input-bound record."""
        ranks = {str(r): {"host": host, "reports": n, **StepSplit(*(getattr(t, k) / n for k in SPLIT_PARTS),
                                                                  t.cpus, t.loaders).to_dict()}
                 for r, (host, n, t) in sorted(self.sums.items())}
        return {"ranks": ranks, "input_bound": self.bound} if ranks else {}


class HostBusy:
    """Each host's own work per step over the run: at each report of one of its ranks, the mean busy time of its
    ranks' latest reports (the run's img/s is the same on every host, collectives keep them in step; busy time is
    what each does alone). At most ``points`` points per host: past them every other point goes and only every
    second report after is kept, so a long run is drawn whole, coarser. summary.json's ``host_busy``."""

    def __init__(self, points: int = HOST_POINTS):
        self.points = points
        self.latest: dict[str, dict[int, float]] = {}     # host -> rank -> its last busy time
        self.series: dict[str, list[list]] = {}           # host -> [[step, mean busy s], ...]
        self.stride: dict[str, int] = {}
        self.seen: dict[str, int] = {}

    def add(self, rank: int, host: str, busy_s: float, step: int | None) -> None:
        latest = self.latest.setdefault(host, {})
        latest[rank] = float(busy_s)
        if step is None:
            return
        xs = self.series.setdefault(host, [])
        value = round(sum(latest.values()) / len(latest), 6)
        if xs and xs[-1][0] == step:          # another rank of the host at the same step
            xs[-1][1] = value
            return
        self.seen[host] = self.seen.get(host, 0) + 1
        if self.seen[host] % self.stride.get(host, 1) != 0:
            return
        xs.append([step, value])
        if len(xs) > self.points:
            del xs[1::2]
            self.stride[host] = self.stride.get(host, 1) * 2
