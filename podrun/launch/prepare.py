"""From `podrun launch`'s parsed options to what runs: the target, the plan, the LaunchRequest and the elastic policy."""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from podrun.errors import LaunchError, PodrunError, PreflightError
from podrun.launch import rlimits
from podrun.launch.engines import engine_of, resolve_engine
from podrun.launch.options import LaunchOptions
from podrun.launch.request import LaunchRequest, decide_cpu_bind, parse_env_options
from podrun.launch.run import build_request, default_transport, is_local_host
from podrun.launch.torchrun_cli import COMMAND, RECIPE, SCRIPT, Target, classify, command_hint
from podrun.launch.torchrun_map import OwnOptions, check_nproc_kind, reconcile
from podrun.launch.transports import transport_of
from podrun.plan import make_plan
from podrun.plan.inputs import resolve_plan_inputs
from podrun.plan.measured import launch_measured
from podrun.rundir.layout import DEFAULT_RUNS_DIR, new_run_id
from podrun.specs import recipe_args as recipe_cli
from podrun.wire.liveness import settings
from podrun.wire.probe import interface_address, missing_modules, missing_text
from podrun.wire.worker_env import RDZV_ID_ENV, ROLE_ENV, VIRTUAL_LOCAL_RANK_ENV, workers_per_instance

if TYPE_CHECKING:  # pragma: no cover
    from podrun.elastic.replan import ElasticPolicy
    from podrun.launch.transports import TransportKind
    from podrun.specs import ClusterSpec, RecipeSpec


@dataclass(frozen=True)
class Prepared:
    """A launch ready to print (--dry-run) or run."""

    request: LaunchRequest
    target: Target
    engine: str                         # torch | poprun | horovod
    elastic: ElasticPolicy | None = None
    notes: tuple[str, ...] = ()         # what podrun decided for the user, said before the run and in --dry-run
    long_run: str | None = None         # the estimate of a run longer than LONG_RUN_HOURS, said before it starts
    local_ranks: frozenset[int] | None = None   # --local-ranks-filter: the local ranks the console shows
    cluster: ClusterSpec | None = None  # the cluster the plan was made on
    recipe: RecipeSpec | None = None    # None for a script or command


def prepare_launch(opts: LaunchOptions) -> Prepared:
    """Everything `podrun launch` decides before it prints or runs: the target (podrun.launch.torchrun_cli),
    torchrun's options reconciled with podrun's, the plan, the checks of this machine, the request, the elastic
    policy and what to say first; a PodrunError (exit 2) for anything wrong, before anything starts, in the
    user's words (a podrun option that a torchrun option set is named as the user wrote it)."""
    tg, net, rs, out = opts.target, opts.transports, opts.restarts, opts.output
    target = classify(list(tg.args), dashdash=tg.dashdash, module=tg.module, no_python=tg.no_python,
                      run_path=tg.run_path, is_recipe_dir=lambda p: os.path.isfile(os.path.join(p, "recipe.yaml")),
                      is_file=os.path.isfile, option_names=tg.option_names)
    if target.kind == RECIPE and not tg.dashdash:
        refuse_own_options_after_recipe(target, list(tg.args[1:]), tg.option_names)
    own = OwnOptions(devices_per_host=opts.plan.devices_per_host, nodes=opts.plan.nodes,
                     elastic_min=rs.elastic_min, max_restarts=rs.max_restarts, master_addr=net.master_addr,
                     master_port=net.master_port, run_id=out.run_id, runs_dir=out.runs_dir, grace=net.grace,
                     heartbeat=net.heartbeat, heartbeat_misses=net.heartbeat_misses, cpu_bind=net.cpu_bind)
    mapped = reconcile(opts.torchrun, own, cpu_count=os.cpu_count() or 1, pet_own=opts.pet_own)
    try:
        return _prepare(opts, target, mapped)
    except PodrunError as exc:
        raise mapped.in_user_words(exc) from None


