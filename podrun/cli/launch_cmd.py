"""`podrun launch`: parse, build the launch request, print it (--dry-run) or run and supervise it."""
from __future__ import annotations

import os
import sys

import click

from podrun.cli import types as t

from podrun.cli.options import plan_options, pop_plan_options
from podrun.cli.engine_options import engine_options, pop_engine_options
from podrun.cli.watch_options import pop_watch_options, watch_for, watch_options

COLOURS = ("36", "33", "35", "32", "34", "31", "96", "93")


class LaunchCommand(click.Command):
    """Records whether the user wrote ``-- COMMAND`` (click drops a leading ``--``)."""

    def parse_args(self, ctx, args):
        raw = args.count("--")
        rest = super().parse_args(ctx, list(args))
        ctx.meta["podrun.dashdash"] = raw > list(ctx.params.get("args") or ()).count("--")
        return rest


@click.command(cls=LaunchCommand, context_settings={
    "ignore_unknown_options": True, "allow_extra_args": True, "allow_interspersed_args": False})
@plan_options
@engine_options
@watch_options
@click.option("--transport", type=click.Choice(["local", "ssh", "mpirun", "srun"]),
              help="How instances start (default: local for this machine, srun in Slurm, else ssh).")
@click.option("--ssh-config", type=click.Path(dir_okay=False), help="OpenSSH client config (default ~/.ssh/config).")
@click.option("--no-host-key-check", is_flag=True, help="Accept unknown host keys (explicit opt-out of known_hosts).")
@click.option("--python", "python_", help="Python on the hosts (default: this one, sys.executable).")
@click.option("--workdir", help="Working directory on the hosts (default: the current directory).")
@click.option("--master-addr", help="Rendezvous address (default: the host of instance 0).")
@click.option("--master-port", type=t.PORT, default=None,
              help="Rendezvous port, every worker's MASTER_PORT. 0: podrun picks a free port (the default on this "
                   "machine, like torchrun --standalone); with hosts elsewhere the default is 29500.")
@click.option("--agent-store/--no-agent-store", "--store-relay/--no-store-relay", "agent_store", default=True,
              show_default=True,
              help="Rank 0's agent holds the rendezvous port from the start and serves torch's TCPStore on it "
                   "(TORCHELASTIC_USE_AGENT_STORE=True, as under torchrun), so no worker waits in torch's reconnect "
                   "backoff. Off: rank 0 hosts the store itself (for programs that serve their own MASTER_PORT).")
@click.option("--grace", type=t.GRACE, default=5.0, show_default=True, help="Seconds between SIGTERM and SIGKILL.")
@click.option("--only-output-from-instance", type=t.INSTANCE_INDEX, help="Show stdout of this instance only (errors from all).")
@click.option("--max-restarts", type=t.RESTARTS, default=0, show_default=True, help="Restart the whole run after a failure.")
@click.option("--elastic", "elastic_min", type=t.NODES, metavar="MIN",
              help="On a restart, drop the failed host (or take a spare) and re-plan on the hosts left at the same "
                   "global batch, down to MIN hosts; the run ends when no host count >= MIN keeps it exactly.")
@click.option("--spare-hosts", metavar="H,...", help="Hosts that take a lost host's place in an --elastic run.")
@click.option("--dry-run", is_flag=True, help="Print per host the exact commands and env, run nothing.")
@click.option("--runs-dir", default="runs", show_default=True, help="Where run directories go.")
@click.option("--run-id", help="Name of the run directory (default: a timestamp).")
@click.option("--max-concurrency", type=t.CONCURRENCY, default=64, show_default=True, help="SSH handshakes in flight at once (commands over open connections are not limited).")
@click.option("--keepalive", type=t.KEEPALIVE, default=5.0, show_default=True,
              help="Seconds of silence after which a host is declared lost.")
@click.option("--straggler-timeout", type=t.STRAGGLER, metavar="SECONDS",
              callback=lambda ctx, p, v: _finite(p, v),
              help="Once a worker has exited 0, the others have this long to end; then they are ended and the run "
                   "fails (exit 124) naming the ranks still running. Default: no bound.")
