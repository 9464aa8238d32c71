"""`podrun report [RUN_DIR]`: a training run's summary and curves, or what a plain command's run recorded."""
from __future__ import annotations

import click


@click.command("report")
@click.argument("run_dir", type=click.Path(), required=False)
@click.option("--runs-dir", default="runs", show_default=True,
              help="Where to find the newest run when RUN_DIR is left out.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="PNG to draw the curves to (default: RUN_DIR/report.png).")
@click.option("--no-plot", is_flag=True, help="Print the summary only.")
def report(run_dir: str | None, runs_dir: str, as_json: bool, output: str | None, no_plot: bool) -> None:
    """Summarise a run (RUN_DIR, else the newest run in --runs-dir): training curves and figures, or a plain
    command's plan, attempts, exit codes and root cause."""
    import importlib.util
    from pathlib import Path

    from podrun.cli.render import console
    from podrun.rundir.layout import REPORT
    from podrun.rundir.report import (figures_text, launch_summary, newest_run, plot, read_run, replans, resumes,
                                     step_split, summarize, summarize_command, title_of)
    from podrun.rundir.summary import Summary

    if run_dir is None:
        run_dir = str(newest_run(runs_dir))
    run = read_run(run_dir)
    notes = list(run.problems)
    if run.skipped:
        notes.append(f"skipped {run.skipped} unreadable line(s) of {run.metrics_file} "
                     "(not UTF-8, not JSON, fields of the wrong type, or a record without the fields the "
                     "report draws)")
    if not run.trained:
        if run.metrics_file is not None:
            notes.append(f"{run.metrics_file} records no training step")
        _command(run, {**summarize_command(run), "step_split": step_split(run.launch, run.plan)}, notes, as_json)
        return
    summary = {"kind": "training", "run_dir": str(run_dir), **summarize(run.records)}
    launched = launch_summary(run.launch)
    if launched is not None:
        summary["launch"] = launched
    summary["replans"] = replans(run.launch)
    summary["resumes"] = resumes(run.records)
    launch = run.launch or Summary()
    summary["account"] = None if launch.account is None else launch.account.to_dict()
    summary["step_split"] = step_split(run.launch, run.plan)
    if not no_plot and importlib.util.find_spec("matplotlib") is None:
        no_plot = True
        notes.append("curves not drawn: matplotlib is not installed here (pip install matplotlib, or podrun's "
                     "train extra: pip install 'podrun[train]')")
    if not no_plot:
        base = Path(run_dir)
        target = Path(output) if output else (base if base.is_dir() else base.parent) / REPORT
        summary["plot"] = str(plot(run.records, target, title=title_of(run, summary), replanned=summary["replans"],
                                   slow=launch.slow_ranks, host_busy=launch.host_busy, account=launch.account,
                                   attempts=launch.attempts))
    if _as_json(summary, run, notes, as_json):
        return
    c = console()
    state = "finished" if summary["finished"] else "not finished"
    c.print(f"[bold]{run_dir}[/bold]: {summary['steps']}/{summary['total_steps']} steps ({state}), "
            f"{summary['epochs']} epoch(s), {summary['restarts']} restart(s)")
    c.print(f"  decomposition: {summary['world_size']} workers on {summary['instances']} instance(s), "
            f"local batch {summary['local_batch']} x GA {summary['grad_accum']} -> global batch "
            f"{summary['global_batch']} ({summary['device']})")
    c.print(f"  {figures_text(summary)}", markup=False)
    c.print(f"  loss {summary['first_loss']:.4f} at the first step; train accuracy "
            f"{summary['final_train_accuracy']:.4f}" + (f", val loss {summary['final_val_loss']:.4f}"
                                                        if "final_val_loss" in summary else ""))
    wall = f" over {summary['run_seconds']:.1f}s of wall time" if summary.get("run_seconds") is not None else ""
    c.print(f"  per step: {summary['images_per_sec_median']:.1f} img/s total (median), "
            f"{summary['images_per_sec_instance_median']:.1f} per instance; {summary['train_seconds']:.1f}s "
            f"training{wall}")
    if launched is not None:
        c.print(f"  launch: {launched['status']}, exit {launched['exit_code']}, "
                f"{_seconds(launched['duration_s'])}", markup=False)
        for a in launched["attempts"]:
            c.print(f"  {_attempt_line(a)}", markup=False)
    for r in summary["resumes"]:
        where = r["resumed_from"] or r["source"]
        c.print(f"  resumed at step {r['step']} from {where}" + (f" ({r['why']})" if r["why"] else ""), markup=False)
        for x in r["rejected"]:
            c.print(f"    passed over {x.get('path')}: {x.get('why')}", markup=False)
    _said_last(summary, launch.account, lambda text: c.print(text, markup=False))
    if "plot" in summary:
        c.print(f"  curves: {summary['plot']}")
    for note in notes:
        c.print(f"  note: {note}", markup=False)


def _attempt_line(a: dict) -> str:
    """One attempt: ``attempt N`` (a restart count) of the first launch, ``resume L attempt N`` of a later one."""
    launch = a.get("launch")
    who = f"attempt {a['restart_count']}" if launch in (0, None) else f"resume {launch} attempt {a['restart_count']}"
    return f"{who}: {a['status']}, exit code {a['exit_code']}" + (f" ({a['root_cause']})" if a["root_cause"] else "")


def _replan_line(r: dict) -> str:
    """One elastic re-plan: where, what was lost, the decomposition before and after, where the next attempt
    resumed from, time to train again."""
    from podrun.rundir.report import describe_replan

    at = f" after step {r['step']}" if r["step"] is not None else ""
    after = f"; training again {_seconds(r['training_after_s'])} after the loss" \
        if r["training_after_s"] is not None else ""
    res = r.get("resumed_from") or {}
    src = {"snapshot": f"the snapshot of step {res.get('step')} (rank {res.get('from_rank')})",
           "checkpoint": f"the checkpoint of step {res.get('step')}"}.get(res.get("source"))
    resumed = f"; resumed from {src}" if src else ""
    if r.get("path") == "in-place":
        parts = r.get("breakdown") or {}
        named = (("detection", "detection"), ("abort", "abort"), ("reform", "re-form"), ("reshard", "re-shard"),
                 ("first_step", "first step"))
        spans = ", ".join(f"{label} {parts[k]:.2f}s" for k, label in named
                          if isinstance(parts.get(k), (int, float)))
        resumed = "; recovered in place (the survivors kept their processes)" + (f" [{spans}]" if spans else "")
    elif r.get("inplace_failed"):
        resumed += f"; restarted, not in place: {r['inplace_failed']}"
    return (f"re-plan{at}: lost {', '.join(r['hosts_lost']) or 'no host'}, {describe_replan(r)}, "
            f"global batch {r['new'].get('global_batch')}{resumed}{after}")


def _split_lines(sp: dict | None) -> list[str]:
    """The step split's lines: measured (mean over ranks, the slowest rank), the plan's estimate, the term furthest
    off, an input-bound run."""
    from podrun.rundir.layout import SPLIT_PARTS

    if sp is None:
        return []

    def parts(d: dict) -> str:
        return ", ".join(f"{k} {d[k] * 1000:.1f} ms" for k in SPLIT_PARTS)

    slow = sp["slowest"]
    lines = [f"step split, mean of {sp['ranks']} rank(s): {parts(sp['measured'])}; slowest rank {slow['rank']} on "
             f"{slow['host']}: {parts(slow)}"]
    if sp["estimate"] is not None:
        off = sp["furthest_off"]
        lines.append(f"the plan's estimate: {parts(sp['estimate'])}; furthest off: {off['term']} "
                     f"({off['measured_s'] * 1000:.1f} ms measured, {off['estimate_s'] * 1000:.1f} ms estimated): "
                     f"the assumption to check is {off['assumption']}")
    if sp.get("input_bound"):
        b = sp["input_bound"]
        lines.append(f"input-bound: every rank waited for input {b['min_share']:.0%} (least) to {b['max_share']:.0%} "
                     "of its step")
    return lines


def _seconds(v) -> str:
    from podrun.rundir.metrics import is_number

    return f"{v:.1f}s" if is_number(v) else "duration unknown"


def _as_json(s: dict, run, notes: list[str], as_json: bool) -> bool:
    """Add the lines skipped and the notes to the report ``s``; printed as JSON when asked (then it is done)."""
    from podrun.cli.render import print_json

    s["skipped_lines"] = run.skipped
    s["notes"] = notes
    if as_json:
        print_json(s)
    return as_json


def _command(run, s: dict, notes: list[str], as_json: bool) -> None:
    """Print what a run without training steps recorded."""
    import shlex

    from podrun.cli.render import console

    if _as_json(s, run, notes, as_json):
        return
    c = console()

    def say(text: str) -> None:  # the values are the run's own: no rich markup
        c.print(text, markup=False, highlight=False, soft_wrap=True)

    cmd = shlex.join(str(x) for x in s["command"]) if isinstance(s["command"], list) else s["command"]
    say(f"{run.path}: run {s['run_id']} of a command (no training metrics): {s['status']}, "
        f"exit code {s['exit_code']}, {s['restarts'] if s['restarts'] is not None else 0} restart(s)")
    if cmd:
        say(f"  command: {cmd} (transport {s['transport']})")
    if s["plan"]:
        p = s["plan"]
        hosts = p.get("hosts")
        say(f"  plan: {len(hosts) if isinstance(hosts, list) else '?'} host(s), {p.get('instances')} instance(s), "
            f"{p.get('replicas')} worker(s)")         # no training steps: no batch, no goodput
    for a in s["attempts"]:
        say(f"  {_attempt_line(a)}")
    rc = s["root_cause"]
    if rc:
        from podrun.cli.render import key_line

        key = key_line(rc.get("last_lines") or [])
        say(f"  root cause: instance {rc.get('instance')} on {rc.get('host')}, local rank {rc.get('local_rank')}: "
            f"{key or rc.get('reason')}" + (f" ({rc.get('reason')})" if key else ""))
        for line in (rc.get("last_lines") or [])[-5:]:
            say(f"    {line}")
    if s.get("error"):
        say(f"  error: {s['error']}")
    for problem in s.get("problems") or []:
        say(f"  preflight: {problem}")
    if s["duration_s"] is not None:
        ready = f", all instances ready after {_seconds(s['all_ready_s'])}" if s["all_ready_s"] is not None else ""
        say(f"  duration {_seconds(s['duration_s'])}{ready}")
    for i in s["instances"]:
        say(f"  instance {i['index']} on {i['host']}: {i['status']}, exit code {i['exit_code']}, "
            f"ready {_seconds(i['ready_s'])}, ended {_seconds(i['ended_s'])}")
    acc = run.launch.account if run.launch is not None else None
    # a command whose ranks reported steps (podrun.runtime) trained: its goodput is one
    _said_last(s, acc, say, trained=acc is not None and acc.run.seconds.get("training", 0.0) > 0)
    for note in notes:
        say(f"  note: {note}")


def _said_last(s: dict, acc, say, trained: bool = True) -> None:
    """Either report's re-plans, the run's account as a short table (podrun.rundir.report.account_lines, when
    summary.json has one) and the step split, each line through ``say``."""
    from podrun.rundir.report import account_lines

    for line in [*map(_replan_line, s["replans"]), *(account_lines(acc, trained) if acc is not None else ()),
                 *_split_lines(s["step_split"])]:
        say(f"  {line}")
