"""The `submit`, `status` and `cancel` commands: a job script into runs/<run-id>/, sbatch/qsub, squeue/scancel."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from podrun.cli import types as t

from podrun.cli.options import pop_plan_options
from podrun.cli.script_cmd import DashDashCommand, SchedulerChoice, job_command, job_of, split_recipe
from podrun.specs.recipe_args import check_recipe, refuse_long_synthetic
from podrun.jobscript.job import SCHEDULER_HELP


_scheduler_option = click.option("--scheduler", type=SchedulerChoice(),
                                 help=f"{SCHEDULER_HELP} (default: the one whose client is on PATH).")


@click.command(cls=DashDashCommand)
@job_command(
    "default: the one whose client is on PATH", "Print the job record as JSON.",
    click.option("--runs-dir", default="runs", show_default=True, help="Where runs/<run-id>/ is made."),
    click.option("--wait", is_flag=True,
                 help="Block until the job ends; exit with its exit code (like sbatch --wait)."),
    click.option("--poll", type=t.POLL, default=1.0, show_default=True,
                 help="Seconds between state queries with --wait."),
    click.option("--dry-run", is_flag=True, help="Write the script and print the submit command; submit nothing."))
def submit(ctx, recipe, extra, runs_dir, wait, poll, dry_run, as_json, **options):
    """Write the job script for RECIPE (a script.py as launch runs it, or, after --, a COMMAND) into
    runs/<run-id>/job.sh and submit it.

    Without --cluster, --pod, --hosts or --hostfile the job is planned for --nodes N hosts (default 1)
    of --devices-per-host workers each (default 1), the hosts the scheduler will allocate.

    \b
      podrun submit --scheduler slurm --nodes 3 recipes/resnet18_cifar10
      podrun submit --nodes 3 ddp.py --lr 0.1   # a script, run as launch runs it
      podrun submit --nodes 3 --wait -- python train.py   # the job's exit code
    """
    from podrun.cli.options import resolve_plan
    from podrun.jobscript.build import allocation_plan_options
    from podrun.jobscript.submit import (client, exit_code_of, pick_scheduler, prepare_job, submit_prepared,
                                         wait as wait_job)

    scheduler = pick_scheduler(options.pop("scheduler"), hint=", on a login node of the cluster")
    popts = allocation_plan_options(pop_plan_options(options))
    recipe, script_path, args = split_recipe(ctx, recipe, extra)
    plan, spec, rspec, _ = resolve_plan(recipe, popts)
    notice = refuse_long_synthetic(args, check_recipe(rspec, args) if rspec is not None else None, plan)
    options["workdir"] = options.get("workdir") or os.getcwd()
    job = prepare_job(plan, job_of(options, popts, spec, scheduler=scheduler, recipe=recipe, args=args,
                                   script=script_path), runs_dir)
    if notice is not None:          # said once the job is written, before it is queued
        click.echo(f"note: {notice}", err=True)
    if dry_run:
        _emit(job.to_dict(), as_json, f"would run: {' '.join(job.submit_argv)}\nscript: {job.script}")
        return
    cl = client(scheduler)
    rec = submit_prepared(job, cl, cwd=os.getcwd(), cluster=plan.cluster)
    if not wait:
        _emit(rec.to_dict(), as_json, rec.job_id)
        return
    if not as_json:
        click.echo(rec.job_id)
        sys.stdout.flush()
    try:
        st = wait_job(cl, rec.job_id, poll=poll)
    except KeyboardInterrupt:
        cl.cancel(rec.job_id)
        raise
    _emit({**rec.to_dict(), "state": st.state, "exit_code": st.exit_code}, as_json,
          f"job {rec.job_id} {st.state} exit code {st.exit_code}", err=True)
    sys.exit(exit_code_of(st))   # main.py turns SystemExit into the exit code (a click Exit would read as 0)


def _emit(obj: dict, as_json: bool, text: str, err: bool = False) -> None:
    """``obj`` as JSON (--json), else ``text`` (on stderr with ``err``)."""
    if as_json:
        from podrun.cli.render import print_json
        print_json(obj)
    else:
        click.echo(text, err=err)


def _resolve(target: str, scheduler: str | None):
    from podrun.jobscript.submit import client, resolve_job

    sched, job_id, rec = resolve_job(target, scheduler)
    return client(sched), job_id, rec


@click.command()
@_scheduler_option
@click.option("--json", "as_json", is_flag=True, help="Print the state as JSON.")
@click.argument("target", metavar="RUN_DIR|JOB_ID")
def status(scheduler, as_json, target):
    """Show the scheduler's state of a submitted run (a runs/<run-id> directory or a job id)."""
    from podrun.jobscript.submit import known_state

    cl, job_id, rec = _resolve(target, scheduler)
    st = known_state(cl, job_id, rec)
    out = {**(rec.to_dict() if rec else {"job_id": job_id, "scheduler": cl.name}), **st.to_dict()}
    summary = None
    if rec:
        from podrun.rundir.layout import SUMMARY
        from podrun.rundir.summary import Summary, read_json

        recorded = read_json(Path(rec.run_dir) / SUMMARY, [])
        if recorded is not None:
            out["summary"], summary = recorded, Summary.from_dict(recorded)      # shown as recorded
    line = f"job {job_id} ({cl.name}): {st.state}" + (f" [{st.native}]" if st.native not in (None, st.state) else "")
    if st.exit_code is not None:
        line += f", exit code {st.exit_code}"
    if st.nodes:
        line += f", nodes {st.nodes}"
    line += f" ({st.reason})" if st.reason else ""
    rc = None if summary is None else summary.root_cause
    if rc is not None:                # the run's own account of its end, as summary.json holds it
        from podrun.cli.render import who
        from podrun.redaction import shown

        line += f"\nroot cause: {who(rc)}: {shown(str(rc.get('reason')))}"
    _emit(out, as_json, line)


@click.command()
@_scheduler_option
@click.option("--no-wait", is_flag=True, help="Return right after scancel/qdel instead of waiting for the job to end.")
@click.option("--timeout", type=t.TIMEOUT, default=60.0, show_default=True, help="Seconds to wait for the job to end.")
@click.option("--json", "as_json", is_flag=True, help="Print the final state as JSON.")
@click.argument("target", metavar="RUN_DIR|JOB_ID")
def cancel(scheduler, no_wait, timeout, as_json, target):
    """Cancel a submitted run (scancel / qdel) and wait until the scheduler says it has ended."""
    from podrun.jobscript.submit import known_state, wait as wait_job

    cl, job_id, rec = _resolve(target, scheduler)
    before = known_state(cl, job_id, rec)
    if before.final:
        st = before
    else:
        cl.cancel(job_id)
        # gone from the queue is ended: a deleted job may never get a final record (a pending one)
        st = cl.state(job_id) if no_wait else wait_job(cl, job_id, poll=0.5, timeout=timeout, gone_grace=0)
    out = {"job_id": job_id, "scheduler": cl.name, "was": before.state, **st.to_dict()}
    _emit(out, as_json, f"job {job_id} ({cl.name}): {before.state} -> {st.state}"
          + (f" [{st.native}]" if st.native not in (None, st.state) else "")
          + (f", exit code {st.exit_code}" if st.exit_code is not None else ""))
