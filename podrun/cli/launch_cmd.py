"""`podrun launch`: parse, build the launch request, print it (--dry-run) or run and supervise it."""
from __future__ import annotations

import os
import sys

import click

from podrun.cli import types as t

from podrun.cli.options import plan_options, pop_plan_options
from podrun.cli.engine_options import engine_options, pop_engine_options
from podrun.cli.watch_options import pop_watch_options, watch_for, watch_options
from podrun.cli.network_options import network_options, pop_network_options

COLOURS = ("36", "33", "35", "32", "34", "31", "96", "93")


# --help's sections, in order; an option not named here is listed under the last one
HELP_SECTIONS = (
    ("Common options", ("module", "no_python", "pod", "cluster", "nodes", "hosts_opt", "hostfile", "devices_per_host",
                        "instances_per_host", "global_batch", "local_batch", "grad_accum", "elastic_min",
                        "max_restarts", "spare_hosts", "warm", "dry_run", "as_json", "env_items", "run_id", "runs_dir")),
    ("torchrun's options (docs/launch.md)", ("nproc_per_node", "nnodes", "standalone", "rdzv_endpoint", "rdzv_id",
                                             "node_rank", "log_dir", "redirects", "tee")),
    ("When a run hangs (docs/hangs.md)", ("hang_timeout", "on_hang")),
    ("Transports", ("transport", "ssh_client", "data_interface", "ssh_config", "no_host_key_check", "python_",
                    "workdir", "master_addr", "master_port", "agent_store", "max_concurrency", "heartbeat", "heartbeat_misses", "keepalive",
                    "no_preflight")),
    ("Engines (poprun, horovod)", ("engine", "mpi_args", "vipu_server_host", "vipu_partition", "vipu_cluster",
                                   "num_ilds", "mpi_global_args", "mpi_local_args", "print_topology", "offline_mode")),
    ("Advanced", ()),
)


class LaunchCommand(click.Command):
    """Records whether the user wrote ``-- TARGET`` (click drops a leading ``--``); --help in sections."""

    def parse_args(self, ctx, args):
        raw = args.count("--")
        ctx.meta["podrun.argv"] = list(args)
        rest = super().parse_args(ctx, list(args))
        ctx.meta["podrun.dashdash"] = raw > list(ctx.params.get("args") or ()).count("--")
        return rest

    def format_options(self, ctx, formatter):
        rows: dict[str, list] = {title: [] for title, _ in HELP_SECTIONS}
        section = {name: title for title, names in HELP_SECTIONS for name in names}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                rows[section.get(param.name, HELP_SECTIONS[-1][0])].append(record)
        for title, _ in HELP_SECTIONS:
            if rows[title]:
                with formatter.section(title):
                    formatter.write_dl(rows[title])


