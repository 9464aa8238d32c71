"""Plan options shared by plan/launch/script/hosts, and resolving them into a Plan through the library."""
from __future__ import annotations

import click

from podrun.cli import types as t
from podrun.errors import PlanError


BATCH_OPTION_NAMES = ("global_batch", "local_batch", "grad_accum")


def host_options(f):
    """The plan options that choose the hosts and their devices (no batch): what `podrun hosts` takes."""
    return plan_options(f, batch=False)


def plan_options(f, *, batch: bool = True):
    """The options that shape a plan; every command that builds one takes them (``batch=False``: not the batch)."""
    opts = [
        ("pod", click.option("--pod", type=t.POD_SIZE, help="Shorthand for --cluster ipu-podN (16, 64, 128, 256).")),
        ("cluster", click.option("--cluster", "cluster", help="Cluster spec: a name in cluster_specs/ or a YAML path (default: local, or the scheduler's allocation).")),
        ("nodes", click.option("--nodes", type=t.NODES, help="Use the first N hosts of the cluster.")),
        ("global_batch", click.option("--global-batch", type=t.BATCH, help="Samples per weight update (default: the recipe's reference).")),
        ("local_batch", click.option("--local-batch", type=t.BATCH, help="Samples per replica per micro step.")),
        ("grad_accum", click.option("--grad-accum", type=t.GRAD_ACCUM, help="Micro batches accumulated per weight update (GA).")),
        ("instances_per_host", click.option("--instances-per-host", type=t.PER_HOST, help="Instances per host (default: the cluster spec's, 1).")),
        ("devices_per_host", click.option("--devices-per-host", type=t.PER_HOST, help="Devices per host (default: the cluster spec's).")),
        ("hosts_opt", click.option("--hosts", "hosts_opt", help="Comma-separated hosts (h1,h2 or h1:4,h2:4) instead of the cluster's.")),
        ("hostfile", click.option("--hostfile", type=click.Path(dir_okay=False), help="Hostfile (Open MPI 'host slots=N' or one host per line).")),
    ]
    for name, opt in reversed(opts):
        if batch or name not in BATCH_OPTION_NAMES:
            f = opt(f)
    return f


PLAN_OPTION_NAMES = ("pod", "cluster", "nodes", "global_batch", "local_batch", "grad_accum",
                     "instances_per_host", "devices_per_host", "hosts_opt", "hostfile")

POD_SIZES = (16, 64, 128, 256)


def pop_plan_options(kwargs: dict) -> dict:
    """Split the plan options out of a command's kwargs."""
    return {k: kwargs.pop(k) for k in PLAN_OPTION_NAMES if k in kwargs}


def resolve_plan(recipe: str | None, **options):
    """Load specs, pick hosts, and plan. Returns (plan, cluster_spec, recipe_spec_or_None)."""
    plan, spec, rspec, _ = resolve_plan_with_source(recipe, **options)
    return plan, spec, rspec


def resolve_plan_with_source(recipe: str | None, **options):
    """Load specs, pick hosts (podrun.specs.allocation), and plan.

    Returns (plan, cluster_spec, recipe_spec_or_None, host_source); the allocation, when there is
    one, is discovered once here and is host_source.discovered.
    """
    from podrun.plan import make_plan

    spec, rspec, src, ov = resolve_plan_inputs(recipe, **options)
    return make_plan(spec, rspec, ov), spec, rspec, src


def resolve_plan_inputs(recipe: str | None, *, pod=None, cluster=None, nodes=None, global_batch=None,
                        local_batch=None, grad_accum=None, instances_per_host=None, devices_per_host=None,
                        hosts_opt=None, hostfile=None, environ=None, discovered=None):
    """Load specs and pick hosts: (cluster_spec with the hosts, recipe_spec_or_None, host_source, Overrides).
    ``discovered``: the allocation, when the caller has already looked for it (no second look)."""
    from podrun.plan import Overrides
    from podrun.specs import load_cluster, load_recipe
    from podrun.specs.allocation import host_source, hosts_for_cluster

    if pod is not None and cluster is not None:
        raise PlanError("give either --pod or --cluster, not both")
    if pod is not None:
        if pod not in POD_SIZES:
            raise PlanError(f"--pod {pod}: IPU-PODs come in 16, 64, 128 and 256 IPUs", hint="use --pod 16|64|128|256 or --cluster")
        cluster = f"ipu-pod{pod}"
    spec = load_cluster("local" if cluster is None else cluster)
    rspec = load_recipe(recipe) if recipe is not None else None
    src = host_source(spec, hosts_opt, hostfile, environ, discovered)
    spec, devices_per_host = hosts_for_cluster(spec, src, devices_per_host=devices_per_host, nodes=nodes,
                                               spec_named=cluster is not None)
    return spec, rspec, src, Overrides(
        nodes=nodes, global_batch=global_batch, local_batch=local_batch, grad_accum=grad_accum,
        instances_per_host=instances_per_host, devices_per_host=devices_per_host,
    )
