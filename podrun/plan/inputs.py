"""The inputs of a plan from a command's options: the cluster spec with its hosts, the recipe, the host source, the overrides."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Mapping

from podrun.errors import PlanError
from podrun.plan import Overrides

POD_SIZES = (16, 64, 128, 256)


@dataclass(frozen=True)
class PlanOptions(Overrides):
    """The options that shape a plan (podrun.cli.options.plan_options) as given: the planner's Overrides and where
    the hosts come from; None is not given."""

    pod: int | None = None
    cluster: str | None = None
    hosts_opt: str | None = None                # --hosts
    hostfile: str | None = None
    environ: Mapping[str, str] | None = None    # where an allocation is looked for (None: os.environ)


def resolve_plan_inputs(recipe: str | None, options: PlanOptions = PlanOptions(), discovered=None):
    """Load specs and pick hosts: (cluster_spec with the hosts, recipe_spec_or_None, host_source, Overrides).
    ``discovered``: the allocation, when the caller has already looked for it (no second look)."""
    from podrun.specs import load_cluster, load_recipe
    from podrun.specs.allocation import host_source, hosts_for_cluster

    o, cluster = options, options.cluster
    if o.pod is not None and cluster is not None:
        raise PlanError("give either --pod or --cluster, not both")
    if o.pod is not None:
        if o.pod not in POD_SIZES:
            raise PlanError(f"--pod {o.pod}: IPU-PODs come in 16, 64, 128 and 256 IPUs",
                            hint="use --pod 16|64|128|256 or --cluster")
        cluster = f"ipu-pod{o.pod}"
    spec = load_cluster("local" if cluster is None else cluster)
    rspec = load_recipe(recipe) if recipe is not None else None
    src = host_source(spec, o.hosts_opt, o.hostfile, o.environ, discovered)
    spec, devices_per_host = hosts_for_cluster(spec, src, devices_per_host=o.devices_per_host, nodes=o.nodes,
                                               spec_named=cluster is not None)
    ov = Overrides(**{f.name: getattr(o, f.name) for f in fields(Overrides)})
    return spec, rspec, src, replace(ov, devices_per_host=devices_per_host)
