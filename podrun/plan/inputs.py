"""The inputs of a plan from a command's options: the cluster spec with its hosts, the recipe, the host source, the overrides."""
from __future__ import annotations

from podrun.errors import PlanError

POD_SIZES = (16, 64, 128, 256)


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