def _prepare(opts: LaunchOptions, target: Target, mapped: OwnOptions) -> Prepared:
    """prepare_launch's part after torchrun's options are mapped (``mapped``), step by step: the plan, the recipe's
    arguments, the engine and the transport, the checks of this machine, the elastic policy, then the request,
    built once (--dry-run prints the very request that runs)."""
    notes: list[str] = []
    cluster, rspec, src, overrides, elastic_min = _plan_inputs(opts, target, mapped, notes)
    check_nproc_kind(opts.torchrun, cluster.device.kind, cluster.name)
    out, net = opts.output, opts.transports
    measured, calibration_notes = launch_measured(opts.calibration, cluster, rspec, overrides,
                                                  out.runs_dir if out.runs_dir is not None else DEFAULT_RUNS_DIR)
    plan = make_plan(cluster, rspec, overrides, measured)
    recipe = _recipe_run(target, rspec, plan, out.dry_run)
    eng = _engine(opts, cluster)
    name = eng.transport or net.transport or default_transport(plan, cluster, getattr(src, "scheduler", "none"))
    kind = transport_of(name)
    data_interface = net.data_interface if net.data_interface is not None else cluster.data_interface or None
    if not kind.remote:
        _check_this_machine(opts, target, rspec, recipe, data_interface, cluster)
    notes += [*calibration_notes, *recipe.notes, *eng.notes]
    if kind.ssh_per_host:
        notes += _this_machine_over_ssh(plan)
    mpi_ranks, liveness = _heard(opts, mapped, cluster, plan, kind, eng)
    elastic, max_restarts = _elastic(opts, mapped, (cluster, rspec, overrides, plan), elastic_min, kind, eng, notes)
    if out.only_output_from_instance is not None and not 0 <= out.only_output_from_instance < plan.instances:
        raise LaunchError(f"--only-output-from-instance {out.only_output_from_instance}: the plan has instances "
                          f"0..{plan.instances - 1}")
    request = _request(opts, mapped, target, (cluster, plan, kind, name), recipe, eng, (mpi_ranks, liveness),
                       max_restarts, data_interface, notes)
    # this machine's process limits against the run's size, before anything starts (and in --dry-run, which says
    # what a real launch would refuse): a soft limit raised is said with the notes
    rlimits.ensure(*rlimits.run_size(request), notes.append)
    if not out.dry_run:
        engine_of(eng.engine).require()                                 # horovod: importable here
    return Prepared(request=request, target=target, engine=eng.engine, elastic=elastic, notes=tuple(notes),
                    long_run=recipe.long_run, cluster=cluster, recipe=rspec, local_ranks=mapped.local_ranks)


def _plan_inputs(opts: LaunchOptions, target: Target, mapped: OwnOptions, notes: list[str]):
    """The plan's inputs (cluster, recipe, source, overrides) and the elastic minimum left: torchrun's defaults
    for a script or command, and --nnodes MIN:MAX started on the hosts there are."""
    plan_opts = replace(opts.plan, nodes=mapped.nodes, devices_per_host=mapped.devices_per_host)
    cluster, rspec, src, overrides = resolve_plan_inputs(target.name if target.kind == RECIPE else None, plan_opts)
    if (target.kind != RECIPE and opts.torchrun.nproc_per_node is None and plan_opts.devices_per_host is None
            and plan_opts.cluster is None and plan_opts.pod is None and getattr(src, "scheduler", "none") == "none"
            and all(getattr(e, "slots", None) is None for e in getattr(src, "hosts", ()))):
        # torchrun's default for a script, a module or a command: one worker per host (a cluster spec, an
        # allocation, the slots of --hosts h:N or a hostfile, or a recipe's plan say otherwise)
        cluster, rspec, src, overrides = resolve_plan_inputs(None, replace(plan_opts, devices_per_host=1))
    elastic_min = mapped.elastic_min
    if elastic_min is not None and mapped.nodes is not None and opts.torchrun.nnodes is not None and \
            elastic_min <= len(cluster.hosts) < mapped.nodes:
        # torchrun's --nnodes MIN:MAX starts with the nodes that joined, MIN or more: here the hosts there are; at
        # MIN there is no host to lose, and the run is a plain one
        notes.append(f"{opts.torchrun.said('nnodes', opts.torchrun.nnodes)}: starting on the {len(cluster.hosts)} "
                     f"host(s) of cluster '{cluster.name}', as torchrun starts with the nodes that joined")
        overrides = replace(overrides, nodes=len(cluster.hosts))
        elastic_min = None if len(cluster.hosts) == elastic_min else elastic_min
    return cluster, rspec, src, overrides, elastic_min


@dataclass(frozen=True)
class _RecipeRun:
    """A recipe's train.py and its arguments as podrun read them (None: a script or command, or a recipe whose
    train.py parses its own), the estimate of a long run, and what to say of its data."""

    script: str | None = None
    args: object | None = None
    long_run: str | None = None
    notes: tuple[str, ...] = ()


