"""`podrun launch`: parse, build the launch request, print it (--dry-run) or run and supervise it."""
from __future__ import annotations

import os
import sys

import click

from podrun.cli import types as t

from podrun.cli.options import plan_options, pop_plan_options
from podrun.launch.engines import engine_options, pop_engine_options

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
@click.option("--transport", type=click.Choice(["local", "ssh", "mpirun", "srun"]),
              help="How instances start (default: local for this machine, srun in Slurm, else ssh).")
@click.option("--ssh-config", type=click.Path(dir_okay=False), help="OpenSSH client config (default ~/.ssh/config).")
@click.option("--no-host-key-check", is_flag=True, help="Accept unknown host keys (explicit opt-out of known_hosts).")
@click.option("--python", "python_", help="Python on the hosts (default: this one, sys.executable).")
@click.option("--workdir", help="Working directory on the hosts (default: the current directory).")
@click.option("--master-addr", help="Rendezvous address (default: the host of instance 0).")
@click.option("--master-port", type=t.PORT, default=29500, show_default=True, help="Rendezvous port.")
@click.option("--store-relay/--no-store-relay", default=True, show_default=True,
              help="Rank 0's agent listens on the rendezvous port from the start and relays it to rank 0's store "
                   "on the next port (rank 0's MASTER_PORT), so no worker waits in torch's reconnect backoff.")
@click.option("--grace", type=t.GRACE, default=5.0, show_default=True, help="Seconds between SIGTERM and SIGKILL.")
@click.option("--only-output-from-instance", type=t.INSTANCE_INDEX, help="Show stdout of this instance only (errors from all).")
@click.option("--max-restarts", type=t.RESTARTS, default=0, show_default=True, help="Restart the whole run after a failure.")
@click.option("--dry-run", is_flag=True, help="Print per host the exact commands and env, run nothing.")
@click.option("--runs-dir", default="runs", show_default=True, help="Where run directories go.")
@click.option("--run-id", help="Name of the run directory (default: a timestamp).")
@click.option("--max-concurrency", type=t.CONCURRENCY, default=64, show_default=True, help="SSH handshakes in flight at once (commands over open connections are not limited).")
@click.option("--keepalive", type=t.KEEPALIVE, default=5.0, show_default=True,
              help="Seconds of silence after which a host is declared lost.")
@click.option("--no-preflight", is_flag=True, help="Skip the checks on every host before starting.")
@click.option("--json", "as_json", is_flag=True, help="Print a summary JSON on stdout at the end (output goes to stderr).")
@click.option("--env", "env_items", multiple=True, metavar="NAME=VALUE", help="Set a variable for every worker (repeatable).")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def launch(ctx, args, transport, ssh_config, no_host_key_check, python_, workdir, master_addr, master_port,
           store_relay, grace, only_output_from_instance, max_restarts, dry_run, runs_dir, run_id, max_concurrency,
           keepalive, no_preflight, as_json, env_items, **kw):
    """Launch RECIPE [ARGS...] (its train.py gets ARGS) or -- COMMAND ... on the plan's hosts.

    \b
      podrun launch recipes/resnet18_cifar10 --data digits
      podrun launch --hosts h1,h2 --devices-per-host 2 -- python train.py --epochs 1
    """
    from podrun.cli.render import print_json
    from podrun.cli.options import resolve_plan_with_source
    from podrun.errors import LaunchError
    from podrun.launch.request import SSHOptions, parse_env_options
    from podrun.launch.run import build_request, default_transport, dry_run_record, execute

    from podrun.launch.engines import resolve_engine

    plan_kw = pop_plan_options(kw)
    engine_kw = pop_engine_options(kw)
    args = list(args)
    if not args:
        raise LaunchError("nothing to launch", hint="give a recipe (podrun launch recipes/NAME) or a command after --")
    if ctx.meta.get("podrun.dashdash"):
        recipe, command_args = None, args
    else:
        recipe, command_args = args[0], args[1:]
        if command_args[:1] == ["--"]:
            command_args = command_args[1:]
        if not _looks_like_recipe(recipe):
            raise LaunchError(f"{recipe!r} is not a recipe (a folder with recipe.yaml, or a name in recipes/)",
                              hint=f"to run a command, put it after --: podrun launch [OPTIONS] -- {' '.join(args)}")
    env = parse_env_options(env_items)
    plan, cluster, rspec, src = resolve_plan_with_source(recipe, **plan_kw)
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
                            mpi_args=mpi_args, poprun=poprun_opts, store_relay=store_relay,
                            preflight=not no_preflight)
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
        print(f"{prefix} {text}", file=sys.stderr if stream == "err" else out, flush=True)

    def notice(text):
        print(f"podrun: {text}", file=sys.stderr, flush=True)

    if only is not None and not 0 <= only < plan.instances:
        raise LaunchError(f"--only-output-from-instance {only}: the plan has instances 0..{plan.instances - 1}")
    outcome, summary = execute(request, sink=sink, notice=notice,
                               only_output_from=only)
    try:
        _print_root_cause(summary, request)
        if as_json:
            print_json(summary)
    except BrokenPipeError:          # e.g. `podrun launch ... | head`: the run dir has everything
        pass
    sys.exit(summary["exit_code"])   # main.py turns SystemExit into the exit code


def _looks_like_recipe(arg: str) -> bool:
    """A folder with recipe.yaml, or a bare name (load_recipe looks it up in recipes/ and explains misses)."""
    if os.path.isdir(arg):
        return os.path.exists(os.path.join(arg, "recipe.yaml"))
    return os.sep not in arg and not arg.endswith(".py") and not os.path.exists(arg)


def _print_dry_run(record: dict) -> None:
    print(f"# podrun launch --dry-run: run {record['run_id']} via {record['transport']}, "
          f"run dir {record['run_dir']}")
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
    if summary["status"] == "ok":
        print(f"podrun: run {request.run_id} finished: exit 0; logs in {request.run_dir}", file=err)
        return
    if summary["status"] == "interrupted":
        print(f"podrun: run {request.run_id} interrupted (exit {code}); every instance ended; "
              f"logs in {request.run_dir}", file=err)
        return
    if rc:
        where = f"instance {rc['instance']} on {rc['host']}"
        if rc.get("local_rank") is not None:
            where += f", local rank {rc['local_rank']}"
        print(f"podrun: run {request.run_id} failed (exit {code}). root cause: {where}: {rc['reason']}", file=err)
        if rc.get("last_lines"):
            print(f"  last lines of {request.run_dir}/instance-{rc['instance']}.log:", file=err)
            for line in rc["last_lines"]:
                print(f"    {line}", file=err)
    else:
        print(f"podrun: run {request.run_id} failed (exit {code})", file=err)
    print(f"podrun: logs and summary.json in {request.run_dir}", file=err)
