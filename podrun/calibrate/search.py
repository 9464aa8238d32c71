"""The largest local batch under a memory budget: doubling until a probe does not fit, then bisection of that
bracket, each next probe at the batch the measured bytes per sample put at the budget (the middle when the line
says nothing, or has missed on the same side twice)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from podrun.specs.limits import MAX_BATCH

JUMP = 8        # a doubling step may go this many times further when the line says the budget is that far


@dataclass(frozen=True)
class Probe:
    local_batch: int
    peak_bytes: int | None          # None: the probe died (out of memory)
    fits: bool
    error: str = ""


def largest_fit(measure: Callable[[int], dict], budget: int, *, start: int = 1, limit: int = MAX_BATCH,
                on_probe: Callable[[Probe], None] | None = None) -> tuple[int | None, list[Probe]]:
    """(largest local batch whose probe fits ``budget`` bytes, the probes in order); None when batch 1 does not.

    ``measure(b)``: {"peak_bytes": int or None, "error": str}. From ``start``: doubling (or halving, when the start
    does not fit) finds a bracket [fits, does not fit]; the line through the two measured probes nearest the budget
    (a step's memory grows by a fixed amount per sample) picks the next probe, in the doubling phase too, and a
    probe at a predicted batch that fits is followed by the batch above it, which closes the bracket when the
    line was right.
    """
    probes: list[Probe] = []
    lo, hi = 0, None            # the largest batch known to fit (0: none), the smallest known not to
    misses = 0                  # predicted probes in a row on the same side of the budget

    def run(b: int) -> Probe:
        got = measure(b)
        peak = got.get("peak_bytes")
        p = Probe(b, peak, peak is not None and peak <= budget, got.get("error", ""))
        probes.append(p)
        if on_probe is not None:
            on_probe(p)
        return p

    b = max(1, min(start, limit))
    predicted = False
    last_side = None
    while True:
        p = run(b)
        if p.fits:
            lo = b
        else:
            hi = b
        if predicted:
            misses = misses + 1 if p.fits == last_side else 1
            last_side = p.fits
        if hi == 1:
            return None, probes
        if hi is not None and hi - lo == 1:
            return lo, probes
        if lo == limit:
            return lo, probes
        if lo == 0:                                   # nothing fits yet: halve
            b, predicted = max(1, hi // 2), False
            continue
        guess = _predict(probes, budget)
        top = min(limit, lo * JUMP) if hi is None else hi - 1
        if predicted and p.fits and (hi is None or lo + 1 < hi):
            # the line's batch fits: the line through it aims again, or, when it says this is the largest (or
            # has missed twice), the next batch up tells whether it is
            if guess is not None and misses < 2 and lo + 1 < guess <= top:
                b = guess
            else:
                b, predicted = lo + 1, False
            continue
        if guess is not None and misses < 2 and (hi is None or guess < hi):
            # while nothing is known not to fit, the line may jump up to JUMP times, never less than a doubling
            b = min(max(guess, lo + 1 if hi is not None else min(lo * 2, limit)), top)
            predicted = b == guess                    # a guess beyond the bracket or the jump is a plain step
        elif hi is None:
            b, predicted = min(lo * 2, limit), False
        else:
            b, predicted, misses = (lo + hi) // 2, False, 0
        if not predicted and hi is None:
            misses = 0                                # a plain doubling: the line's earlier misses are behind it


def _predict(probes: list[Probe], budget: int) -> int | None:
    """The largest batch the straight line through two measured probes keeps within the budget: the nearest on
    either side of the budget once a probe is over it; before that, the largest that fits and one at most half of
    it (far apart, so that a probe's noise moves the slope little); None when there are not two, or the line does
    not rise."""
    pts = sorted({p.local_batch: p.peak_bytes for p in probes if p.peak_bytes is not None}.items())
    below = [pt for pt in pts if pt[1] <= budget]
    above = [pt for pt in pts if pt[1] > budget]
    if below and above:
        (b0, m0), (b1, m1) = below[-1], above[0]
    elif len(below) >= 2:
        b1, m1 = below[-1]
        b0, m0 = ([pt for pt in below if pt[0] <= b1 // 2] or below[:1])[-1]
    else:
        return None
    if b1 <= b0 or m1 <= m0:
        return None
    return b0 + int((budget - m0) * (b1 - b0) // (m1 - m0))
