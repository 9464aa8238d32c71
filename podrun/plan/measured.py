"""Measured inputs of a plan (from a calibration): a device's step time by local batch, the largest local batch
that fits, the links' bus bandwidth and latency; pure, no I/O."""
from __future__ import annotations

from dataclasses import dataclass

from podrun.specs.cluster import LinkSpec


@dataclass(frozen=True)
class Measured:
    """What a calibration measured, in the planner's terms; None where it measured nothing."""

    where: str                                  # "calibration NAME: h1,h2 (2 x cpu), 2026-11-25T12:00:00Z"
    step_seconds: tuple[tuple[int, float], ...] = ()    # (local batch, one device's step), batch ascending
    max_local_batch: int | None = None
    max_local_source: str = ""
    intra_host: LinkSpec | None = None
    inter_host: LinkSpec | None = None

    def step_at(self, local_batch: int) -> float:
        """One device's step at ``local_batch``: linear between the measured batches (a fixed cost plus a cost per
        sample), extended from the nearest two beyond them; the one point's rate when only one was measured."""
        pts = self.step_seconds
        for b, t in pts:
            if b == local_batch:
                return t
        if len(pts) == 1:
            b, t = pts[0]
            return t * local_batch / b
        if local_batch < pts[0][0]:
            (b0, t0), (b1, t1) = pts[0], pts[1]
        elif local_batch > pts[-1][0]:
            (b0, t0), (b1, t1) = pts[-2], pts[-1]
        else:
            i = next(i for i, (b, _) in enumerate(pts) if b > local_batch)
            (b0, t0), (b1, t1) = pts[i - 1], pts[i]
        t = t0 + (t1 - t0) * (local_batch - b0) / (b1 - b0)
        floor = min(t0, t1) * local_batch / max(b0, b1)     # never faster per sample than the best measured
        return max(t, floor, 1e-9)

    def rate_at(self, local_batch: int) -> float:
        """Images per second of one device at ``local_batch``."""
        return local_batch / self.step_at(local_batch)

    def describe_rate(self, local_batch: int) -> str:
        batches = ", ".join(str(b) for b, _ in self.step_seconds)
        how = "measured" if any(b == local_batch for b, _ in self.step_seconds) else \
            f"interpolated from the measured local batches {batches}"
        return f"{how} at local batch {local_batch} ({self.where})"
