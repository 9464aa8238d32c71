"""The `podrun` entry point: a click group whose subcommands load lazily, and the one error catch."""
from __future__ import annotations

import contextlib
import os
import pkgutil
import sys

import click

from podrun import __version__

# name -> "module:attribute"; a command's module is imported only when it runs (or for its --help),
# so `podrun --help` and `podrun plan` never import torch or paramiko.
COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("podrun.cli.plan_cmd:plan", "Preview a plan: replicas x local batch x GA, placement, estimate."),
    "calibrate": ("podrun.cli.calibrate_cmd:calibrate", "Measure a recipe on the hosts (rate, largest local batch, all-reduce) for the plan."),
    "launch": ("podrun.cli.launch_cmd:launch", "Launch a script (as torchrun would), a recipe or a command on the plan's hosts and supervise it."),
    "resume": ("podrun.cli.launch_cmd:resume", "Resume a run by name from its newest good state (its own command again)."),
    "script": ("podrun.cli.script_cmd:script", "Write a batch-scheduler job script (Slurm, PBS, Grid Engine) for a plan."),
    "submit": ("podrun.cli.submit_cmd:submit", "Write a job script into a run directory and submit it (sbatch / qsub)."),
    "status": ("podrun.cli.submit_cmd:status", "Show the scheduler state of a submitted run."),
    "cancel": ("podrun.cli.submit_cmd:cancel", "Cancel a submitted run."),
    "hosts": ("podrun.cli.hosts_cmd:hosts", "Show the hosts podrun would use and where it found them."),
    "stack": ("podrun.cli.stack_cmd:stack", "Show every rank's stack of a running launch, merged, without stopping it."),
    "top": ("podrun.cli.top_cmd:top", "Watch a running launch live: progress, goodput, a row per host, the root cause."),
    "report": ("podrun.cli.report_cmd:report", "Summarise a run and draw its loss, accuracy and throughput curves."),
    "runs": ("podrun.cli.runs_cmd:runs", "List the local runs under a runs directory, newest first."),
    "clusters": ("podrun.cli.catalog_cmd:clusters", "List the cluster specs podrun finds (name, size, scheduler, source)."),
    "recipes": ("podrun.cli.catalog_cmd:recipes", "List the recipes podrun finds (name, model, data set, batch, source)."),
    "data": ("podrun.cli.data_cmd:data", "Measure the input pipeline (decode and augmentation) on this host."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return list(COMMANDS)

    def resolve_command(self, ctx, args):
        """A command not known: the nearest names in the error (``podrun lauch``: did you mean launch?)."""
        if args and not args[0].startswith("-") and args[0] not in COMMANDS:
            import difflib

            near = difflib.get_close_matches(args[0].lower(), list(COMMANDS), n=2, cutoff=0.6)
            tried = f"No such command {args[0]!r}."
            ctx.fail(tried + (f" Did you mean {' or '.join(near)}?" if near else f" Commands: {', '.join(COMMANDS)}."))
        return super().resolve_command(ctx, args)

    def get_command(self, ctx, name):
        return pkgutil.resolve_name(COMMANDS[name][0]) if name in COMMANDS else None

    def format_commands(self, ctx, formatter):
        # help text without importing every command module
        with formatter.section("Commands"):
            formatter.write_dl([(name, help_) for name, (_, help_) in COMMANDS.items()])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="podrun")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """podrun: plan and launch data- and pipeline-parallel training across hosts."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; PodrunError is caught here, once: one paragraph, exit code, no traceback."""
    from podrun.errors import PodrunError

    if "_PODRUN_COMPLETE" in os.environ:
        from podrun.cli.completion import register

        register()

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        # with standalone_mode=False, click returns ctx.exit(code)'s code instead of raising it
        rc = cli.main(args=argv, prog_name="podrun", standalone_mode=False)
    except PodrunError as exc:
        if debug:
            import traceback

            traceback.print_exc()
        from podrun.cli.render import print_error

        print_error(exc)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return 2
    except (click.exceptions.Abort, KeyboardInterrupt):
        return 130
    except SystemExit as exc:  # commands may sys.exit(code) after a launch
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return rc if isinstance(rc, int) else 0


def entry() -> None:
    """The `podrun` program: main(), its output flushed, then the process ends at once. The interpreter's own
    finalization (tearing down every module) would cost ~0.2 s of CPU after the run's account has ended: files
    are closed where they are written (podrun.safefs) and every thread left is a daemon."""
    code = main()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (`| head`) or stream: nothing more to say
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