@click.option("--no-preflight", is_flag=True, help="Skip the checks on every host before starting.")
@click.option("--json", "as_json", is_flag=True, help="Print a summary JSON on stdout at the end (output goes to stderr).")
@click.option("--env", "env_items", multiple=True, metavar="NAME=VALUE", help="Set a variable for every worker (repeatable).")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def launch(ctx, args, transport, ssh_config, no_host_key_check, python_, workdir, master_addr, master_port,
           agent_store, grace, only_output_from_instance, max_restarts, elastic_min, spare_hosts, dry_run, runs_dir,
           run_id, max_concurrency, keepalive, straggler_timeout, no_preflight, as_json, env_items, **kw):
    """Launch RECIPE [ARGS...] (its train.py gets ARGS) or -- COMMAND ... on the plan's hosts.

    \b
      podrun launch recipes/resnet18_cifar10 --data digits
      podrun launch --hosts h1,h2 --devices-per-host 2 -- python train.py --epochs 1
    """
    from podrun.cli.render import print_json
    from podrun.cli.options import resolve_plan_inputs
    from podrun.plan import make_plan
    from podrun.errors import LaunchError
    from podrun.launch.request import SSHOptions, parse_env_options
    from podrun.launch.run import build_request, default_transport, dry_run_record, execute

    from podrun.launch.engines import resolve_engine

    plan_kw = pop_plan_options(kw)
    engine_kw = pop_engine_options(kw)
    watch = pop_watch_options(kw)
    args = list(args)
    if not args:
        raise LaunchError("nothing to launch", hint="give a recipe (podrun launch recipes/NAME) or a command after --")
    if ctx.meta.get("podrun.dashdash"):
        recipe, command_args = None, args
    else:
        recipe, command_args = args[0], args[1:]
        if command_args[:1] == ["--"]:
            command_args = command_args[1:]
        else:
            _refuse_own_options_after_recipe(ctx, recipe, command_args)
        if not _looks_like_recipe(recipe):
            raise LaunchError(f"{recipe!r} is not a recipe (a folder with recipe.yaml, or a name in recipes/)",
                              hint=f"to run a command, put it after --: podrun launch [OPTIONS] -- {' '.join(args)}")
    env = parse_env_options(env_items)
    cluster, rspec, src, overrides = resolve_plan_inputs(recipe, **plan_kw)
    watch = watch_for(watch, rspec, cluster)
    plan = make_plan(cluster, rspec, overrides)
    python = python_ or sys.executable
    if rspec is not None:
        script = os.path.abspath(os.path.join(rspec.path, rspec.train_script))
        command = [python, script, *command_args]
    else:
        command = command_args
    engine, engine_transport, poprun_opts, mpi_args = resolve_engine(
        engine_kw, cluster, only_output_from_instance=only_output_from_instance)
    if engine == "poprun" and transport:
        raise LaunchError(f"--engine poprun starts the instances itself; drop --transport {transport}")
    name = engine_transport or transport or default_transport(plan, cluster, getattr(src, "scheduler", "none"))
    ssh = SSHOptions(config_path=ssh_config, host_key_check=not no_host_key_check, max_concurrency=max_concurrency)
    request = build_request(plan, command, transport=name, python=python, workdir=workdir, master_addr=master_addr,
                            master_port=master_port, grace=grace, keepalive=keepalive, run_id=run_id,
                            runs_dir=runs_dir, env=env, max_restarts=max_restarts, ssh=ssh,
                            mpi_args=mpi_args, poprun=poprun_opts, agent_store=agent_store,
                            preflight=not no_preflight, straggler_timeout=straggler_timeout)
    elastic = None
    if elastic_min is not None:
        from podrun.launch.elastic import make_policy

        elastic = make_policy(cluster, rspec, overrides, plan, elastic_min, spare_hosts, transport=name,
                              max_restarts=max_restarts, engine=None if engine == "torch" else engine)
    elif spare_hosts is not None:
        raise LaunchError("--spare-hosts takes effect only in an elastic run", hint="add --elastic MIN")
    if engine == "horovod":
        from podrun.launch.engines.horovod import launch_horovod

        argv, rc = launch_horovod(request, dry_run=dry_run)
        if dry_run:
            import shlex

            print_json({"engine": "horovod", "command": argv}) if as_json else print(shlex.join(argv))
            return
        sys.exit(rc)
    if dry_run:
        record = dry_run_record(request)
        if as_json:
            print_json(record)
        else:
            _print_dry_run(record)
        return
    out = sys.stderr if as_json else sys.stdout
    tty = out.isatty() and "NO_COLOR" not in os.environ
    only = only_output_from_instance

    from podrun.plan.env import workers_per_instance

    multi = workers_per_instance(plan) > 1

    def sink(index, host, local_rank, stream, text):
        who = "?" if index is None else str(index)
        if local_rank is not None and multi:
            who += f":{local_rank}"
        prefix = f"[{who} {host}]"
        if tty:
            prefix = f"\x1b[{COLOURS[(0 if index is None else index) % len(COLOURS)]}m{prefix}\x1b[0m"
        print(f"{prefix} {text}", file=sys.stderr if stream == "err" or as_json else sys.stdout, flush=True)

    def notice(text):
        print(f"podrun: {text}", file=sys.stderr, flush=True)

    if only is not None and not 0 <= only < plan.instances:
        raise LaunchError(f"--only-output-from-instance {only}: the plan has instances 0..{plan.instances - 1}")
    from podrun.cli.render import ProgressView
    from podrun.cli.watch_options import live_console

    view = ProgressView(live_console(as_json))
    try:
        outcome, summary = execute(request, sink=sink, notice=notice, only_output_from=only, elastic=elastic,
                                   watch=watch, progress=view)
    finally:
        view.close()
    try:
        _print_root_cause(summary, request)
        if as_json:
            print_json(summary)
    except OSError:                  # a closed pipe (`| head`) or terminal (SIGHUP): the run dir has everything
        pass
    sys.exit(summary["exit_code"])   # main.py turns SystemExit into the exit code


