"""Plan options shared by plan/launch/script/hosts, and resolving them into a Plan (hosts from the right source)."""
from __future__ import annotations

import os
from dataclasses import dataclass

import click

from podrun.errors import HostError, PlanError


def plan_options(f):
    """The options that shape a plan; every command that builds one takes them."""
    opts = [
        click.option("--pod", type=int, help="Shorthand for --cluster ipu-podN (16, 64, 128, 256)."),
        click.option("--cluster", "cluster", help="Cluster spec: a name in cluster_specs/ or a YAML path (default: local, or the scheduler's allocation)."),
        click.option("--nodes", type=int, help="Use the first N hosts of the cluster."),
        click.option("--global-batch", type=int, help="Samples per weight update (default: the recipe's reference)."),
        click.option("--local-batch", type=int, help="Samples per replica per micro step."),
        click.option("--grad-accum", type=int, help="Micro batches accumulated per weight update (GA)."),
        click.option("--instances-per-host", type=int, help="Instances per host (default 1)."),
        click.option("--devices-per-host", type=int, help="Devices per host (default: the cluster spec's)."),
        click.option("--hosts", "hosts_opt", help="Comma-separated hosts (h1,h2 or h1:4,h2:4) instead of the cluster's."),
        click.option("--hostfile", type=click.Path(dir_okay=False), help="Hostfile (Open MPI 'host slots=N' or one host per line)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


PLAN_OPTION_NAMES = ("pod", "cluster", "nodes", "global_batch", "local_batch", "grad_accum",
                     "instances_per_host", "devices_per_host", "hosts_opt", "hostfile")


def pop_plan_options(kwargs: dict) -> dict:
    """Split the plan options out of a command's kwargs."""
    return {k: kwargs.pop(k) for k in PLAN_OPTION_NAMES if k in kwargs}


@dataclass(frozen=True)
class HostSource:
    hosts: tuple            # tuple[HostEntry, ...]
    source: str             # "--hosts", "--hostfile FILE", "SLURM_JOB_NODELIST", "cluster spec NAME"
    scheduler: str = "none"


def host_source(cluster, hosts_opt=None, hostfile=None, environ=None) -> HostSource:
    """Where the hosts come from: --hosts, --hostfile, the scheduler's allocation, else the cluster spec."""
    from podrun.specs.hosts import HostEntry, parse_hostfile, parse_hosts_option

    if hosts_opt and hostfile:
        raise HostError("give either --hosts or --hostfile, not both")
    if hosts_opt:
        return HostSource(parse_hosts_option(hosts_opt), "--hosts")
    if hostfile:
        return HostSource(parse_hostfile(hostfile), f"--hostfile {hostfile}")
    environ = os.environ if environ is None else environ
    try:
        from podrun.jobscript.discover import discover
    except ImportError:
        discover = None
    found = discover(environ) if discover else None
    if found is not None:
        return HostSource(tuple(found.hosts), found.source, found.scheduler)
    return HostSource(tuple(HostEntry(h) for h in cluster.hosts), f"cluster spec {cluster.name}")


def resolve_plan(recipe: str | None, **options):
    """Load specs, pick hosts, and plan. Returns (plan, cluster_spec, recipe_spec_or_None)."""
    plan, spec, rspec, _ = resolve_plan_with_source(recipe, **options)
    return plan, spec, rspec


def resolve_plan_with_source(recipe: str | None, **options):
    """Load specs, pick hosts, and plan. Returns (plan, cluster_spec, recipe_spec_or_None, host_source)."""
    from podrun.plan import make_plan

    spec, rspec, src, ov = resolve_plan_inputs(recipe, **options)
    return make_plan(spec, rspec, ov), spec, rspec, src


def resolve_plan_inputs(recipe: str | None, *, pod=None, cluster=None, nodes=None, global_batch=None,
                        local_batch=None, grad_accum=None, instances_per_host=None, devices_per_host=None,
                        hosts_opt=None, hostfile=None, environ=None):
    """Load specs and pick hosts: (cluster_spec with the hosts, recipe_spec_or_None, host_source, Overrides)."""
    from podrun.plan import Overrides
    from podrun.specs import load_cluster, load_recipe

    if pod is not None and cluster is not None:
        raise PlanError("give either --pod or --cluster, not both")
    if pod is not None:
        if pod not in (16, 64, 128, 256):
            raise PlanError(f"--pod {pod}: IPU-PODs come in 16, 64, 128 and 256 IPUs", hint="use --pod 16|64|128|256 or --cluster")
        cluster = f"ipu-pod{pod}"
    spec = load_cluster(cluster or "local")
    rspec = load_recipe(recipe) if recipe else None
    src = host_source(spec, hosts_opt, hostfile, environ)
    explicit_hosts = src.source != f"cluster spec {spec.name}"
    if explicit_hosts:
        slots = {e.slots for e in src.hosts if e.slots is not None}
        if len(slots) > 1:
            raise HostError(f"{src.source}: hosts have different slot counts {sorted(slots)}",
                            hint="podrun places the same number of devices on every host")
        dph = devices_per_host or spec.devices_per_host
        if slots and devices_per_host is None and cluster is None and pod is None:
            dph = slots.pop()          # an allocation or hostfile with no cluster spec: trust its slots
        elif slots and slots != {dph}:
            raise HostError(
                f"{src.source} gives {sorted(slots)[0]} slots per host but the plan needs {dph} devices per host "
                f"(cluster {spec.name})",
                hint="fix the slots in the hostfile, or pass --devices-per-host to match it",
            )
        hosts = tuple(e.name for e in src.hosts)
        if nodes is not None and nodes > len(hosts):
            raise HostError(
                f"the plan asks for {nodes} hosts but {src.source} gives only {len(hosts)}",
                hint=f"use --nodes {len(hosts)} or fewer",
            )
        spec = spec.with_hosts(hosts, dph)
        devices_per_host = dph
    return spec, rspec, src, Overrides(
        nodes=nodes, global_batch=global_batch, local_batch=local_batch, grad_accum=grad_accum,
        instances_per_host=instances_per_host, devices_per_host=devices_per_host,
    )
