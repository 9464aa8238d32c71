"""The `submit`, `status` and `cancel` commands: a job script into runs/<run-id>/, sbatch/qsub, squeue/scancel."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import click

from podrun.cli import types as t

from podrun.cli.options import plan_options, pop_plan_options
from podrun.cli.script_cmd import DashDashCommand, job_options, parse_env_items, split_recipe
from podrun.errors import HostError, PodrunError

SCHEDULER_CHOICES = ("slurm", "pbs", "uge")


def _scheduler_option(f):
    return click.option("--scheduler", help="slurm | pbs | uge (default: the one whose client is on PATH).")(f)


def _gpus_found() -> int:
    """GPUs on this host (nvidia-smi -L), 0 when none or no driver."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return 0
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def _pick_scheduler(scheduler: str | None) -> str:
    from podrun.jobscript.submit import detect_scheduler

    if scheduler is None:
        scheduler = detect_scheduler()
        if scheduler is None:
            raise PodrunError("no --scheduler given and no scheduler client (sbatch, qsub) on PATH",
                              hint="pass --scheduler slurm|pbs|uge on a login node of the cluster")
    if scheduler not in SCHEDULER_CHOICES:
        raise PodrunError(f"unknown scheduler '{scheduler}'",
                          hint="--scheduler slurm, pbs or uge (Univa/Altair Grid Engine, as on ABCI)")
    return scheduler


