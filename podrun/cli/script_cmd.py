"""The `script` command: print or write a Slurm / PBS / Grid Engine batch script that runs a plan."""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import click

from podrun.cli.job_options import job_options
from podrun.cli.options import PlanOptions, plan_options, pop_plan_options, stacked
from podrun.cli.render import print_json
from podrun.errors import PodrunError
from podrun.jobscript.job import SCHEDULER_HELP, SCHEDULERS, scheduler_name, suggest_scheduler
from podrun.specs.recipe_args import check_recipe, refuse_long_synthetic

if TYPE_CHECKING:  # pragma: no cover
    from podrun.jobscript.build import JobOptions


class DashDashCommand(click.Command):
    """Keeps what follows `--` apart: `script RECIPE -- ARGS` and `script -- COMMAND` both work; after RECIPE, the
    recipe's own options (podrun.specs.recipe_args.option_table) that are not the command's go to the recipe, as
    `podrun launch RECIPE ARGS` passes them: `submit RECIPE --data digits`."""

    def parse_args(self, ctx, args):
        args = list(args)
        i = args.index("--") if "--" in args else len(args)
        head, recipe_opts = self._recipe_options(args[:i])
        ctx.meta["podrun_recipe_options"] = tuple(recipe_opts)
        ctx.meta["podrun_dashdash"] = tuple(args[i + 1:]) if i < len(args) else None
        return super().parse_args(ctx, head)

    def _recipe_options(self, words: list[str]) -> tuple[list[str], list[str]]:
        """(the command's words, the recipe's options and their values, taken from after the first argument)."""
        from podrun.specs.recipe_args import option_table

        own = {o: not (p.is_flag or p.count) for p in self.params if isinstance(p, click.Option)
               for o in (*p.opts, *p.secondary_opts)}
        recipe = option_table()
        kept, taken, seen_recipe, j = [], [], False, 0
        while j < len(words):
            word, name = words[j], words[j].split("=", 1)[0]
            if seen_recipe and is_script(kept[-1]):        # a script's arguments are its own, as launch passes them
                return kept, words[j:]
            takes = own.get(name) if name in own else recipe.get(name) if seen_recipe else None
            n = 2 if takes and "=" not in word else 1
            (taken if name not in own and name in recipe and seen_recipe else kept).extend(words[j:j + n])
            seen_recipe = seen_recipe or not word.startswith("-")
            j += n
        return kept, taken


class SchedulerChoice(click.Choice):
    """--scheduler: one of SCHEDULERS in any case, or an alias (sge); a near miss is refused with the nearest."""

    def __init__(self):
        super().__init__(SCHEDULERS)

    def convert(self, value, param, ctx):
        key = scheduler_name(value)
        if key is not None:
            return key
        self.fail((f"{value!r} is not one of {', '.join(map(repr, SCHEDULERS))} (or 'sge' for uge); "
                   + suggest_scheduler(value)).strip(), param, ctx)


def is_script(target: str) -> bool:
    """A RECIPE argument that is a Python script, as `podrun launch` reads its target: a path ending in .py, or an
    existing file, that is not a recipe folder (podrun.launch.torchrun_cli.classify)."""
    if os.path.isfile(os.path.join(target, "recipe.yaml")):
        return False
    return target.endswith(".py") or os.path.isfile(target)


def split_recipe(ctx: click.Context, recipe: str | None, extra: tuple[str, ...]
                 ) -> tuple[str | None, str | None, tuple[str, ...]]:
    """(recipe, script, args): RECIPE [-- ARGS] (a RECIPE that is_script: the script) or -- COMMAND [ARGS];
    anything else is a usage error (exit 2)."""
    dashdash = ctx.meta.get("podrun_dashdash")
    if extra:
        raise click.UsageError(f"unexpected argument(s) {' '.join(extra)!r}; put arguments for the recipe after --")
    if recipe is None and not dashdash:
        raise click.UsageError("give a RECIPE (a name in recipes/ or a folder), or a command after --")
    script = recipe if recipe is not None and is_script(recipe) else None
    return (recipe if script is None else None), script, (*ctx.meta.get("podrun_recipe_options", ()), *(dashdash or ()))


def parse_env_items(items) -> tuple[tuple[str, str], ...]:
    env = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise PodrunError(f"--env {item!r} is not NAME=VALUE", hint="write e.g. --env NCCL_DEBUG=INFO")
        env.append((name, value))
    return tuple(env)


def job_command(scheduler_help: str, json_help: str, *own):
    """The options and arguments `script` and `submit` share, in --help's order: --scheduler, the plan's, the job's
    (wall time, queue, group, account, modules, env ...), ``own`` (the command's own), --json, RECIPE [-- ARGS]."""
    return stacked(
        click.option("--scheduler", type=SchedulerChoice(), help=f"{SCHEDULER_HELP}; {scheduler_help}."),
        plan_options,
        job_options,
        *own,
        click.option("--json", "as_json", is_flag=True, help=json_help),
        click.argument("recipe", required=False),
        click.argument("extra", nargs=-1, type=click.UNPROCESSED, metavar="[-- ARGS...]"),
        click.pass_context,
    )


