"""Slow ranks: a rank whose reported busy time stays well above the others' is named once (the straggler a hang
often starts as); and each host's own work per step over the run (HostBusy), where a slow host shows."""
from __future__ import annotations

from statistics import median

SLOW_FACTOR = 1.5              # a rank is slow when its busy time stays at least this times the others' median
SLOW_CLEAR = 1.25              # ... and no longer slow once back under this (no flapping at the edge)
SLOW_WINDOW = 10               # busy times kept per rank; the rule compares medians over them
SLOW_MIN_GAP_S = 0.005         # and at least this many seconds apart (timer noise on tiny steps)
HOST_POINTS = 240              # points kept per host over a run (past it, every other one goes and the stride doubles)


class SlowRanks:
    """The slow-rank watch (pure): each rank's last SLOW_WINDOW busy times (its own work per step, without the
    wait for the others: podrun.train.busy); a rank whose median stays at least SLOW_FACTOR x the median of
    the other ranks' medians (and SLOW_MIN_GAP_S above it) is named once, and can be named again only after
    its median fell back under SLOW_CLEAR x. A median over SLOW_WINDOW reports ignores a few slow steps
    (a checkpoint, a page fault, a noisy neighbour): the rank must be slow in most of its last reports.
    The others are every other rank that has reported, however few reports it has so far: reports from
    different hosts arrive out of step, and a rank compared only with the ranks whose windows filled first
    is compared with whichever came first (a straggler's reports come last)."""

    def __init__(self, window: int = SLOW_WINDOW):
        self.window = window
        self.busy: dict[int, list[float]] = {}
        self.slow: dict[int, dict] = {}        # rank -> its record while it is slow
        self.records: list[dict] = []          # every rank named, in order (summary.json's slow_ranks)

    def add(self, rank: int, host: str, busy_s: float, step: int | None = None) -> dict | None:
        """One busy time of ``rank``; the rank's new record when this makes it slow, else None."""
        xs = self.busy.setdefault(rank, [])
        xs.append(float(busy_s))
        del xs[:-self.window]
        if len(xs) < self.window:
            return None
        others = [median(v) for r, v in self.busy.items() if r != rank]
        if not others:
            return None
        mine, rest = median(xs), median(others)
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