def torchrun_options(f):
    """torchrun's options, spelled as torchrun spells them (both - and _), mapped by podrun.launch.torchrun_args."""
    opts = [
        click.option("--nproc-per-node", "--nproc_per_node", "nproc_per_node", metavar="N|auto|cpu|gpu",
                     help="torchrun's: workers per host (podrun's --devices-per-host; auto: the cluster's).",),
        click.option("--nnodes", metavar="N|MIN:MAX", help="torchrun's: hosts (--nodes N); MIN:MAX: --nodes MAX "
                     "--elastic MIN."),
        click.option("--standalone", is_flag=True, help="torchrun's: one host, a free rendezvous port (--nodes 1 "
                     "--master-port 0)."),
        click.option("--rdzv-endpoint", "--rdzv_endpoint", "rdzv_endpoint", metavar="HOST[:PORT]",
                     help="torchrun's: --master-addr HOST --master-port PORT (default port 29400)."),
        click.option("--rdzv-id", "--rdzv_id", "rdzv_id", metavar="ID", help="torchrun's: --run-id ID."),
        click.option("--node-rank", "--node_rank", "node_rank", type=int, metavar="N",
                     help="torchrun's; refused: podrun places every host's instance itself."),
        click.option("--log-dir", "--log_dir", "log_dir", metavar="DIR", help="torchrun's: --runs-dir DIR."),
        click.option("-r", "--redirects", metavar="0", help="torchrun's: 0 only (podrun always shows output and "
                     "logs it in the run directory)."),
        click.option("-t", "--tee", metavar="0-3", help="torchrun's: accepted; podrun always writes both streams to "
                     "the console and the run directory."),
        click.option("-m", "--module", "module", is_flag=True, help="Run the target as a Python module "
                     "(--python -m MODULE ARGS), as torchrun's -m."),
        click.option("--no-python", "--no_python", "no_python", is_flag=True,
                     help="Run the target as a command, not with --python (as torchrun's --no-python)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


TORCHRUN_OPTION_NAMES = ("nproc_per_node", "nnodes", "standalone", "rdzv_endpoint", "rdzv_id", "node_rank", "log_dir",
                         "redirects", "tee")


@click.command(cls=LaunchCommand, context_settings={
    "ignore_unknown_options": True, "allow_extra_args": True, "allow_interspersed_args": False})
@plan_options
@torchrun_options
@engine_options
@watch_options
@network_options
@click.option("--transport", type=click.Choice(["local", "ssh", "mpirun", "srun"]),
              help="How instances start (default: local for this machine, srun in Slurm, else ssh).")
@click.option("--ssh-config", type=click.Path(dir_okay=False), help="OpenSSH client config (default ~/.ssh/config).")
@click.option("--no-host-key-check", is_flag=True, help="Accept unknown host keys (explicit opt-out of known_hosts).")
@click.option("--python", "python_", help="Python on the hosts (default: this one, sys.executable).")
@click.option("--workdir", help="Working directory on the hosts (default: the current directory).")
@click.option("--master-addr", "--master_addr", "master_addr", help="Rendezvous address (default: the host of instance 0).")
@click.option("--master-port", "--master_port", "master_port", type=t.PORT, default=None,
              help="Rendezvous port, every worker's MASTER_PORT. 0: podrun picks a free port (the default on this "
                   "machine, like torchrun --standalone); with hosts elsewhere the default is 29500.")
@click.option("--agent-store/--no-agent-store", "--store-relay/--no-store-relay", "agent_store", default=True,
              show_default=True,
              help="Rank 0's agent holds the rendezvous port from the start and serves torch's TCPStore on it "
                   "(TORCHELASTIC_USE_AGENT_STORE=True, as under torchrun), so no worker waits in torch's reconnect "
                   "backoff. Off: rank 0 hosts the store itself (for programs that serve their own MASTER_PORT).")
@click.option("--grace", type=t.GRACE, default=5.0, show_default=True, help="Seconds between SIGTERM and SIGKILL.")
@click.option("--only-output-from-instance", type=t.INSTANCE_INDEX, help="Show stdout of this instance only (errors from all).")
@click.option("--max-restarts", "--max_restarts", "max_restarts", type=t.RESTARTS, default=None,
              help="Restart the whole run after a failure (default 0; with --elastic one per host it can lose).")
@click.option("--elastic", "elastic_min", type=t.NODES, metavar="MIN",
              help="On a restart, drop the failed host (or take a spare) and re-plan on the hosts left at the same "
                   "global batch, down to MIN hosts; the run ends when no host count >= MIN keeps it exactly.")
@click.option("--spare-hosts", metavar="H,...", help="Hosts that take a lost host's place in an --elastic run.")
@click.option("--dry-run", is_flag=True, help="Print per host the exact commands and env, run nothing.")
@click.option("--runs-dir", default=None, help="Where run directories go (default: runs).")
@click.option("--run-id", help="Name of the run directory (default: a timestamp).")
@click.option("--resume", "resume_run", metavar="RUN",
              help="Run RUN (a run id under --runs-dir, or a run directory) again with its own recorded arguments, "
                   "into its own directory, from its newest good state (as `podrun resume RUN`).")
@click.option("--max-concurrency", type=t.CONCURRENCY, default=64, show_default=True, help="SSH handshakes in flight at once (commands over open connections are not limited).")
@click.option("--heartbeat", type=t.HEARTBEAT, default=None, metavar="SECONDS",
              help="Seconds between heartbeats, both ways: the controller to each agent and each agent to the "
                   "controller (default 0.5; the cluster spec's heartbeat).")
@click.option("--heartbeat-misses", type=t.MISSES, default=None, metavar="N",
              help="Heartbeats missed in a row before a host is declared lost, and before an agent ends its workers "
                   "for want of its controller (default 4; the cluster spec's heartbeat_misses). The bound is "
                   "--heartbeat x N: 2 s by default.")
@click.option("--keepalive", type=t.KEEPALIVE, default=None, metavar="SECONDS",
              help="The bound itself: seconds of silence after which a host is declared lost (--heartbeat x "
                   "--heartbeat-misses; alone it means 4 missed heartbeats of SECONDS/4).")
@click.option("--straggler-timeout", type=t.STRAGGLER, metavar="SECONDS",
              callback=lambda ctx, p, v: _finite(p, v),
              help="Once a worker has exited 0, the others have this long to end; then they are ended and the run "
                   "fails (exit 124) naming the ranks still running. Default: no bound.")
@click.option("--no-preflight", is_flag=True, help="Skip the checks on every host before starting.")
@click.option("--warm/--no-warm", default=True, show_default=True,
              help="In a run that can restart (--max-restarts > 0, --elastic) over local or ssh: a zygote per host, "
                   "started by the first attempt, that has torch imported and forks later attempts' workers, so a "
                   "restart skips the interpreter start and torch import (docs/elastic.md).")
@click.option("--json", "as_json", is_flag=True, help="Print a summary JSON on stdout at the end (output goes to stderr).")
@click.option("--env", "env_items", multiple=True, metavar="NAME=VALUE", help="Set a variable for every worker (repeatable).")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def launch(ctx, args, transport, ssh_config, no_host_key_check, python_, workdir, master_addr, master_port,
           agent_store, grace, only_output_from_instance, max_restarts, elastic_min, spare_hosts, dry_run, runs_dir,
           run_id, max_concurrency, heartbeat, heartbeat_misses, keepalive, straggler_timeout, no_preflight, warm,
           as_json, env_items, module,
           no_python, resume_run, **kw):
    """Launch RECIPE [ARGS...], SCRIPT.py [ARGS...], -m MODULE [ARGS...] or -- COMMAND ... on the plan's hosts.

    \b
      podrun launch recipes/resnet18_cifar10 --data digits
      podrun launch --nproc-per-node 2 train.py --epochs 1        # as torchrun
      podrun launch --hosts h1,h2 --devices-per-host 2 -- ./run.sh --epochs 1
    """
    from podrun.cli.render import print_json
    from podrun.launch.prepare import prepare_launch
    from podrun.launch.request import SSHOptions
    from podrun.launch.run import dry_run_record, execute
    from podrun.launch.torchrun_args import LaunchOptions, TorchrunOptions

    if resume_run is not None:
        _resume(ctx, resume_run, runs_dir, dry_run)
        return
    resuming = (ctx.obj or {}).get("podrun.resume") if isinstance(ctx.obj, dict) else None
    plan_kw, engine_kw = pop_plan_options(kw), pop_engine_options(kw)
    watch = pop_watch_options(kw)
    net_kw = pop_network_options(kw)
    torchrun = TorchrunOptions(**{k: kw.pop(k) for k in TORCHRUN_OPTION_NAMES})
    own = LaunchOptions(devices_per_host=plan_kw.pop("devices_per_host"), nodes=plan_kw.pop("nodes"),
                        elastic_min=elastic_min, max_restarts=max_restarts, master_addr=master_addr,
                        master_port=master_port, run_id=run_id, runs_dir=runs_dir)
    names = {o for p in ctx.command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")}
    prepared = prepare_launch(
        list(args), dashdash=bool(ctx.meta.get("podrun.dashdash")), module=module, no_python=no_python,
        torchrun=torchrun, own=own, own_option_names=names, plan_kw=plan_kw, engine_kw=engine_kw,
        transport=transport, ssh=SSHOptions(config_path=ssh_config, host_key_check=not no_host_key_check,
                                            max_concurrency=max_concurrency, client=net_kw["ssh_client"]),
        python=python_, workdir=workdir, agent_store=agent_store, grace=grace,
        liveness_opts=(heartbeat, heartbeat_misses, keepalive), only_output_from_instance=only_output_from_instance, spare_hosts=spare_hosts,
        straggler_timeout=straggler_timeout, preflight=not no_preflight, env_items=env_items,
        data_interface=net_kw["data_interface"], warm=warm)
    request = prepared.request
    watch = watch_for(watch, prepared.recipe, prepared.cluster)
    if prepared.engine == "horovod":
        from podrun.launch.engines.horovod import launch_horovod

        argv, rc = launch_horovod(request, dry_run=dry_run)
        if dry_run:
            import shlex

            print_json({"engine": "horovod", "command": argv}) if as_json else print(shlex.join(argv))
            return
        sys.exit(rc)
    notes = [*prepared.notes, *([prepared.long_run] if prepared.long_run else [])]
    if dry_run:
        record = {**dry_run_record(request), "max_restarts": request.max_restarts, "notes": notes}
        print_json(record) if as_json else _print_dry_run(record)
        return
    for note in notes:
        print(f"podrun: {note}", file=sys.stderr, flush=True)
    if prepared.long_run and sys.stdin.isatty() and sys.stderr.isatty() and not click.confirm(
            "podrun: start it anyway?", default=False, err=True):
        print("podrun: not started", file=sys.stderr)
        sys.exit(1)
    from podrun.cli.render import ProgressView
    from podrun.cli.watch_options import live_console

    view = ProgressView(live_console(as_json))
    try:
        from podrun.launch.resume import record

        outcome, summary = execute(request, sink=_sink(request.plan, as_json), notice=_notice,
                                   only_output_from=only_output_from_instance, elastic=prepared.elastic,
                                   watch=watch, progress=view, resuming=resuming is not None,
                                   launch_record=record(ctx.meta.get("podrun.argv", []), os.getcwd()))
    finally:
        view.close()
    try:
        _print_root_cause(summary, request)
        if as_json:
            print_json(summary)
    except OSError:                  # a closed pipe (`| head`) or terminal (SIGHUP): the run dir has everything
        pass
    sys.exit(summary["exit_code"])   # main.py turns SystemExit into the exit code


def _resume(ctx, run: str, runs_dir: str | None, dry_run: bool) -> None:
    """`podrun launch --resume RUN`: the run's recorded `podrun launch` arguments, run again in its working
    directory into its own run directory (any other arguments given are refused)."""
    from podrun.launch.resume import relaunch

    given = [a for a in ctx.meta.get("podrun.argv", []) if a not in ("--resume", run) and not a.startswith("--resume=")]
    extra = [a for a in given if a not in ("--runs-dir", runs_dir, "--dry-run") and not a.startswith("--runs-dir=")]
    if extra:
        raise click.UsageError(f"--resume runs the run's own recorded arguments; these cannot be added: "
                               f"{' '.join(extra)}")
    argv, cwd, run_dir = relaunch(run, runs_dir)
    _notice(f"resuming run {run_dir.name} in {cwd}: podrun launch {' '.join(argv[4:])}")
    try:
        os.chdir(cwd)
    except OSError as exc:
        from podrun.errors import LaunchError

        raise LaunchError(f"cannot enter the run's working directory {cwd}: {exc.strerror or exc}") from None
    obj = dict(ctx.obj) if isinstance(ctx.obj, dict) else {}
    obj["podrun.resume"] = str(run_dir)
    rc = launch.main(args=(["--dry-run"] if dry_run else []) + argv, prog_name="podrun launch",
                     standalone_mode=False, obj=obj)
    sys.exit(rc if isinstance(rc, int) else 0)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("run")
@click.option("--runs-dir", default=None, help="Where run directories are (default: runs).")
@click.option("--dry-run", is_flag=True, help="Print the commands the resume would run, run nothing.")
def resume(run, runs_dir, dry_run):
    """Resume RUN (a run id under --runs-dir, or a run directory) from its newest good state.

    Runs the run's own recorded `podrun launch` arguments again, in the directory it was launched from,
    into the same run directory (its attempts are recorded with the earlier ones); refused while another
    process holds the run.
    """
    argv = ["--resume", run] + (["--runs-dir", runs_dir] if runs_dir is not None else []) + \
        (["--dry-run"] if dry_run else [])
    rc = launch.main(args=argv, prog_name="podrun launch", standalone_mode=False)
    sys.exit(rc if isinstance(rc, int) else 0)


def _sink(plan, as_json: bool):
    """The console writer of workers' lines: ``[instance host]`` (``[instance:local_rank host]``), coloured on a tty.
    The stream is looked up at each line (stderr with --json), so that a live progress line can redirect it."""
    from podrun.plan.env import workers_per_instance

    tty = (sys.stderr if as_json else sys.stdout).isatty() and "NO_COLOR" not in os.environ
    multi = workers_per_instance(plan) > 1

    def sink(index, host, local_rank, stream, text):
        who = "?" if index is None else str(index)
        if local_rank is not None and multi:
            who += f":{local_rank}"
        prefix = f"[{who} {host}]"
        if tty:
            prefix = f"\x1b[{COLOURS[(0 if index is None else index) % len(COLOURS)]}m{prefix}\x1b[0m"
        print(f"{prefix} {text}", file=sys.stderr if stream == "err" or as_json else sys.stdout, flush=True)

    return sink


def _notice(text):
    print(f"podrun: {text}", file=sys.stderr, flush=True)


def _finite(param, value):
    """A float option's value, refused (exit 2) when it is NaN or infinite."""
    import math

    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a number of seconds", param=param)
    return value


def _print_dry_run(record: dict) -> None:
    print(f"# podrun launch --dry-run: run {record['run_id']} via {record['transport']}, "
          f"run dir {record['run_dir']}, --max-restarts {record['max_restarts']}")
    for note in record["notes"]:
        print(f"# {note}")
    print(f"# MASTER_ADDR {record['master_addr']}: {record['master_addr_source']}")
    hb = record["heartbeat"]
    print(f"# heartbeat every {hb['period_s']:g} s both ways; a host silent for {hb['bound_s']:g} s "
          f"({hb['misses']:g} missed) is lost, and an agent whose controller is silent that long ends its workers")
    if record["master_port"] == 0:
        print(f"# MASTER_PORT 0 below: podrun picks a free port on {record['master_addr']} when the run starts, and "
              "every worker gets that port (--master-port N fixes one)")
    for c in record["commands"]:
        print(f"\n# host {c['host']}: runs\n{c['command']}")
    for inst in record["instances"]:
        for lr, env in enumerate(inst["workers"]):
            print(f"\n# instance {inst['index']} on {inst['host']}, worker {lr}: env (on top of the host's)")
            for k, v in env.items():
                print(f"{k}={v}")


def _print_root_cause(summary: dict, request) -> None:
    rc = summary.get("root_cause")
    code = summary["exit_code"]
    err = sys.stderr
    from podrun.train.report import pointers      # torch-free: checkpoints kept, `podrun report RUN_DIR`

    missing = summary.get("not_written") or []
    unwritten = f"; NOT written: {', '.join(missing)}" if missing else ""
    if summary["status"] == "ok":
        print(f"podrun: run {request.run_id} finished: exit 0; logs in {request.run_dir}{unwritten}; "
              f"{pointers(request.run_dir)}", file=err)
        return
    if summary["status"] == "interrupted":
        print(f"podrun: run {request.run_id} interrupted (exit {code}); every instance ended; "
              f"logs in {request.run_dir}{unwritten}; {pointers(request.run_dir)}", file=err)
        return
    if rc:
        where = f"instance {rc['instance']} on {rc['host']}"
        if rc.get("local_rank") is not None:
            where += f", local rank {rc['local_rank']}"
        print(f"podrun: run {request.run_id} failed (exit {code}). root cause: {where}: {rc['reason']}", file=err)
        error = rc.get("error")
        if error:
            print(f"  error (recorded by @record in {error.get('file')}): {error.get('message')}", file=err)
        if rc.get("last_lines"):
            whose = "its" if rc.get("local_rank") is not None else "the instance's"
            print(f"  {whose} last lines (in {request.run_dir}/instance-{rc['instance']}.log):", file=err)
            for line in rc["last_lines"]:
                print(f"    {line}", file=err)
        if rc.get("others"):
            print("  what the other workers said last:", file=err)
            for o in rc["others"]:
                who = f"instance {o['instance']} on {o['host']}"
                if o.get("local_rank") is not None:
                    who += f", local rank {o['local_rank']}"
                print(f"    {who}:", file=err)
                for line in o["last_lines"]:
                    print(f"      {line}", file=err)
    else:
        print(f"podrun: run {request.run_id} failed (exit {code})", file=err)
    where = f"logs in {request.run_dir}{unwritten}" if missing else f"logs and summary.json in {request.run_dir}"
    print(f"podrun: {where}; {pointers(request.run_dir)}", file=err)
