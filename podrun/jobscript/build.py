"""From a plan to a JobRequest: the `podrun launch` argv that reproduces the plan, and allocation checks."""
from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from typing import Mapping, Sequence

from podrun import pystart
from podrun.errors import HostError, PodrunError
from podrun.jobscript.job import JobAsk, JobRequest, JobScriptError, check_directive_value, check_scheduler, validate
from podrun.launch.engines import EngineKind, engine_of
from podrun.launch.transports import TRANSPORTS
from podrun.plan.inputs import PlanOptions
from podrun.specs.allocation import Discovered
from podrun.specs.cluster import JobsSpec


@dataclass(frozen=True)
class JobOptions(JobAsk):
    """What a job script is asked for beside its plan: the scheduler and its directives (JobAsk), the job's
    environment, and what its `podrun launch` runs (`podrun script` and `podrun submit` build one from their
    options)."""

    python: str                                 # the interpreter the job runs `podrun launch` with
    recipe: str | None = None                   # None: a script (``script``) or a command (``args``)
    args: Sequence[str] = ()
    script: str | None = None                   # a Python script the job's launch runs with ``args`` (as launch does)
    cluster: str | None = None                  # the --cluster the job's podrun launch is given
    job_name: str | None = None                 # None: podrun-<recipe>
    env: Mapping[str, str] | Sequence[tuple[str, str]] = ()
    transport: str | None = None                # None: the scheduler's (its Scheduler.transport)
    ssh_config: str | None = None
    cpu_bind: str | None = None                 # the job's podrun launch --cpu-bind (None: its default)
    launch_options: Sequence[str] = ()          # more options for the job's podrun launch
    engine: str | None = None                   # None: poprun for an IPU plan (the IPU-POD specs'), else torch
    vipu_server_host: str | None = None         # poprun's V-IPU controller (or $IPUOF_VIPU_API_HOST)
    vipu_partition: str | None = None           # poprun's V-IPU partition (or $IPUOF_VIPU_API_PARTITION_ID)
    site: JobsSpec | None = None                # the cluster spec's jobs block, for a job of its own scheduler
    site_name: str | None = None                # that spec's name (the script's comments say where a value is from)

def plan_hosts(plan) -> int:
    """Distinct hosts of the plan (several instances may share one host)."""
    return len(dict.fromkeys(plan.hosts))


def default_job_name(plan) -> str:
    """podrun-<recipe>, restricted to characters every scheduler accepts in a job name."""
    base = re.sub(r"[^A-Za-z0-9_.\-]+", "-", str(plan.recipe or "command")).strip("-.") or "command"
    return f"podrun-{base}"[:64]


def launch_argv(plan, *, python: str, recipe: str | None, transport: str | None, cluster: str | None = None,
                args: Sequence[str] = (), launch_options: Sequence[str] = (), script: str | None = None) -> list[str]:
    """`podrun launch` inside the allocation, pinned to the same plan: the same cluster spec,
    hosts count, devices per host, instances per host, and (for a recipe) global batch, local batch
    and GA. PYTHON is the interpreter whose podrun wrote the script (the CLI passes sys.executable),
    so the job needs no podrun on PATH, nor an activated virtualenv. It runs podrun as `PYTHON -m podrun launch`
    would, but started as a safe helper (`PYTHON -c BOOT launch`, podrun.pystart): the job runs in its working
    directory, often a shared one, and `-m` would import a `podrun/` found there first; the boot drops it from
    the path, and PYTHON finds its own podrun. The hosts themselves come from
    the scheduler's env when the job runs. ``transport`` None: no --transport (an engine that starts the
    instances itself, poprun). ``script``: a Python script, followed by its ``args`` as `podrun launch SCRIPT ARGS`
    takes them."""
    argv = pystart.safe(python, "launch", module="podrun", root=None)
    argv += [] if transport is None else ["--transport", transport]
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
    if script is not None:
        return argv + [script, *args]
    if recipe is not None:
        argv.append(recipe)
    if args:
        argv += ["--", *args]
    return argv