def job_of(options: dict, plan: PlanOptions, spec=None, **given) -> JobOptions:
    """The JobOptions of `script` or `submit`: job_command's values taken out of click's ``options``, the
    --cluster of the job's podrun launch from the plan's (``plan``), the cores per node from --cpus-per-node or
    the cluster ``spec`` (podrun.jobscript.job.node_cpus), and ``given`` over them."""
    from dataclasses import fields, replace

    from podrun.jobscript.build import JobOptions
    from podrun.jobscript.job import node_cpus

    options["cpus_per_node"] = node_cpus(options.get("cpus_per_node"), spec)

    taken = {f.name: options.pop(f.name) for f in fields(JobOptions) if f.name in options}
    # the job's podrun launch is given the spec named by --cluster or --pod, else none
    taken.update(python=taken["python"] or sys.executable, env=parse_env_items(taken["env"]),
                 cluster=plan.cluster or (f"ipu-pod{plan.pod}" if plan.pod is not None else None))
    from podrun.launch.engines.poprun import VIPU_ENV

    for name, env in VIPU_ENV.items():      # a POD's shell names its V-IPU controller and partition
        taken[name] = taken.get(name) or os.environ.get(env) or None
    job = JobOptions(**{**taken, **given})
    if spec is not None and job.cluster:
        # what the cluster asks of its jobs, written for its own scheduler only
        job = replace(job, site=spec.jobs if spec.scheduler == job.scheduler else None, site_name=spec.name)
    return job


@click.command("script", cls=DashDashCommand)
@job_command(
    "default: the cluster spec's", "Print scheduler, path or script text, and the submit command as JSON.",
    click.option("-o", "--output", "out_path", type=click.Path(dir_okay=False),
                 help="Write the script to FILE instead of stdout."))
def script(ctx, recipe, extra, out_path, as_json, **options):
    """Write the batch script that runs RECIPE (a script.py as launch runs it, or, after --, a COMMAND) with the
    same plan.

    \b
      podrun script --scheduler slurm --cluster dgx-h100 --nodes 4 \\
          --time 2h resnet50 > job.sh
      podrun script --scheduler uge --cluster abci --nodes 512 \\
          --group gaa50000 --time 1h resnet50 -o job.sh
      podrun script --scheduler pbs --nodes 2 --devices-per-host 4 \\
          -- python train.py

    The body runs `podrun launch` with this interpreter (or --job-python), never a podrun from the job's
    working directory, inside the allocation, pinned to the plan shown by `podrun plan`
    (nodes, devices per host, instances per host, global batch, local batch, GA); it finds its
    hosts in SLURM_JOB_NODELIST, PBS_NODEFILE, or PE_HOSTFILE / SGE_JOB_HOSTLIST.
    """
    from podrun.cli.options import resolve_plan
    from podrun.jobscript import check_allocation, discover, render, request_from_plan, submit_argv
    from podrun.jobscript.build import allocation_plan_options

    recipe, script_path, args = split_recipe(ctx, recipe, extra)
    found = discover(os.environ)          # once: the plan's hosts and the allocation check both use it
    popts = allocation_plan_options(pop_plan_options(options), found)
    plan, spec, rspec, _ = resolve_plan(recipe, popts, discovered=found)
    recipe_args = check_recipe(rspec, args) if rspec is not None else None
    check_allocation(plan, found)
    scheduler = options.pop("scheduler")
    if scheduler is None:
        if spec.scheduler not in SCHEDULERS:
            raise PodrunError(f"no --scheduler given and cluster '{spec.name}' names none (scheduler: {spec.scheduler})",
                              hint=f"pass --scheduler {SCHEDULER_HELP}")
        scheduler = spec.scheduler
    elif spec.scheduler in SCHEDULERS and spec.scheduler != scheduler:
        click.echo(f"note: cluster '{spec.name}' is scheduled by {spec.scheduler}; writing a {scheduler} script "
                   "as asked", err=True)
    req = request_from_plan(plan, job_of(options, popts, spec, scheduler=scheduler, recipe=recipe, args=args,
                                         script=script_path, engine=spec.engine))
    notice = refuse_long_synthetic(args, recipe_args, plan)
    if notice is not None:
        click.echo(f"note: {notice}", err=True)
    text = render(req)
    if out_path:
        _write(out_path, text, private=bool(req.env))
    submit = submit_argv(req, out_path or "JOB_SCRIPT")
    if as_json:
        print_json({
            "scheduler": scheduler,
            "path": out_path,
            "script": None if out_path else text,
            "submit": submit,
            "job_name": req.job_name,
            "nodes": req.nodes,
            "devices_per_node": req.devices_per_node,
            "device_kind": req.device_kind,
            "launch": list(req.command),
        })
    elif out_path:
        click.echo(f"wrote {out_path}: {req.nodes} node(s) x {req.devices_per_node} {plan.device_kind}; "
                   f"submit with: {' '.join(submit)}")
    else:
        click.echo(text, nl=False)


def _write(path: str, text: str, private: bool = False) -> None:
    """The job script at ``path``, written whole through podrun.safefs (a new file renamed into place, never through a
    symbolic link nor into another user's file): 0600 from its creation when it holds --env values, else 0755."""
    from podrun.safefs import write_file

    try:
        write_file(path, text, "job script", mode=0o600 if private else 0o755, error=PodrunError)
    except OSError as exc:
        raise PodrunError(f"cannot write the job script to {path}: {exc.strerror or exc}") from None
