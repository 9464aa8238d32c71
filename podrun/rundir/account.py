"""The run's account: every second of a launch's wall time in one category (queue, launch, start-up, training,
evaluation, checkpoint stall, failure, idle at the end) and the goodput, from the moments the launch recorded and
the runner's records (pure: it takes values and reads nothing)."""
from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from podrun.rundir.metrics import StepLog, is_number

CATEGORIES = ("queue", "launch", "staging", "startup", "training", "evaluation", "checkpoint", "failure", "idle")
LABELS = {"queue": "waiting in the queue", "launch": "launch (to every rank running)",
          "staging": "staging the data to node-local disk (--stage)",
          "startup": "start-up (to the first step)", "training": "training", "evaluation": "evaluation",
          "checkpoint": "checkpoint stalls", "failure": "failure (detection, restart, work redone)",
          "idle": "idle at the end"}
ENDED_BADLY = ("failed", "lost", "hung")      # an attempt status whose end is a failure's detection


@dataclass(frozen=True)
class Moments:
    """The launch's own moments (wall clock, seconds since the epoch): when the job was submitted and when the
    scheduler started it (None: not submitted, or not said), when podrun launch started, when it ended."""

    launch_start: float
    exit: float
    submitted: float | None = None
    job_started: float | None = None

    @property
    def start(self) -> float:
        """The account's first moment: the submission when it came first, else podrun launch's start."""
        return self.launch_start if self.submitted is None else min(self.submitted, self.launch_start)


@dataclass(frozen=True)
class Part:
    """Seconds per category over a stretch of wall time, and its goodput (training / wall)."""

    seconds: dict = field(default_factory=dict)

    @property
    def wall_s(self) -> float:
        return sum(self.seconds.values())

    @property
    def goodput(self) -> float | None:
        wall = self.wall_s
        return self.seconds.get("training", 0.0) / wall if wall > 0 else None

    def to_dict(self) -> dict[str, Any]:
        g = self.goodput
        return {"wall_s": round(self.wall_s, 3), "goodput": None if g is None else round(g, 4),
                "seconds": {c: round(self.seconds.get(c, 0.0), 3) for c in CATEGORIES}}


@dataclass(frozen=True)
class Account:
    """summary.json's ``account``: the launch's whole (``run``) and each attempt's own."""

    run: Part
    attempts: tuple[Part, ...] = ()
    since: float | None = None         # the moments it runs over (wall clock): podrun launch's start (or the
    until: float | None = None         # submission) to its last write

    def to_dict(self) -> dict[str, Any]:
        return {**self.run.to_dict(), "attempts": [a.to_dict() for a in self.attempts]}

    def record(self) -> dict[str, Any]:
        """As summary.json holds it: with its moments."""
        return {**self.to_dict(), **({} if self.since is None else {"since": self.since}),
                **({} if self.until is None else {"until": self.until})}

    def idle_until(self, now: float) -> Account:
        """The account run on to ``now`` (the launch's very end): the time since ``until`` is idle at the end."""
        if self.until is None:
            return self
        secs = self.run.seconds
        return Account(Part({**secs, "idle": secs.get("idle", 0.0) + max(now - self.until, 0.0)}), self.attempts,
                       self.since, now)

    @classmethod
    def from_dict(cls, d: Any) -> Account | None:
        """summary.json's record read back; None for one of another shape."""
        def part(x: Any) -> Part | None:
            secs = x.get("seconds") if isinstance(x, dict) else None
            if not isinstance(secs, dict):
                return None
            return Part({c: float(secs[c]) for c in CATEGORIES if is_number(secs.get(c))})

        def moment(x: Any) -> float | None:
            return float(x) if is_number(x) else None

        run = part(d)
        if run is None:
            return None
        rest = d.get("attempts")
        return cls(run, tuple(p for p in map(part, rest if isinstance(rest, list) else []) if p is not None),
                   moment(d.get("since")), moment(d.get("until")))


def _within(points, lo: float, hi: float) -> float:
    """Seconds of the (time, seconds) records that end in (lo, hi], at most hi - lo."""
    return min(sum(s for t, s in points if lo < t <= hi), max(hi - lo, 0.0))