def plan_comments(plan, script: str | None = None) -> tuple[str, ...]:
    """'# plan: ...' lines written under the directives, so the script says what it will run (``script``: the
    Python script it runs, where it runs no recipe)."""
    n = plan_hosts(plan)
    what = f"recipe {plan.recipe}" if plan.recipe else f"script {script}" if script is not None else "a command"
    return (
        f"plan: cluster {plan.cluster}, " + what
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
    and a body that runs `podrun launch` (launch_argv) with the same plan (with ``--ssh-config`` when
    given, and ``--env NAME`` for each of ``env`` unless the transport is srun: the script exports the value).
    What the cluster asks of its jobs (``job.site``: its spec's jobs block) fills what the options leave: Grid
    Engine's resource or PE, the queue, the directives ssh between the nodes needs; each one the script takes
    from the spec is said in a comment. Validated (JobScriptError on bad values)."""
    env_items = tuple(job.env.items()) if isinstance(job.env, Mapping) else tuple(job.env)
    given = job
    job = with_site(job)
    engine = engine_of(job.engine or ("poprun" if plan.device_kind.startswith("ipu") else "torch"))
    transport = job_transport(job, engine)
    extra: list[str] = [] if transport is not None else poprun_options(job)
    if job.ssh_config is not None:
        extra += ["--ssh-config", job.ssh_config]
    if job.cpu_bind is not None:       # refused now (exit 2) as the job's launch would refuse it
        from podrun.launch.request import decide_cpu_bind
        from podrun.specs import load_cluster

        decide_cpu_bind(job.cpu_bind, plan, load_cluster(job.cluster).cpu if job.cluster else None, here=False,
                        spec=job.cluster or "")
        extra += ["--cpu-bind", job.cpu_bind]
    if transport not in TRANSPORTS or not TRANSPORTS[transport].passes_env:
        # the script's exports reach the job's first host only; ssh and mpirun start the other
        # hosts' workers from a fresh environment, so podrun launch carries them there (srun
        # propagates the job's environment itself). By name only: podrun launch takes each value from
        # its environment (the export above it), so no value is on its command line while the job runs
        for k, _ in env_items:
            extra += ["--env", k]
    shared = {f.name: getattr(job, f.name) for f in fields(JobAsk)}
    kind = plan.device_kind.split("-", 1)[0]          # 'gpu-v100' -> 'gpu', 'ipu-gc200' -> 'ipu', 'cpu' -> 'cpu'
    command = launch_argv(plan, python=job.python, recipe=job.recipe, transport=transport, cluster=job.cluster,
                          args=job.args, launch_options=[*extra, *job.launch_options], script=job.script)
    site, ssh = job.site or JobsSpec(), ssh_between_nodes(transport, job.scheduler)
    site_directives = tuple(d for d in site.ssh_directives if d not in job.directives) if ssh else ()
    queue = job.queue or job.partition
    typed = queue is not None and queue in site.typed_queues
    req = JobRequest(**{**shared, "job_name": job.job_name or default_job_name(plan), "nodes": plan_hosts(plan),
                        "devices_per_node": plan.devices_per_host, "device_kind": kind,
                        "command": tuple(command), "env": env_items,
                        "comments": (*plan_comments(plan, job.script),
                                     *site_comments(given, job, plan, site_directives, typed)),
                        "site_directives": site_directives, "queue_sets_node": typed,
                        "ssh_port": site.ssh_port if ssh and TRANSPORTS[transport].ssh_per_host else None,
                        "launch_transport": transport, "agents_per_node": plan.instances_per_host})
    return validate(req)


def with_site(job: JobOptions) -> JobOptions:
    """``job`` with what its cluster spec's jobs block (``job.site``) gives where the options say nothing: Grid
    Engine's resource or PE (a JobScriptError, exit 2, naming the spec when neither says one), the queue."""
    site = job.site or JobsSpec()
    if job.scheduler == "uge" and job.pe is None and job.resource is None:
        if site.pe is None and site.resource is None:
            where = (f"cluster spec {job.site_name} names none for Grid Engine (jobs.pe, jobs.resource)"
                     if job.site_name else "no --cluster names one (a spec's jobs.pe or jobs.resource)")
            raise JobScriptError(f"a Grid Engine job asks for its nodes with a parallel environment or a resource: "
                                 f"{where}, and neither --pe nor --resource was given",
                                 hint="pass --pe PE (`-pe PE N`, one slot per host) or --resource NAME (`-l NAME=N`, "
                                      "N whole nodes), or add jobs: {pe: PE} to the cluster spec "
                                      "(docs/cluster-specs.md)")
        job = replace(job, pe=site.pe) if site.pe is not None else replace(job, resource=site.resource)
    if job.queue is None and job.partition is None and site.queue is not None:
        job = replace(job, queue=site.queue) if job.scheduler != "slurm" else replace(job, partition=site.queue)
    return job


def site_comments(given: JobOptions, job: JobOptions, plan, site_directives: tuple[str, ...],
                  typed: bool) -> tuple[str, ...]:
    """A comment for each request the script takes from the cluster spec (``job.site``, where the options
    (``given``) said nothing), naming the spec's field."""
    name, n = job.site_name, plan_hosts(plan)
    if name is None:
        return ()
    out = []
    if job.resource is not None and given.resource is None and given.pe is None:
        out.append(f"{job.resource}={n}: {n} whole node(s) of {plan.devices_per_host} {plan.device_kind} each, the "
                   f"resource cluster spec {name} names (jobs.resource)")
    if job.pe is not None and given.pe is None and given.resource is None:
        out.append(f"-pe {job.pe} {n}: the parallel environment cluster spec {name} names (jobs.pe), one slot per host")
    queue = job.queue or job.partition
    if queue is not None and given.queue is None and given.partition is None:
        out.append(f"queue {queue}: cluster spec {name}'s default (jobs.queue)")
    if typed:
        out.append(f"queue {queue} sets each node's CPUs and GPUs itself (cluster spec {name}: jobs.typed_queues)")
    if site_directives:
        out.append(f"{', '.join(site_directives)}: the job's launch reaches its nodes over ssh (cluster spec {name}: "
                   "jobs.ssh_directives)")
    return tuple(out)


def ssh_between_nodes(transport: str | None, scheduler: str) -> bool:
    """Whether a job's launch reaches its other nodes over ssh: a transport that holds an ssh connection per host,
    or mpirun under PBS, whose Open MPI starts its daemons over ssh unless it was built with PBS's TM interface
    (inside Slurm Open MPI starts them with srun, inside Grid Engine with qrsh)."""
    kind = TRANSPORTS.get(transport)
    return kind is not None and (kind.ssh_per_host or (kind.ssh_daemons and scheduler == "pbs"))


def job_transport(job: JobOptions, engine: EngineKind) -> str | None:
    """How the job's podrun launch starts its instances: --transport; else None for an engine that starts them
    itself (poprun); a Grid Engine job asking a resource (ABCI's `-l rt_F=N`), Open MPI's tight integration (mpirun
    through `qrsh -inherit`: no ssh between the job's nodes); else the scheduler's (Slurm's srun, PBS's mpirun, ssh
    under a Grid Engine PE). A --transport beside poprun is refused (exit 2)."""
    if engine.transport is not None and TRANSPORTS[engine.transport].engine_only:
        if job.transport is not None and job.transport != engine.transport:
            raise JobScriptError(f"--transport {job.transport}: {engine.name} starts the instances of the job itself "
                                 "(an IPU-POD's poprun), so the job's podrun launch takes no transport",
                                 hint=f"drop --transport (the script runs `podrun launch` with {engine.name})")
        return None
    if job.transport is not None:
        return job.transport
    return "mpirun" if job.scheduler == "uge" and job.resource is not None else check_scheduler(job.scheduler).transport


def poprun_options(job: JobOptions) -> list[str]:
    """The job's podrun launch options for poprun: the V-IPU server host and partition, from the options (the CLI
    fills them from IPUOF_VIPU_API_HOST / IPUOF_VIPU_API_PARTITION_ID), else the cluster spec's `vipu` block
    (which the job's podrun launch reads itself); a JobScriptError (exit 2) before the script is written when
    neither says them: poprun would fail when the job starts."""
    from podrun.launch.engines.poprun import PoprunOptions, check_vipu, resolve_vipu
    from podrun.specs import load_cluster

    given = PoprunOptions(vipu_server_host=job.vipu_server_host, vipu_partition=job.vipu_partition)
    found, _ = resolve_vipu(given, {}, load_cluster(job.cluster) if job.cluster else None)
    try:
        check_vipu(found, f"the {job.scheduler} script's podrun launch")
    except PodrunError as exc:
        raise JobScriptError(exc.message, hint=exc.hint) from None
    out = []
    for flag, value in (("--vipu-server-host", given.vipu_server_host), ("--vipu-partition", given.vipu_partition)):
        if value is not None:
            out += [flag, check_directive_value(flag, value)]
    return out


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
