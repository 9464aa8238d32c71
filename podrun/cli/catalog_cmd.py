"""`podrun clusters` and `podrun recipes`: what specs podrun finds by name, one line each (or --json)."""
from __future__ import annotations

import click


def _show(rows: list[dict], as_json: bool, line) -> None:
    """The rows as JSON, or each as its ``line`` (markup) and its source under it."""
    from podrun.cli.render import console, print_json

    if as_json:
        print_json(rows)
        return
    out = console()
    for r in rows:
        out.print(line(r), highlight=False)
        if r["source"]:
            out.print(f"    source: {r['source']}", markup=False)


@click.command("clusters")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def clusters(as_json: bool) -> None:
    """List the cluster specs that --cluster NAME finds ($PODRUN_CLUSTER_SPECS_PATH, ./cluster_specs, podrun's
    own): name, hosts x devices, scheduler, engine, what it is and where its figures come from."""
    from podrun.specs import cluster_names, find_cluster_file, load_cluster

    rows = []
    for name in cluster_names():
        c = load_cluster(name)
        rows.append({"name": name, "hosts": len(c.hosts), "devices_per_host": c.devices_per_host,
                     "device": c.device.key, "cores_per_host": None if c.cpu is None else c.cpu.cores,
                     "scheduler": c.scheduler, "engine": c.engine, "description": c.description,
                     "source": next(iter(c.sources), ""), "path": str(find_cluster_file(name))})
    _show(rows, as_json, lambda r: f"[bold]{r['name']}[/bold]  {r['hosts']} x {r['devices_per_host']} {r['device']}, "
                                   f"{r['scheduler']}, {r['engine']}: {r['description']}")


@click.command("recipes")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def recipes(as_json: bool) -> None:
    """List the recipes that RECIPE finds by name ($PODRUN_RECIPES_PATH, ./recipes, podrun's own): name, model,
    data set, global batch, epochs, what it is and where it comes from."""
    from podrun.specs import find_recipe_dir, load_recipe, recipe_names

    rows = []
    for name in recipe_names():
        r = load_recipe(name)
        rows.append({"name": name, "model": r.model.name, "dataset": r.dataset.name,
                     "global_batch": r.global_batch, "epochs": r.epochs, "description": r.description,
                     "source": next(iter(r.sources), ""), "path": str(find_recipe_dir(name))})
    _show(rows, as_json, lambda r: f"[bold]{r['name']}[/bold]  {r['model']} on {r['dataset']}, global batch "
                                   f"{r['global_batch']}, {r['epochs']:g} epochs: {r['description']}")