def _finite(param, value):
    """A float option's value, refused (exit 2) when it is NaN or infinite."""
    import math

    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a number of seconds", param=param)
    return value


def _refuse_own_options_after_recipe(ctx, recipe: str, args: list[str]) -> None:
    """Arguments after the recipe go to its train.py; one that is an option of podrun launch was most likely
    meant for podrun (`recipes/x --dry-run` would otherwise start a real run): stop, unless a ``--`` before it
    says it is for train.py."""
    from podrun.errors import LaunchError

    own = {o for p in ctx.command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")}
    for arg in args:
        if arg == "--":
            return
        name = arg.split("=", 1)[0]
        if name in own:
            raise LaunchError(
                f"{arg!r} comes after the recipe {recipe!r}, so it would go to train.py, but it is an option of "
                "podrun launch",
                hint=f"put podrun's options before the recipe (podrun launch {name} ... {recipe}), or after -- to "
                     f"pass them to train.py on purpose (podrun launch {recipe} -- {arg})")


def _looks_like_recipe(arg: str) -> bool:
    """A folder with recipe.yaml, or a bare name (load_recipe looks it up in recipes/ and explains misses)."""
    if os.path.isdir(arg):
        return os.path.exists(os.path.join(arg, "recipe.yaml"))
    return os.sep not in arg and not arg.endswith(".py") and not os.path.exists(arg)


def _print_dry_run(record: dict) -> None:
    print(f"# podrun launch --dry-run: run {record['run_id']} via {record['transport']}, "
          f"run dir {record['run_dir']}")
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

    if summary["status"] == "ok":
        print(f"podrun: run {request.run_id} finished: exit 0; logs in {request.run_dir}; "
              f"{pointers(request.run_dir)}", file=err)
        return
    if summary["status"] == "interrupted":
        print(f"podrun: run {request.run_id} interrupted (exit {code}); every instance ended; "
              f"logs in {request.run_dir}; {pointers(request.run_dir)}", file=err)
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
    print(f"podrun: logs and summary.json in {request.run_dir}; {pointers(request.run_dir)}", file=err)