@click.command(cls=DashDashCommand)
@_scheduler_option
@plan_options
@job_options
@click.option("--runs-dir", default="runs", show_default=True, help="Where runs/<run-id>/ is made.")
@click.option("--wait", is_flag=True, help="Block until the job ends; exit with its exit code (like sbatch --wait).")
@click.option("--poll", type=t.POLL, default=1.0, show_default=True, help="Seconds between state queries with --wait.")
@click.option("--dry-run", is_flag=True, help="Write the script and print the submit command; submit nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the job record as JSON.")
@click.argument("recipe", required=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def submit(ctx, scheduler, time_limit, partition, queue, group, account, job_name, transport,
           cpus_per_node, modules, env_items, runs_dir, wait, poll, dry_run, as_json, recipe, args,
           **kwargs):
    """Write the job script for RECIPE (or, after --, a COMMAND) into runs/<run-id>/job.sh and submit it.

    \b
      podrun submit --scheduler slurm --nodes 3 recipes/resnet18_cifar10
      podrun submit --nodes 3 --wait -- python train.py     # a bare command; exits with the job's code
    """
    from podrun.jobscript import request_from_plan, render
    from podrun.jobscript.submit import JobRecord, client, new_run_id, wait as wait_job

    scheduler = _pick_scheduler(scheduler)
    popts = pop_plan_options(kwargs)
    recipe, args = split_recipe(ctx, recipe, args)
    explicit_cluster = popts.get("cluster") is not None or popts.get("pod") is not None
    if not explicit_cluster and popts.get("hosts_opt") is None and popts.get("hostfile") is None:
        # no cluster spec: the cluster is what the scheduler will allocate, --nodes N hosts
        n = 1 if popts.get("nodes") is None else popts["nodes"]
        if n < 1:
            raise HostError(f"--nodes {n} must be at least 1")
        if popts.get("devices_per_host") is None:
            popts["devices_per_host"] = max(1, _gpus_found())     # no GPU: one CPU worker
        popts["hosts_opt"] = ",".join(f"alloc{i}" for i in range(n))
        popts["environ"] = {}       # the allocation is not here yet: do not read SLURM_* of this shell
    from podrun.cli.options import resolve_plan

    plan = resolve_plan(recipe, **popts)[0]
    env = parse_env_items(env_items)

    run_id = new_run_id()
    run_dir = (Path(runs_dir) / run_id).resolve()
    run_dir.mkdir(parents=True, exist_ok=False)
    launch_options = _launch_options(run_id, run_dir)
    req = request_from_plan(
        plan, scheduler=scheduler, recipe=recipe, args=args,
        cluster=popts.get("cluster") or (f"ipu-pod{popts['pod']}" if popts.get("pod") is not None else None),
        job_name=job_name, time=time_limit, partition=partition, queue=queue, group=group,
        account=account, log_dir=str(run_dir), env=env, workdir=os.getcwd(),
        cpus_per_node=cpus_per_node, transport=transport, modules=modules,
        launch_options=launch_options,
    )
    script = run_dir / "job.sh"
    script.write_text(render(req))
    script.chmod(0o755)
    (run_dir / "plan.json").write_text(__import__("json").dumps(plan.to_dict(), indent=2) + "\n")

    cl = client(scheduler)
    argv = cl.submit_argv(str(script), group=group if scheduler == "uge" else account)
    if dry_run:
        rec = {"run_id": run_id, "run_dir": str(run_dir), "scheduler": scheduler, "script": str(script),
               "submit_argv": argv, "job_id": None}
        _emit(rec, as_json, f"would run: {' '.join(argv)}\nscript: {script}")
        return
    job_id = cl.submit(str(script), cwd=os.getcwd(), group=group if scheduler == "uge" else account)
    rec = JobRecord(run_id=run_id, run_dir=str(run_dir), scheduler=scheduler, job_id=job_id,
                    script=str(script), submit_argv=tuple(argv), submitted_at=time.time(),
                    cluster=plan.cluster, nodes=req.nodes)
    rec.save()
    if not wait:
        _emit(rec.to_dict(), as_json, job_id)
        return
    if not as_json:
        click.echo(job_id)
        sys.stdout.flush()
    try:
        st = wait_job(cl, job_id, poll=poll)
    except KeyboardInterrupt:
        cl.cancel(job_id)
        raise
    out = {**rec.to_dict(), **{"state": st.state, "exit_code": st.exit_code}}
    if as_json:
        from podrun.cli.render import print_json
        print_json(out)
    else:
        click.echo(f"job {job_id} {st.state} exit code {st.exit_code}", err=True)
    code = st.exit_code if st.exit_code is not None else 1
    if st.state == "GONE":
        code = 1
    sys.exit(code)   # main.py turns SystemExit into the exit code (a click Exit would read as 0)


def _launch_options(run_id: str, run_dir: Path) -> list[str]:
    """Extra `podrun launch` options so the job's run lands in the same runs/<run-id>/."""
    try:
        from podrun.cli.launch_cmd import launch
    except ImportError:
        return []
    names = {o for p in launch.params for o in getattr(p, "opts", ())}
    if "--run-dir" in names:
        return ["--run-dir", str(run_dir)]
    if "--run-id" in names and "--runs-dir" in names:
        return ["--runs-dir", str(run_dir.parent), "--run-id", run_id]
    return []


def _emit(obj: dict, as_json: bool, text: str) -> None:
    if as_json:
        from podrun.cli.render import print_json
        print_json(obj)
    else:
        click.echo(text)


def _resolve(target: str, scheduler: str | None):
    from podrun.jobscript.submit import client, resolve_job

    if scheduler is not None and scheduler not in SCHEDULER_CHOICES:
        _pick_scheduler(scheduler)
    sched, job_id, rec = resolve_job(target, scheduler)
    return client(sched), job_id, rec


@click.command()
@_scheduler_option
@click.option("--json", "as_json", is_flag=True, help="Print the state as JSON.")
@click.argument("target", metavar="RUN_DIR|JOB_ID")
def status(scheduler, as_json, target):
    """Show the scheduler's state of a submitted run (a runs/<run-id> directory or a job id)."""
    cl, job_id, rec = _resolve(target, scheduler)
    st = cl.state(job_id)
    out = {**(rec.to_dict() if rec else {"job_id": job_id, "scheduler": cl.name}), **st.to_dict()}
    if rec:
        summary = Path(rec.run_dir) / "summary.json"
        if summary.exists():
            import json
            try:
                out["summary"] = json.loads(summary.read_text())
            except ValueError:
                pass
    if as_json:
        from podrun.cli.render import print_json
        print_json(out)
        return
    line = f"job {job_id} ({cl.name}): {st.state}"
    if st.exit_code is not None:
        line += f", exit code {st.exit_code}"
    if st.nodes:
        line += f", nodes {st.nodes}"
    if st.reason:
        line += f" ({st.reason})"
    click.echo(line)


@click.command()
@_scheduler_option
@click.option("--no-wait", is_flag=True, help="Return right after scancel/qdel instead of waiting for the job to end.")
@click.option("--timeout", type=t.TIMEOUT, default=60.0, show_default=True, help="Seconds to wait for the job to end.")
@click.option("--json", "as_json", is_flag=True, help="Print the final state as JSON.")
@click.argument("target", metavar="RUN_DIR|JOB_ID")
def cancel(scheduler, no_wait, timeout, as_json, target):
    """Cancel a submitted run (scancel / qdel) and wait until the scheduler says it has ended."""
    from podrun.jobscript.submit import wait as wait_job

    cl, job_id, rec = _resolve(target, scheduler)
    before = cl.state(job_id)
    if before.final:
        st = before
    else:
        cl.cancel(job_id)
        st = cl.state(job_id) if no_wait else wait_job(cl, job_id, poll=0.5, timeout=timeout)
    out = {"job_id": job_id, "scheduler": cl.name, "was": before.state, **st.to_dict()}
    if as_json:
        from podrun.cli.render import print_json
        print_json(out)
    else:
        click.echo(f"job {job_id} ({cl.name}): {before.state} -> {st.state}")
