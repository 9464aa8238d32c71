"""Plan options shared by plan/launch/script/hosts, and resolving them into a Plan through the library."""
from __future__ import annotations

import click

from podrun.cli import types as t
from podrun.plan.inputs import POD_SIZES, PlanOptions, resolve_plan_inputs  # noqa: F401 - the commands' one entry


def stacked(*decorators):
    """One decorator that applies ``decorators`` as if each were written above the function, in this order."""
    def apply(f):
        for deco in reversed(decorators):
            f = deco(f)
        return f
    return apply


def complete_clusters(ctx, param, incomplete: str) -> list:
    """Shell completion for --cluster: the cluster spec names podrun finds (`podrun clusters`)."""
    from podrun.specs import cluster_names

    return [n for n in cluster_names() if n.startswith(incomplete)]


def complete_recipes(ctx, param, incomplete: str) -> list:
    """Shell completion for a RECIPE: the recipe names podrun finds (`podrun recipes`), then the shell's own file
    names (a recipe folder, a script, a hostfile: podrun.cli.completion's bash script adds them to the names)."""
    from click.shell_completion import CompletionItem

    from podrun.specs import recipe_names

    if ctx.params.get(param.name):          # launch's target is given: what follows is the target's own
        return [CompletionItem(incomplete, type="file")]
    return [CompletionItem(n) for n in recipe_names() if n.startswith(incomplete)] + \
        [CompletionItem(incomplete, type="file")]


# the options that shape a plan, by parameter name; every command that builds one takes them
_PLAN_OPTIONS = (
    ("pod", click.option("--pod", type=t.POD_SIZE, help="Shorthand for --cluster ipu-podN (16, 64, 128, 256).")),
    ("cluster", click.option("--cluster", "cluster", shell_complete=complete_clusters,
                             help="Cluster spec: a name in cluster_specs/ or a YAML path (default: local, or the "
                                  "scheduler's allocation).")),
    ("nodes", click.option("--nodes", type=t.NODES, help="Use the first N hosts of the cluster.")),
    ("global_batch", click.option("--global-batch", type=t.BATCH, help="Samples per weight update (default: the recipe's reference).")),
    ("local_batch", click.option("--local-batch", type=t.BATCH, help="Samples per replica per micro step.")),
    ("grad_accum", click.option("--grad-accum", type=t.GRAD_ACCUM, help="Micro batches accumulated per weight update (GA).")),
    ("instances_per_host", click.option("--instances-per-host", type=t.PER_HOST, help="Instances per host (default: the cluster spec's, 1).")),
    ("devices_per_host", click.option("--devices-per-host", type=t.PER_HOST, help="Devices per host (default: the cluster spec's).")),
    ("hosts_opt", click.option("--hosts", "hosts_opt", help="Comma-separated hosts (h1,h2 or h1:4,h2:4) instead of the cluster's.")),
    ("hostfile", click.option("--hostfile", type=click.Path(dir_okay=False), help="Hostfile (Open MPI 'host slots=N' or one host per line).")),
)
PLAN_OPTION_NAMES = tuple(name for name, _ in _PLAN_OPTIONS)
plan_options = stacked(*(opt for _, opt in _PLAN_OPTIONS))
# the plan options that choose the hosts and their devices (no batch): what `podrun hosts` takes
host_options = stacked(*(opt for name, opt in _PLAN_OPTIONS
                          if name not in ("global_batch", "local_batch", "grad_accum")))


def pop_plan_options(kwargs: dict) -> PlanOptions:
    """The plan options taken out of a command's kwargs, as one PlanOptions."""
    return PlanOptions(**{k: kwargs.pop(k) for k in PLAN_OPTION_NAMES if k in kwargs})


def resolve_plan(recipe: str | None, options: PlanOptions | None = None, discovered=None, **given):
    """Load specs, pick hosts (podrun.specs.allocation), and plan; ``given``: plan options by name, over ``options``.

    Returns (plan, cluster_spec, recipe_spec_or_None, host_source); the allocation, when there is
    one, is discovered once here and is host_source.discovered.
    """
    from dataclasses import replace

    from podrun.plan import make_plan

    spec, rspec, src, ov = resolve_plan_inputs(recipe, replace(options or PlanOptions(), **given), discovered)
    return make_plan(spec, rspec, ov), spec, rspec, src
