"""The largest local batch under a memory budget: doubling until a probe does not fit, then bisection of that
bracket at the point the measured bytes per sample predict (a plain halving when the prediction falls outside)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from podrun.specs.limits import MAX_BATCH


@dataclass(frozen=True)
class Probe:
    local_batch: int
    peak_bytes: int | None          # None: the probe died (out of memory)
    fits: bool
    error: str = ""


def largest_fit(measure: Callable[[int], dict], budget: int, *, start: int = 1, limit: int = MAX_BATCH,
                on_probe: Callable[[Probe], None] | None = None) -> tuple[int | None, list[Probe]]:
    """(largest local batch whose probe fits ``budget`` bytes, the probes in order); None when batch 1 does not.

    ``measure(b)``: {"peak_bytes": int or None, "error": str}. Doubling from ``start`` finds a bracket
    [fits, does not fit]; each next probe inside it is the batch the straight line through the two nearest
    measured probes puts at the budget, and, when that one fits, the batch above it, which usually closes the
    bracket in two probes (the memory of a step grows by a fixed amount per sample).
    """
    probes: list[Probe] = []

    def run(b: int) -> Probe:
        got = measure(b)
        peak = got.get("peak_bytes")
        p = Probe(b, peak, peak is not None and peak <= budget, got.get("error", ""))
        probes.append(p)
        if on_probe is not None:
            on_probe(p)
        return p

    b = max(1, min(start, limit))
    first = run(b)
    if not first.fits:
        if b == 1:
            return None, probes
        lo, hi = 0, b
    else:
        lo, hi = b, None
        while hi is None:
            nxt = min(lo * 2, limit)
            if nxt == lo:
                return lo, probes
            hi_probe = run(nxt)
            if hi_probe.fits:
                lo = nxt
            else:
                hi = nxt
    if lo == 0:                       # the start did not fit: halve down to a fit
        b = hi
        while True:
            b //= 2
            if b < 1:
                return None, probes
            if run(b).fits:
                lo = b
                break
            hi = b
    while hi - lo > 1:
        guess = _predict(probes, budget, lo, hi)
        p = run(guess)
        if p.fits:
            lo = guess
            if hi - lo > 1:
                q = run(lo + 1)
                if q.fits:
                    lo += 1
                else:
                    hi = lo + 1
        else:
            hi = guess
    return lo, probes


def _predict(probes: list[Probe], budget: int, lo: int, hi: int) -> int:
    """The batch inside (lo, hi) where the line through the measured probes nearest the budget reaches it;
    the middle when fewer than two measured probes exist or the line says nothing inside."""
    mid = (lo + hi) // 2
    pts = sorted({p.local_batch: p.peak_bytes for p in probes if p.peak_bytes is not None}.items())
    if len(pts) < 2:
        return mid
    below = [pt for pt in pts if pt[1] <= budget]
    above = [pt for pt in pts if pt[1] > budget]
    pair = (below[-1], above[0]) if below and above else tuple(pts[-2:])
    (b0, m0), (b1, m1) = pair
    if b1 == b0 or m1 <= m0:
        return mid
    guess = b0 + int((budget - m0) * (b1 - b0) // (m1 - m0))
    return guess if lo < guess < hi else mid
