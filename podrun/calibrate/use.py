"""A calibration as a plan's measured inputs: refused when it is another recipe's, model's, cluster's or device's,
a warning when it is older than --max-age or measured on other hosts; torch-free (podrun plan reads it)."""
from __future__ import annotations

from pathlib import Path

from podrun.calibrate.file import Calibration, find, load
from podrun.errors import SpecError

MAX_AGE_DAYS = 30.0      # --max-age's default: older calibrations are used with a warning


def mismatches(cal: Calibration, cluster, recipe) -> list[str]:
    """What differs between the calibration and the plan's cluster and recipe (empty: it applies)."""
    want = (("recipe", cal.recipe, recipe.name), ("model", cal.model, recipe.model.name),
            ("cluster", cal.cluster, cluster.name), ("device", cal.device, cluster.device.key))
    return [f"{what} {have!r} (the plan's is {plan!r})" for what, have, plan in want if have != plan]


def measured_for(name_or_path: str, cluster, recipe, plan_hosts: tuple[str, ...], *, max_age_days: float,
                 runs_dir: str | None = None):
    """(podrun.plan.measured.Measured, warnings) from --calibration FILE|NAME for this cluster and recipe."""
    from podrun.plan.measured import Measured
    from podrun.specs.cluster import LinkSpec

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
    where = f"calibration {Path(path).stem}: {len(cal.hosts)} host(s) x {cal.devices_per_host} {cal.device}, " \
            f"{cal.measured_at}"

    def link(r, what):
        if r is None:
            return None
        return LinkSpec(name=f"measured {what} all-reduce ({cal.network.backend}, {r.ranks} ranks)",
                        bandwidth_gbps=r.bus_bandwidth_gbps, latency_us=r.latency_us,
                        source=f"measured bus bandwidth, {where}")

    m = cal.memory
    return Measured(
        where=where,
        step_seconds=tuple((p.local_batch, p.step_seconds) for p in cal.throughput),
        max_local_batch=m.largest_local_batch,
        max_local_source=f"the largest that fits {m.budget_bytes / 1e9:.3g} GB ({m.budget_source}), {where}",
        intra_host=link(cal.network.intra_host, "intra-host"),
        inter_host=link(cal.network.inter_host, "inter-host"),
    ), warnings


def launch_measured(calibration: str | None, cluster, recipe, overrides, runs_dir: str | None):
    """`podrun launch --calibration`: (Measured or None, what to say before the run: the warnings)."""
    if calibration is None:
        return None, ()
    hosts = cluster.hosts if overrides.nodes is None else cluster.hosts[: overrides.nodes]
    measured, warnings = measured_for(calibration, cluster, recipe, tuple(hosts), max_age_days=MAX_AGE_DAYS,
                                      runs_dir=runs_dir)
    return measured, tuple(f"warning: {w}" for w in warnings)