def _recipe_run(target: Target, rspec, plan, dry_run: bool) -> _RecipeRun:
    if rspec is None:
        return _RecipeRun()
    script = os.path.abspath(os.path.join(rspec.path, rspec.train_script))
    args = recipe_cli.check_recipe(rspec, target.args)
    if args is None:
        return _RecipeRun(script)
    # its train.py runs podrun's recipe parser: podrun knows its arguments
    long_run = recipe_cli.long_run(target.args, args, plan, recipe_cli.LONG_RUN_HOURS)
    data_notice, refusal = recipe_cli.synthetic_data(target.args, args, plan, recipe_cli.LONG_RUN_HOURS)
    if refusal is not None and not dry_run:
        raise refusal
    notes = [data_notice] if data_notice is not None else []
    if refusal is not None:
        notes.append(f"a real launch refuses this: {refusal.message}; {refusal.hint}")
    return _RecipeRun(script, args, long_run, tuple(notes))


@dataclass(frozen=True)
class _Engine:
    """The engine that starts the instances, the transport it chooses (None: podrun's), its arguments."""

    engine: str
    transport: str | None
    poprun: object | None
    mpi_args: tuple[str, ...]
    notes: tuple[str, ...] = ()


def _engine(opts: LaunchOptions, cluster) -> _Engine:
    net, out = opts.transports, opts.output
    engine, engine_transport, poprun_opts, mpi_args = resolve_engine(
        opts.engine, cluster, only_output_from_instance=out.only_output_from_instance)
    if engine_transport is not None and net.transport and net.transport != engine_transport:
        raise LaunchError(f"--engine {engine} starts the instances itself; drop --transport {net.transport}")
    notes: tuple[str, ...] = ()
    if poprun_opts is not None:     # the V-IPU server and partition: an option, the POD job's environment, the spec
        from podrun.launch.engines.poprun import check_vipu, missing_vipu, resolve_vipu

        poprun_opts, _ = resolve_vipu(poprun_opts, os.environ, cluster)
        if not out.dry_run:
            check_vipu(poprun_opts, "--engine poprun")
        elif missing_vipu(poprun_opts):
            notes = (f"poprun has no {' and no '.join(missing_vipu(poprun_opts))}: on a POD this line fails "
                     "(a real launch refuses it)",)
    return _Engine(engine, engine_transport, poprun_opts, tuple(mpi_args), notes)


def _check_this_machine(opts: LaunchOptions, target: Target, rspec, recipe: _RecipeRun, data_interface, cluster):
    """A run on this machine: its target, interface, data and modules are here before anything starts."""
    net = opts.transports
    check_local_target(target, os.path.abspath(net.workdir or os.getcwd()))
    check_local_interface(data_interface, "--data-interface" if net.data_interface is not None else
                          f"data_interface in {cluster.path}")
    if recipe.args is not None:
        recipe_cli.check_local_data(os.path.basename(os.path.abspath(rspec.path)), recipe.args.data,
                                    os.path.abspath(net.workdir or os.getcwd()))
    if net.preflight and (recipe.args is not None or opts.target.needs):
        check_modules(net.host_python, target, recipe.args, opts.target.needs)


def _this_machine_over_ssh(plan) -> list[str]:
    here = [h for h in dict.fromkeys(plan.hosts) if is_local_host(h)]
    return [f"{', '.join(here)} is this machine: in a run with other hosts podrun reaches it over ssh like the "
            "others (one transport per run: the same preflight, keepalive and teardown everywhere), so it needs "
            "sshd and its host key in known_hosts"] if here else []


def _heard(opts: LaunchOptions, mapped: OwnOptions, cluster, plan, kind, eng: _Engine):
    """Whether the agents are one a worker under mpirun (--rank-from-env), and the liveness for the agents whose
    heartbeats the controller hears: one a host, or one a worker."""
    net = opts.transports
    mpi_ranks = kind.per_worker is not None and (engine_of(eng.engine).mpi_ranks or net.mpi_ranks)
    senders = plan.instances * workers_per_instance(plan) if mpi_ranks else len(set(plan.hosts))
    return mpi_ranks, settings(mapped.heartbeat, mapped.heartbeat_misses, net.keepalive,
                               spec_heartbeat=cluster.heartbeat, spec_misses=cluster.heartbeat_misses,
                               spec_source=cluster.path, hosts=senders)


