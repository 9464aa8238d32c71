"""Measured inputs of a plan: a device's step time by local batch, the largest local batch that fits, the links' bus
bandwidth and latency, made from a calibration file (read, never written; torch-free: podrun plan reads it)."""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path

from podrun.errors import SpecError
from podrun.specs.calibration import Calibration, find, load
from podrun.specs.cluster import LinkSpec


@dataclass(frozen=True)
class InputMeasured:
    """A host's input pipeline (the recipe's decode and augmentation, no model) by loader workers on the host."""

    where: str                                  # "/data/imagenet (simplejpeg, 224 px), calibration NAME ..."
    rates: tuple[tuple[int, float], ...]        # (loader workers on one host, images per second), workers ascending
    cores: int                                  # the cores of the host it was measured on
    decoder: str
    cpu_ms: tuple[tuple[int, float], ...] = ()  # (loader workers, CPU ms an image: the pipeline's processes)

    def cores_used(self) -> float | None:
        """The cores the pipeline kept busy at the largest count measured (its CPU seconds a wall second: the host's
        cores when it was the host's alone, fewer where others' work shared them); None: CPU time not measured."""
        w, r = self.rates[-1]
        ms = dict(self.cpu_ms).get(w)
        return None if ms is None else r * ms / 1e3

    def cpu_ms_at(self, workers: int) -> float | None:
        """CPU milliseconds an image at the measured count nearest ``workers`` (None: not measured)."""
        if not self.cpu_ms:
            return None
        return min(self.cpu_ms, key=lambda p: (abs(p[0] - workers), -p[0]))[1]

    def rate_at(self, workers: int) -> float:
        """Images per second of one host with ``workers`` loader processes in all: the measured figure, else the
        line between the nearest two measured counts; beyond the largest count its figure (its cores are spent)."""
        pts = self.rates
        i = bisect.bisect_left(pts, (workers,))     # the first count at or past ``workers``
        if i == len(pts):
            return pts[-1][1]
        if i == 0 or pts[i][0] == workers:
            return pts[i][1]
        (w0, r0), (w1, r1) = pts[i - 1], pts[i]
        return r0 + (r1 - r0) * (workers - w0) / (w1 - w0)

    def best(self) -> tuple[int, float]:
        """(workers, images per second) of the fastest measured count."""
        return max(self.rates, key=lambda p: p[1])


@dataclass(frozen=True)
class Measured:
    """What a calibration measured, in the planner's terms; None where it measured nothing."""

    where: str                                  # "calibration NAME: h1,h2 (2 x cpu), 2026-11-25T12:00:00Z"
    step_seconds: tuple[tuple[int, float], ...] = ()    # (local batch, one device's step), batch ascending
    max_local_batch: int | None = None
    max_local_source: str = ""
    intra_host: LinkSpec | None = None
    inter_host: LinkSpec | None = None
    hidden_fraction: float | None = None        # of the all-reduce, behind the backward pass (None: not measured)
    hidden_source: str = ""
    input: InputMeasured | None = None          # None: the calibration did not time the input pipeline
    step_cpu_seconds: tuple[tuple[int, float], ...] = ()    # (local batch, a CPU device's step's CPU seconds)

    def cores_busy_at(self, local_batch: int) -> float | None:
        """The cores one device's step keeps busy (its CPU seconds over its wall seconds) at the measured local batch
        nearest ``local_batch``; None where the calibration did not record CPU time (an accelerator, an old file)."""
        if not self.step_cpu_seconds:
            return None
        b, cpu = min(self.step_cpu_seconds, key=lambda p: (abs(p[0] - local_batch), -p[0]))
        return cpu / self.step_at(b)

    def step_at(self, local_batch: int) -> float:
        """One device's step at ``local_batch``: linear between the measured batches (a fixed cost plus a cost per
        sample), extended from the nearest two beyond them; the one point's rate when only one was measured."""
        pts = self.step_seconds
        i = bisect.bisect_left(pts, (local_batch,))     # the first batch at or past ``local_batch``
        if i < len(pts) and pts[i][0] == local_batch:
            return pts[i][1]
        if len(pts) == 1:
            b, t = pts[0]
            return t * local_batch / b
        i = min(max(i, 1), len(pts) - 1)                # the two nearest, the first two or the last two beyond
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


MAX_AGE_DAYS = 30.0      # --max-age's default: older calibrations are used with a warning


def mismatches(cal: Calibration, cluster, recipe) -> list[str]:
    """What differs between the calibration and the plan's cluster and recipe (empty: it applies)."""
    want = (("recipe", cal.recipe, recipe.name), ("model", cal.model, recipe.model.name),
            ("cluster", cal.cluster, cluster.name), ("device", cal.device, cluster.device.key))
    return [f"{what} {have!r} (the plan's is {plan!r})" for what, have, plan in want if have != plan]


