"""`podrun plan`: preview the decomposition, placement, LR and estimate of a recipe on a cluster."""
from __future__ import annotations

import click

from podrun.cli.options import plan_options, pop_plan_options, resolve_plan_with_source


@click.command("plan")
@click.argument("recipe")
@plan_options
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan(recipe: str, as_json: bool, **kwargs) -> None:
    """Preview how RECIPE runs on a cluster: replicas x local batch x GA, placement, LR, estimate.

    \b
    podrun plan --pod 256 recipes/efficientnet_b4
    podrun plan --cluster abci --nodes 512 resnet50 --json
    """
    p, cluster, rspec, src = resolve_plan_with_source(recipe, **pop_plan_options(kwargs))
    from podrun.cli.render import print_json

    if as_json:
        d = p.to_dict()
        d["host_source"] = src.source
        print_json(d)
        return
    render_plan(p, src.source)


def _placement_rows(p, limit: int = 8):
    rows = []
    for pl in p.placement[:limit]:
        last = pl.replica_offset + pl.local_replicas - 1
        devs = f"{pl.devices[0]}-{pl.devices[-1]}" if len(pl.devices) > 1 else str(pl.devices[0])
        rows.append((str(pl.index), pl.host, f"{pl.replica_offset}-{last}" if last > pl.replica_offset else str(pl.replica_offset), devs))
    return rows


def render_plan(p, host_source: str) -> None:
    from rich.table import Table

    from podrun.cli.render import console

    out = console()
    title = f"{p.recipe} on {p.cluster}" if p.recipe else f"command on {p.cluster}"
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("hosts", f"{len(p.hosts)} ({host_source})")
    t.add_row("devices", f"{p.devices} = {len(p.hosts)} x {p.devices_per_host} {p.device_kind}")
    t.add_row("devices per replica", str(p.devices_per_replica))
    t.add_row("replicas", str(p.replicas))
    t.add_row("instances", f"{p.instances} ({p.instances_per_host} per host, {p.replicas_per_instance} replicas each)")
    t.add_row("local batch", str(p.local_batch))
    t.add_row("GA", str(p.grad_accum))
    t.add_row("global batch", f"{p.global_batch} = {p.local_batch} x {p.replicas} x {p.grad_accum}")
    if p.recipe:
        t.add_row("learning rate", f"{p.learning_rate:.6g} ({p.lr_rule} rule, reference {p.reference_learning_rate:g} at {p.reference_global_batch})")
        t.add_row("warmup", f"{p.warmup_epochs:g} epochs")
        t.add_row("pipeline bubble", f"{p.pipeline_bubble:.2%}" if p.devices_per_replica > 1 else "none (1 device per replica)")
    out.print(t)

    pt = Table(title="placement", title_justify="left")
    for c in ("instance", "host", "replicas", "devices"):
        pt.add_column(c)
    for row in _placement_rows(p):
        pt.add_row(*row)
    if len(p.placement) > 8:
        pt.add_row("...", f"{len(p.placement) - 8} more", "", "")
    out.print(pt)

    if p.recipe:
        e = p.estimate
        et = Table(title="estimate", show_header=False, title_justify="left")
        et.add_column("what", style="bold")
        et.add_column("value")
        et.add_row("throughput", f"{e.images_per_second:,.0f} img/s")
        et.add_row("scaling efficiency", f"{e.scaling_efficiency:.1%}")
        et.add_row("step", f"{e.step_seconds * 1000:.1f} ms (all-reduce {e.allreduce_seconds * 1000:.2f} ms)")
        et.add_row("time to train", f"{e.time_to_train_hours:.2f} h for {p.epochs:g} epochs")
        out.print(et)
        out.print("assumptions: " + "; ".join(e.assumptions))
    for n in p.notes:
        out.print(f"note: {n}")
