"""From a plan to a JobRequest: the `podrun launch` argv that reproduces the plan, and allocation checks."""
from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from typing import Mapping, Sequence

from podrun.errors import HostError
from podrun.jobscript.job import JobRequest, check_scheduler, validate
from podrun.launch.transports import TRANSPORTS
from podrun.plan.inputs import PlanOptions
from podrun.specs.allocation import Discovered

__all__ = [
    "JobOptions", "plan_hosts", "launch_argv", "request_from_plan", "plan_comments", "default_job_name",
    "check_allocation", "allocation_plan_options",
]


@dataclass(frozen=True)
class JobOptions:
    """What a job script is asked for beside its plan: the scheduler and its directives, the job's environment,
    and what its `PYTHON -m podrun launch` runs (`podrun script` and `podrun submit` build one from their options)."""

    scheduler: str
    python: str                                 # the interpreter the job runs `-m podrun launch` with
    recipe: str | None = None                   # None: a command (``args``)
    args: Sequence[str] = ()
    cluster: str | None = None                  # the --cluster the job's podrun launch is given
    job_name: str | None = None                 # None: podrun-<recipe>
    time_limit: int | str | None = None
    partition: str | None = None
    queue: str | None = None
    group: str | None = None
    account: str | None = None
    log_dir: str | None = None
    output: str | None = None
    error: str | None = None
    modules: Sequence[str] = ()
    env: Mapping[str, str] | Sequence[tuple[str, str]] = ()
    workdir: str | None = None
    cpus_per_node: int | None = None
    transport: str | None = None                # None: the scheduler's (its Scheduler.transport)
    resource: str = "rt_F"
    pe: str | None = None
    directives: Sequence[str] = ()
    ssh_config: str | None = None
    launch_options: Sequence[str] = ()          # more options for the job's podrun launch


def plan_hosts(plan) -> int:
    """Distinct hosts of the plan (several instances may share one host)."""
    return len(dict.fromkeys(plan.hosts))


def default_job_name(plan) -> str:
    """podrun-<recipe>, restricted to characters every scheduler accepts in a job name."""
    base = re.sub(r"[^A-Za-z0-9_.\-]+", "-", str(plan.recipe or "command")).strip("-.") or "command"
    return f"podrun-{base}"[:64]


def launch_argv(plan, *, python: str, recipe: str | None, transport: str, cluster: str | None = None,
                args: Sequence[str] = (), launch_options: Sequence[str] = ()) -> list[str]:
    """`PYTHON -m podrun launch` inside the allocation, pinned to the same plan: the same cluster spec,
    hosts count, devices per host, instances per host, and (for a recipe) global batch, local batch
    and GA. PYTHON is the interpreter whose podrun wrote the script (the CLI passes sys.executable),
    so the job needs no podrun on PATH, nor an activated virtualenv. The hosts themselves come from
    the scheduler's env when the job runs."""
    argv = [python, "-m", "podrun", "launch", "--transport", transport]
    if cluster:
        argv += ["--cluster", cluster]
    argv += [
        "--nodes", str(plan_hosts(plan)),
        "--devices-per-host", str(plan.devices_per_host),
        "--instances-per-host", str(plan.instances_per_host),
    ]
    if recipe is not None:
        argv += [
            "--global-batch", str(plan.global_batch),
            "--local-batch", str(plan.local_batch),
            "--grad-accum", str(plan.grad_accum),
        ]
    argv += list(launch_options)
    if recipe is not None:
        argv.append(recipe)
    if args:
        argv += ["--", *args]
    return argv


def plan_comments(plan) -> tuple[str, ...]:
    """'# plan: ...' lines written under the directives, so the script says what it will run."""
    n = plan_hosts(plan)
    return (
        f"plan: cluster {plan.cluster}, " + (f"recipe {plan.recipe}" if plan.recipe else "a command")
        + f", {n} host(s) x {plan.devices_per_host} "
        f"{plan.device_kind} = {plan.devices} device(s)",
        f"plan: {plan.replicas} replica(s) x local batch {plan.local_batch} x GA {plan.grad_accum} "
        f"= global batch {plan.global_batch}; {plan.instances} instance(s), "
        f"{plan.devices_per_replica} device(s) per replica",
    )


