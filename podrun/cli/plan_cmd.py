"""`podrun plan`: preview the decomposition, placement, LR and estimate of a recipe on a cluster."""
from __future__ import annotations

import click

from podrun.cli.calibration_options import calibrated_plan, calibration_options
from podrun.cli.options import complete_recipes, plan_options, pop_plan_options, resolve_plan, resolve_plan_inputs


@click.command("plan")
@click.argument("recipe", shell_complete=complete_recipes)
@plan_options
@click.option("--elastic", "elastic", metavar="MIN[:MAX]",
              help="Table of the plans at the same global batch on every host count from MAX (default: the "
                   "plan's hosts) down to MIN; counts where it cannot be met exactly are listed with the reason.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan (or the elastic table) as JSON.")
@calibration_options
def plan(recipe: str, elastic: str | None, as_json: bool, calibration: str | None, max_age: float, **kwargs) -> None:
    """Preview how RECIPE runs on a cluster: replicas x local batch x GA, placement, LR, estimate.

    \b
    podrun plan --pod 256 recipes/efficientnet_b4
    podrun plan --pod 256 recipes/efficientnet_b4 --elastic 8
    podrun plan --cluster abci --nodes 512 resnet50 --json
    """
    from podrun.cli.render import print_json, render_elastic, render_plan

    options = pop_plan_options(kwargs)
    if calibration is not None and elastic is not None:
        raise click.UsageError("--calibration applies to one plan; leave out --elastic")
    if elastic is not None:
        from podrun.elastic.table import elastic_table, parse_range

        lo, hi = parse_range(elastic)
        cluster, rspec, src, ov = resolve_plan_inputs(recipe, options)
        table = elastic_table(cluster, rspec, ov, lo, hi)
        if as_json:
            print_json({**table.to_dict(), "recipe": rspec.name if rspec else "", "cluster": cluster.name,
                        "host_source": src.source})
            return
        render_elastic(table, rspec.name if rspec else "", cluster.name, src.source)
        return
    if calibration is not None:
        p, src = calibrated_plan(recipe, options, calibration, max_age)
    else:
        p, _, _, src = resolve_plan(recipe, options)
    if as_json:
        print_json({**p.to_dict(), "host_source": src.source})
    else:
        render_plan(p, src.source)