def attempt_part(a, log: StepLog, resumed_at: int | None, last: bool) -> Part:
    """One attempt's seconds from its start to its end: launch to every instance ready, start-up to its first
    step's start, then training less the evaluations and checkpoint stalls recorded in it, the steps past
    ``resumed_at`` (where the next attempt took up the work: they are redone, so failure), and the rest after its
    last step (the last evaluation and save, then idle, or failure when it ended badly or is not ``last``). Without
    a step recorded (a plain script), start-up runs to when its failure began, if it failed, and failure after.
    ``a``: a podrun.rundir.summary.Attempt whose start and end are known (summary imports this module)."""
    lo, hi = a.started, max(a.ended, a.started)

    def clamp(t: float) -> float:
        return min(max(t, lo), hi)

    ready = clamp(lo + a.all_ready_s) if a.all_ready_s is not None else None
    steps = [(n, t) for n, t in log.steps if lo < t <= hi]
    durations = [d for t, d in log.step_s if lo < t <= hi]
    start_step = next((w.get("step") for t, w in log.starts if lo <= t <= hi), None)
    if ready is None:       # not every instance said ready: its runner's first record says it ran
        ready = clamp(min([t for t, _ in log.starts if lo <= t <= hi] + [steps[0][1] if steps else hi]))
    if steps:
        ready = min(ready, steps[0][1])
    bad = a.status in ENDED_BADLY or not last
    if not steps:           # no step recorded: start-up until the failure began (a hang's silence, an exit), if any
        first = last_t = max(clamp(a.failed_at), ready) if bad and isinstance(a.failed_at, (int, float)) else hi
    else:
        typical = statistics.median(durations) if durations else 0.0
        before = steps[0][0] - start_step if isinstance(start_step, int) and start_step < steps[0][0] else 1
        first, last_t = min(max(steps[0][1] - before * typical, ready), steps[0][1]), steps[-1][1]
    kept_t = last_t
    if resumed_at is not None:                # the work past the state the next attempt resumed from is redone
        kept = [t for n, t in steps if n <= resumed_at]
        kept_t = kept[-1] if kept else first
    busy = log.evals, log.saves
    evals, saves = (_within(p, first, kept_t) for p in busy)
    tail_eval, tail_save = _within(log.evals, last_t, hi), _within(log.saves, last_t, hi)
    tail_save = min(tail_save, hi - last_t - tail_eval)
    rest = hi - last_t - tail_eval - tail_save
    staging = min(_within(log.stages, lo, first), max(first - ready, 0.0))     # within the start-up
    secs = {"launch": ready - lo, "staging": staging, "startup": first - ready - staging,
            "evaluation": evals + tail_eval,
            "checkpoint": min(saves, kept_t - first - evals) + tail_save,
            "failure": (last_t - kept_t) + (rest if bad else 0.0), "idle": 0.0 if bad else rest}
    secs["training"] = max(kept_t - first - evals - saves, 0.0)
    return Part(secs)


def account(m: Moments, attempts: Sequence, log: StepLog) -> Account:
    """The launch's account: queue (submitted to the job's start), launch (podrun's start to the first attempt's
    ready), each attempt's part (a restart's launch and start-up count as failure in the whole), the gaps between
    attempts (re-plan, restart) as failure, and after the last attempt to the exit as idle. ``attempts``: this
    launch's (podrun.rundir.summary.Attempt), each with its start and end."""
    parts = []
    for i, a in enumerate(attempts):
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        resumed = None if nxt is None else next((w.get("step") for t, w in log.starts
                                                 if nxt.started <= t <= nxt.ended), 0)
        parts.append(attempt_part(a, log, resumed if isinstance(resumed, int) else None, nxt is None))
    total = dict.fromkeys(CATEGORIES, 0.0)
    start = m.start
    queued_until = m.launch_start if m.job_started is None else min(max(m.job_started, start), m.launch_start)
    total["queue"], total["launch"] = queued_until - start, m.launch_start - queued_until
    t = m.launch_start
    for i, (a, p) in enumerate(zip(attempts, parts)):
        gap = max(a.started - t, 0.0)
        total["launch" if i == 0 else "failure"] += gap
        for c, s in p.seconds.items():
            total["failure" if i > 0 and c in ("launch", "startup") else c] += s
        t = max(t, a.started) + p.wall_s
    total["idle"] += max(m.exit - t, 0.0)
    return Account(Part(total), tuple(parts))