def measured_for(name_or_path: str, cluster, recipe, plan_hosts: tuple[str, ...], *, max_age_days: float,
                 runs_dir: str | Path):
    """(Measured, warnings) from --calibration FILE|NAME (a name under ``runs_dir``) for this cluster and recipe:
    refused when it is another recipe's, model's, cluster's or device's; a warning when it is older than
    ``max_age_days`` or measured on other hosts."""
    path = find(name_or_path, runs_dir)
    cal = load(path)
    if recipe is None:
        raise SpecError("--calibration needs a recipe: a calibration measures one recipe's model")
    diff = mismatches(cal, cluster, recipe)
    if diff:
        raise SpecError(f"calibration {path} was measured for another setup: {'; '.join(diff)}",
                        hint=f"run `podrun calibrate` for {recipe.name} on {cluster.name}, or leave --calibration out")
    warnings = []
    age_days = cal.age_seconds() / 86400
    if age_days > max_age_days:
        warnings.append(f"calibration {path} is {age_days:.0f} days old (measured {cal.measured_at}; --max-age "
                        f"{max_age_days:g} days): the hosts may have changed since; run `podrun calibrate` again")
    elif age_days < -1 / 24:
        warnings.append(f"calibration {path} is dated in the future ({cal.measured_at})")
    others = [h for h in plan_hosts if h not in cal.hosts]
    if others:
        warnings.append(f"calibration {path} was measured on {', '.join(cal.hosts)}, not on "
                        f"{', '.join(others)}: its figures are taken for those too")
    px = "" if cal.image_size is None else f", {cal.image_size} px inputs"
    where = f"calibration {Path(path).stem}: {len(cal.hosts)} host(s) x {cal.devices_per_host} {cal.device}{px}, " \
            f"{cal.measured_at}"
    if cal.image_size is not None and cal.image_size != recipe.dataset.image_size:
        warnings.append(f"calibration {path} was measured at {cal.image_size} px inputs, the recipe's are "
                        f"{recipe.dataset.image_size} px: its rates and largest local batch hold for runs at "
                        f"{cal.image_size} px")

    def link(r, what):
        if r is None:
            return None
        return LinkSpec(name=f"measured {what} all-reduce ({cal.network.backend}, {r.ranks} ranks)",
                        bandwidth_gbps=r.bus_bandwidth_gbps, latency_us=r.latency_us,
                        source=f"measured bus bandwidth, {where}")

    m, o = cal.memory, cal.overlap
    hidden_source = "" if o is None else (
        f"measured: a DDP step of {o.ranks} ranks at local batch {o.local_batch} took {o.synced_step_seconds:.3g} s, "
        f"the step alone {o.step_seconds:.3g} s and one all-reduce of the gradient {o.allreduce_seconds:.3g} s, "
        f"{where}")
    return Measured(
        where=where,
        step_seconds=tuple((p.local_batch, p.step_seconds) for p in cal.throughput),
        step_cpu_seconds=tuple((p.local_batch, p.cpu_seconds) for p in cal.throughput if p.cpu_seconds is not None),
        max_local_batch=m.largest_local_batch,
        max_local_source=(f"the largest that fits {m.budget_bytes / 1e9:.3g} GB ({m.budget_source}), {where}"
                          if m.searched else f"given to podrun calibrate ({m.budget_source}), not searched, {where}"),
        intra_host=link(cal.network.intra_host, "intra-host"),
        inter_host=link(cal.network.inter_host, "inter-host"),
        hidden_fraction=None if o is None else o.hidden_fraction,
        hidden_source=hidden_source,
        input=None if cal.input is None else InputMeasured(
            where=f"{cal.input.data} ({cal.input.decoder}, {cal.input.image_size} px, {cal.input.images} images a "
                  f"count, the slowest of {cal.input.hosts} host(s)), {where}",
            rates=tuple((r.workers, r.images_per_second) for r in cal.input.rates), cores=cal.input.cores,
            decoder=cal.input.decoder,
            cpu_ms=tuple((r.workers, r.cpu_ms_per_image) for r in cal.input.rates if r.cpu_ms_per_image is not None)),
    ), warnings


def launch_measured(calibration: str | None, cluster, recipe, overrides, runs_dir: str | Path):
    """`podrun launch --calibration`: (Measured or None, what to say before the run: the warnings)."""
    if calibration is None:
        return None, ()
    hosts = cluster.hosts if overrides.nodes is None else cluster.hosts[: overrides.nodes]
    measured, warnings = measured_for(calibration, cluster, recipe, tuple(hosts), max_age_days=MAX_AGE_DAYS,
                                      runs_dir=runs_dir)
    return measured, tuple(f"warning: {w}" for w in warnings)