def _elastic(opts: LaunchOptions, mapped: OwnOptions, planned, elastic_min: int | None, kind, eng: _Engine,
             notes: list[str]) -> tuple[ElasticPolicy | None, int | None]:
    """The elastic policy (None: a plain run) and the restarts: --max-restarts, or one per host it can lose."""
    cluster, rspec, overrides, plan = planned
    rs, max_restarts = opts.restarts, mapped.max_restarts
    if elastic_min is None:
        if rs.spare_hosts is not None:
            raise LaunchError("--spare-hosts takes effect only in an elastic run", hint="add --elastic MIN")
        return None, max_restarts
    from podrun.elastic.replan import default_restarts, make_policy

    elastic = make_policy(cluster, rspec, overrides, plan, elastic_min, rs.spare_hosts,
                          max_restarts=max_restarts, engine=None if eng.transport is None else eng.engine,
                          transport_refusal=replan_refusal(kind))
    if max_restarts is None:
        max_restarts = default_restarts(elastic, plan)
        notes.append(f"--elastic {elastic_min} without --max-restarts: {max_restarts} restart(s), one per "
                     f"host the run can lose ({len(plan.hosts)} host(s) + {len(elastic.spares)} spare(s) - "
                     f"minimum {elastic_min}); --max-restarts N sets another count")
    return elastic, max_restarts


def _request(opts: LaunchOptions, mapped: OwnOptions, target: Target, placed, recipe: _RecipeRun, eng: _Engine,
             heard, max_restarts: int | None, data_interface: str | None, notes: list[str]) -> LaunchRequest:
    """The request, built once from what was decided: the agents' start (warm, one per worker under mpirun), the
    CPU binding, the modules every host checks, the variables, the run directory."""
    cluster, plan, kind, name = placed
    mpi_ranks, liveness = heard
    net, rs = opts.transports, opts.restarts
    env = parse_env_options(net.env_items) + launch_names(mapped) + \
        (((VIRTUAL_LOCAL_RANK_ENV, "1"),) if opts.torchrun.virtual_local_rank else ())
    needs: tuple[str, ...] = ()
    if net.preflight:             # checked by every held agent (ssh) before anything starts
        needs = tuple(dict.fromkeys((*recipe_cli.needed_modules(recipe.args), *opts.target.needs)
                                    if recipe.args is not None else opts.target.needs))
    restarts = 0 if max_restarts is None else max_restarts
    # its agents start each instance themselves: warm when a restart may follow, or (import once per host) when a
    # host runs several workers; agents that join (srun, mpirun but for --mpi-ranks, the copies) only for the latter
    several = workers_per_instance(plan) > 1
    kind = kind.for_request(mpi_ranks)
    warm = rs.warm and (kind.per_instance and (restarts > 0 or several) or kind.joined and several)
    bind, host_cores, bind_note = decide_cpu_bind(mapped.cpu_bind, plan, cluster.cpu, not kind.remote, cluster.path)
    notes += [bind_note] if bind_note is not None else []
    # --grace (torchrun's --shutdown-timeout) bounds both waits; without it each has its default (LaunchRequest's)
    grace = {} if mapped.grace is None else {"grace": mapped.grace, "interrupt_grace": mapped.grace}
    return build_request(plan, target.worker_command(net.host_python, recipe.script), transport=name, options=opts,
                         liveness=liveness, run_id=run_dir_name(mapped),
                         runs_dir=mapped.runs_dir if mapped.runs_dir is not None else DEFAULT_RUNS_DIR, env=env,
                         max_restarts=restarts, data_interface=data_interface, master_addr=mapped.master_addr,
                         master_port=mapped.master_port, **grace, mpi_args=eng.mpi_args, poprun=eng.poprun,
                         needs=needs, warm=warm, mpi_ranks=mpi_ranks, cpu_bind=bind, host_cores=host_cores,
                         rank_files=mapped.rank_files, join_address=check_join_address(net.join_address),
                         **({} if net.join_window is None else {"join_window": net.join_window}))


def replan_refusal(kind: TransportKind) -> LaunchError | None:
    """Why an elastic run cannot use the transport ``kind`` (None: it starts each attempt on the hosts left)."""
    if kind.replans:
        return None
    from podrun.launch.transports import TRANSPORTS

    can = " or ".join(k.name for k in TRANSPORTS.values() if k.replans and not k.engine_only)
    return LaunchError(f"--elastic re-plans each attempt on the hosts left, and the {kind.name} transport starts "
                       "every attempt on the same hosts", hint=f"use --transport {can}")


