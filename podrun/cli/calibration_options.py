"""--calibration and --max-age (podrun plan, podrun launch), and a plan made with a calibration's measured inputs."""
from __future__ import annotations

import sys

import click

from podrun.cli import types as t
from podrun.cli.options import stacked
from podrun.plan.inputs import PlanOptions, resolve_plan_inputs
from podrun.plan.measured import MAX_AGE_DAYS


calibration_options = stacked(
    click.option("--calibration", metavar="FILE|NAME",
                 help="Plan with what `podrun calibrate` measured (a file, or a name under "
                      "runs/calibrations): the rate per device, the largest local batch, the all-reduce."),
    click.option("--max-age", "max_age", type=t.AGE_DAYS, default=MAX_AGE_DAYS, show_default=True, metavar="DAYS",
                 help="Warn when the --calibration file is older than this."))


def calibrated_plan(recipe: str, options: PlanOptions, calibration: str, max_age_days: float):
    """(plan with the calibration's measured inputs, host source); the warnings said on stderr."""
    from podrun.rundir.layout import DEFAULT_RUNS_DIR
    from podrun.plan import make_plan
    from podrun.plan.measured import measured_for
    from podrun.redaction import shown

    cluster, rspec, src, ov = resolve_plan_inputs(recipe, options)
    hosts = cluster.hosts if ov.nodes is None else cluster.hosts[: ov.nodes]
    measured, warnings = measured_for(calibration, cluster, rspec, tuple(hosts), max_age_days=max_age_days,
                                      runs_dir=DEFAULT_RUNS_DIR)
    for w in warnings:
        print(shown(f"podrun: warning: {w}"), file=sys.stderr, flush=True)
    return make_plan(cluster, rspec, ov, measured), src