def allocation_plan_options(options: PlanOptions, discovered: Discovered | None = None) -> PlanOptions:
    """Plan options for a job whose hosts are not known yet (no --cluster, --pod, --hosts or
    --hostfile, and no allocation ``discovered`` around this process): the cluster is what the
    scheduler will allocate, --nodes N hosts (default 1) of --devices-per-host workers each
    (default 1), planned with placeholder names alloc0..alloc<N-1> that the job replaces with its
    real hosts. The shell's own allocation variables are then not read (``environ`` is empty).
    Otherwise the options are returned unchanged. `podrun submit` passes no ``discovered``: the
    allocation it runs in (if any) is not the job's."""
    o = options
    if discovered is not None or o.cluster or o.pod is not None or o.hosts_opt or o.hostfile:
        return o
    n = 1 if o.nodes is None else o.nodes
    if n < 1:
        raise HostError(f"--nodes {n} must be at least 1")
    return replace(o, devices_per_host=1 if o.devices_per_host is None else o.devices_per_host,
                   hosts_opt=",".join(f"alloc{i}" for i in range(n)), environ={})


def request_from_plan(plan, job: JobOptions) -> JobRequest:
    """The JobRequest for a plan: nodes = the plan's hosts, devices per node = its devices per host,
    and a body that runs `PYTHON -m podrun launch` with the same plan (with ``--ssh-config`` when
    given, and ``--env NAME`` for each of ``env`` unless the transport is srun: the script exports the value).
    Validated (JobScriptError on bad values)."""
    env_items = tuple(job.env.items()) if isinstance(job.env, Mapping) else tuple(job.env)
    transport = job.transport or check_scheduler(job.scheduler).transport
    extra: list[str] = []
    if job.ssh_config is not None:
        extra += ["--ssh-config", job.ssh_config]
    if transport not in TRANSPORTS or not TRANSPORTS[transport].passes_env:
        # the script's exports reach the job's first host only; ssh and mpirun start the other
        # hosts' workers from a fresh environment, so podrun launch carries them there (srun
        # propagates the job's environment itself). By name only: podrun launch takes each value from
        # its environment (the export above it), so no value is on its command line while the job runs
        for k, _ in env_items:
            extra += ["--env", k]
    shared = {f.name: getattr(job, f.name) for f in fields(JobRequest) if hasattr(job, f.name)}
    kind = plan.device_kind.split("-", 1)[0]          # 'gpu-v100' -> 'gpu', 'ipu-gc200' -> 'ipu', 'cpu' -> 'cpu'
    command = launch_argv(plan, python=job.python, recipe=job.recipe, transport=transport, cluster=job.cluster,
                          args=job.args, launch_options=[*extra, *job.launch_options])
    req = JobRequest(**{**shared, "job_name": job.job_name or default_job_name(plan), "nodes": plan_hosts(plan),
                        "devices_per_node": plan.devices_per_host, "device_kind": kind,
                        "command": tuple(command), "env": env_items, "comments": plan_comments(plan)})
    return validate(req)


def check_allocation(plan, discovered: Discovered | None) -> None:
    """A plan needing more hosts than the scheduler allocated is a HostError naming both counts."""
    if discovered is None:
        return
    need, have = plan_hosts(plan), len(discovered.hosts)
    if need > have:
        raise HostError(
            f"the plan needs {need} host(s) but the {discovered.scheduler} allocation "
            f"({discovered.source}) has {have}: {', '.join(discovered.names[:8])}"
            + (" ..." if have > 8 else ""),
            hint=f"ask the scheduler for {need} nodes, or plan for at most {have} with --nodes {have}",
        )