def launch_names(mapped: OwnOptions) -> tuple[tuple[str, str], ...]:
    """The launch's variables that carry --rdzv-id and --role to every agent, which sets the workers'
    TORCHELASTIC_RUN_ID and ROLE_NAME from them (podrun.wire.worker_env.launch_overrides)."""
    return tuple((name, value) for name, value in ((RDZV_ID_ENV, mapped.rdzv_id), (ROLE_ENV, mapped.role))
                 if value is not None)


def run_dir_name(mapped: OwnOptions) -> str | None:
    """The run directory's name: --run-id; with torchrun's --rdzv-id ID alone, ID-TIMESTAMP (torchrun's log dir
    is ID_RANDOM), so that one rendezvous id can name many runs; else None (a timestamp)."""
    if mapped.run_id is not None or mapped.rdzv_id is None:
        return mapped.run_id
    import re

    stem = re.sub(r"[^A-Za-z0-9._-]", "_", mapped.rdzv_id)[:64]
    if not stem[:1].isalnum():
        stem = "rdzv" + stem
    return f"{stem}-{new_run_id()}"


def check_join_address(text: str | None) -> str | None:
    """--join-address as given, once it reads (HOST or HOST:PORT); a LaunchError (exit 2) for one that does not."""
    from podrun.wire.join import parse_address

    if text is not None:
        try:
            parse_address(text)
        except ValueError as exc:
            raise LaunchError(f"--join-address {exc}", hint="write HOST or HOST:PORT (0 or none: a free port)") \
                from None
    return text


def check_local_target(target: Target, workdir: str) -> None:
    """On this machine, a script must exist in the working directory and a command's program must be found,
    before any worker starts (else every worker fails alike: exit 2 or 127 on every rank)."""
    if target.kind == SCRIPT and not os.path.isfile(os.path.join(workdir, target.name)):
        raise LaunchError(f"script {target.name} does not exist in the working directory {workdir}",
                          hint="give the script's path (relative to --workdir, or absolute)")
    if target.kind == COMMAND:
        problem = command_hint(target.name, workdir, on_path=lambda p: shutil.which(p) is not None,
                               is_file=os.path.isfile)
        if problem is not None:
            raise problem


def check_local_interface(ifname: str | None, where: str) -> None:
    """On this machine, the workers' network interface (GLOO_SOCKET_IFNAME) must exist and have an address,
    before any worker starts (else each fails inside gloo)."""
    if ifname is None:
        return
    import socket

    if interface_address(ifname) is not None:
        return
    names = sorted(n for _, n in socket.if_nameindex())
    have = "exists but has no address" if ifname in names else "does not exist"
    raise PreflightError([f"localhost: the interface {ifname} ({where}) {have} on this machine"],
                         hint=f"this machine's interfaces: {', '.join(names)}; give one of them, or leave "
                              "--data-interface out")


def check_modules(python: str, target: Target, recipe_args, needs: tuple[str, ...] = (),
                  host: str = "localhost") -> None:
    """The recipe's imports (podrun.specs.recipe_args.needed_modules, with ``recipe_args``) and ``needs`` must be there
    for --python on this machine, before anything starts: one paragraph and exit 2 naming the install command, not a
    traceback per rank."""
    wanted = (recipe_cli.needed_modules(recipe_args) if recipe_args is not None else []) + list(needs)
    missing = missing_modules(python, list(dict.fromkeys(wanted)))
    if missing:
        what = f"the recipe {target.name}" if recipe_args is not None else f"{target.name}"
        problem, hint = missing_text(python, missing, what)
        raise PreflightError([f"{host}: {problem}"], hint)


def refuse_own_options_after_recipe(target: Target, args, own: set[str]) -> None:
    """Arguments after the recipe go to its train.py; one that is an option of podrun launch was most likely
    meant for podrun (`recipes/x --dry-run` would otherwise start a real run): stop, unless a ``--`` before it
    says it is for train.py."""
    for arg in args:
        if arg == "--":
            return
        name = arg.split("=", 1)[0]
        if name in own:
            raise LaunchError(
                f"{arg!r} comes after the recipe {target.name!r}, so it would go to train.py, but it is an option "
                "of podrun launch",
                hint=f"put podrun's options before the recipe (podrun launch {name} ... {target.name}), or after -- "
                     f"to pass them to train.py on purpose (podrun launch {target.name} -- {arg})")
