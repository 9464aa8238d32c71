"""Summarise a run directory: a training run's metrics.jsonl (and its curves, matplotlib Agg, lazily), or what a
plain command's run has (plan.json, summary.json: attempts, exit codes, root cause, durations)."""
from __future__ import annotations

import contextlib
import shlex
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podrun import safefs
from podrun.errors import PodrunError
from podrun.human import human_seconds
from podrun.rundir.account import CATEGORIES, ENDED_BADLY, LABELS, Account
from podrun.rundir.layout import COMMAND, METRICS, PLAN, SPLIT_PARTS, SUMMARY, instance_log
from podrun.rundir.metrics import StepLog, complete, is_integer, is_number, latest_by_step, read_metrics_counted
from podrun.rundir.summary import Summary, typed, read_json, read_summary


@dataclass
class RunRecord:
    """What a run directory holds that a report can use."""

    path: Path                                        # the run directory
    records: list[dict] = field(default_factory=list)  # metrics.jsonl's readable records
    skipped: int = 0                                  # metrics.jsonl lines unreadable or without the fields drawn
    metrics_file: Path | None = None                  # None: the run has no metrics.jsonl
    launch: Summary | None = None                     # summary.json
    plan: dict | None = None                          # plan.json
    problems: list[str] = field(default_factory=list)  # files present but unreadable

    @property
    def trained(self) -> bool:
        return any(r.get("kind") == "step" for r in self.records)


def read_run(run_dir: str | Path) -> RunRecord:
    """Read RUN_DIR (or a metrics.jsonl file); exit 2 with a clear message when nothing in it can be reported."""
    p = Path(run_dir)
    if not p.exists():
        raise PodrunError(f"{p}: no such run directory", hint="pass a run directory, e.g. runs/<run-id>")
    base = p.parent if p.is_file() else p
    run = RunRecord(path=base)
    f = p if p.is_file() else p / METRICS
    if f.is_file():
        run.metrics_file = f
        try:
            records, run.skipped = read_metrics_counted(f)
        except OSError as exc:
            raise PodrunError(f"{f}: cannot be read ({exc.strerror or exc})") from None
        run.records = [r for r in records if complete(r)]       # the curves need every field the runner writes
        run.skipped += len(records) - len(run.records)
    if not p.is_file():
        run.launch = read_summary(base, run.problems)
        run.plan = read_json(base / PLAN, run.problems)
    if run.trained or run.launch is not None or run.plan is not None:
        return run
    if run.metrics_file is None:
        raise PodrunError(
            f"{p}: no {METRICS}, {SUMMARY} or {PLAN} in this run directory"
            + (f" ({'; '.join(run.problems)})" if run.problems else ""),
            hint="metrics are written by the recipes' train.py (podrun.train), summary.json and plan.json by "
                 "podrun launch; did the run start?")
    if run.skipped:
        raise PodrunError(f"{f}: none of its lines could be read ({run.skipped} skipped: not UTF-8, not JSON, "
                          "fields of the wrong type, or records without the fields the report draws), and no training step is left to report",
                          hint="the file is damaged; the checkpoints, if any, are not affected")
    raise PodrunError(f"{f}: no training steps recorded yet")


RUN_FILES = (METRICS, SUMMARY, PLAN, COMMAND, instance_log(0))   # what makes a directory a run


def written_at(run: Path) -> float | None:
    """When the run was last written to (its newest RUN_FILES file), None: not a run."""
    times = []
    for name in RUN_FILES:
        with contextlib.suppress(OSError):       # absent, or not a directory
            times.append((run / name).stat().st_mtime)
    return max(times) if times else None


def newest_run(runs_dir: str | Path) -> Path:
    """The run directory in ``runs_dir`` written to last (its newest metrics.jsonl, summary.json, plan.json,
    command or instance-0.log), or a PodrunError (exit 2) when it holds none."""
    d = Path(runs_dir)
    hint = "pass a run directory (podrun report runs/<run-id>), or --runs-dir where podrun launch wrote its runs"
    if not d.is_dir():
        raise PodrunError(f"--runs-dir {d}: no such directory, so there is no newest run to report", hint=hint)
    best = max(((t, sub.name) for sub in d.iterdir() if (t := written_at(sub)) is not None), default=None)
    if best is None:
        raise PodrunError(f"--runs-dir {d}: holds no run (no directory with {', '.join(RUN_FILES)})", hint=hint)
    return d / best[1]


def pointers(run_dir: str | Path) -> str:
    """The run's last console line's tail: where the kept checkpoints are (from the run's end record, when
    it trained) and the command that reports it."""
    out = []
    end = StepLog.read(run_dir).end or {}
    names, where = end.get("checkpoints"), end.get("checkpoint_dir")
    if isinstance(names, list) and isinstance(where, str):
        keep, size = end.get("keep_checkpoints"), end.get("checkpoint_bytes")
        why = [f"{size / 1e6:.1f} MB"] if is_integer(size) and names else []
        why += [f"--keep-checkpoints {keep}"] if is_integer(keep) else []
        why_s = f" ({', '.join(why)})" if why else ""
        if names:
            with contextlib.suppress(ValueError):          # inside the run directory: said from there
                where = str(Path(where).relative_to(run_dir)) + "/"
            out.append(f"{len(names)} checkpoint(s){why_s} in {where}: {', '.join(map(str, names))}")
        else:
            out.append(f"no checkpoint kept{why_s}")
    out.append(f"report: podrun report {shlex.quote(str(run_dir))}")
    return "; ".join(out)


def warmup_steps(n: int) -> int:
    """How many of a run's first ``n`` step records are warm-up, left out of throughput figures and curves:
    a tenth, at least 1, never all."""
    return min(n - 1, max(1, n // 10))


def summarize(records: list[dict]) -> dict[str, Any]:
    steps = latest_by_step(records, "step")
    evals = latest_by_step(records, "eval")
    starts = [r for r in records if r.get("kind") == "run" and r.get("event") in ("start", "resume")]
    ends = [r for r in records if r.get("kind") == "run" and r.get("event") == "end"]
    first = starts[0] if starts else {}
    steady = steps[warmup_steps(len(steps)):]
    tail = steps[-min(len(steps), 10):]
    out: dict[str, Any] = {
        "steps": steps[-1]["step"],
        "total_steps": first.get("total_steps"),
        "finished": bool(ends) and ends[-1].get("step") == steps[-1]["step"],
        "restarts": sum(1 for r in starts if r.get("event") == "resume"),
        "epochs": steps[-1]["epoch"] + 1,
        **{k: first.get(k) for k in ("world_size", "instances", "local_batch", "grad_accum", "global_batch",
                                     "device")},
        "first_loss": steps[0]["loss"],
        "final_loss": statistics.fmean(r["loss"] for r in tail),
        "final_train_accuracy": statistics.fmean(r["accuracy"] for r in tail),
        "images_per_sec_median": statistics.median(r["images_per_sec"] for r in steady),
        "images_per_sec_instance_median": statistics.median(r.get("images_per_sec_instance", 0) for r in steady),
        "train_seconds": sum(r.get("step_seconds", 0.0) for r in steps),
        "final_loss_steps": len(tail),
    }
    # over the whole run: its images (each step once, at the run's global batch) over the wall time from its first
    # record to its last (evaluations, checkpoints and restarts included)
    times = [r["time"] for r in records if is_number(r.get("time"))]
    wall = max(times) - min(times) if times else None
    out["run_seconds"] = wall
    gb = first.get("global_batch")
    out["images_per_sec_run"] = len(steps) * gb / wall if is_integer(gb) and wall is not None and wall > 0 else None
    if evals:
        out["final_val_accuracy"] = evals[-1]["val_accuracy"]
        out["best_val_accuracy"] = max(r["val_accuracy"] for r in evals)
        out["final_val_loss"] = evals[-1]["val_loss"]
    return out


def summarize_command(run: RunRecord) -> dict[str, Any]:
    """A run without training steps (a plain command, or a training that never reached step 1): what podrun
    recorded of it, from plan.json and summary.json."""
    s, plan = run.launch or Summary(), run.plan or {}
    out: dict[str, Any] = {
        "kind": "command",
        "run_dir": str(run.path),
        "run_id": s.run_id,
        "status": s.status if run.launch is not None else "unknown (no summary.json: still running, "
                                                          "or podrun itself was ended)",
        "exit_code": s.exit_code,
        "transport": s.transport,
        "command": None if s.command is None else list(s.command),
        "restarts": s.restart_count,
        "plan": {k: plan.get(k) for k in ("cluster", "hosts", "devices", "replicas", "instances", "local_batch",
                                          "grad_accum", "global_batch") if k in plan} or None,
        "attempts": attempt_rows(s),
        "root_cause": None if s.root_cause is None else {
            k: s.root_cause[k] for k in ("instance", "host", "local_rank", "exit_code", "reason", "last_lines")
            if k in s.root_cause},
        "duration_s": s.duration_s,
        "all_ready_s": s.all_ready_s,
        "instances": [{k: i.get(k) for k in ("index", "host", "status", "exit_code", "ready_s", "ended_s")}
                      for i in s.instances],
        "replans": replans(run.launch),
        "account": None if s.account is None else s.account.to_dict(),
    }
    more = {"error": s.error, "problems": None if s.problems is None else list(s.problems)}
    return {**out, **{k: v for k, v in more.items() if v is not None}}


def attempt_rows(s: Summary) -> list[dict[str, Any]]:
    """summary.json's attempts, every launch's (``launch``: 0 the first, 1 its first `podrun resume`, ...)."""
    return [{"launch": a.launch, "restart_count": a.restart_count, "exit_code": a.exit_code, "status": a.status,
             "root_cause": a.root_cause.get("reason") if isinstance(a.root_cause, dict) else None}
            for a in s.attempts]


def resumes(records: list[dict]) -> list[dict[str, Any]]:
    """Each resume of a training run: the step, where from and why, and the newer checkpoints passed over."""
    return [{"step": r.get("step"), "source": r.get("source"), "resumed_from": r.get("resumed_from"),
             "why": r.get("why"), "rejected": [x for x in r.get("rejected") if isinstance(x, dict)]
             if isinstance(r.get("rejected"), list) else []}
            for r in records if r.get("kind") == "run" and r.get("event") == "resume"]


def launch_summary(launch: Summary | None) -> dict[str, Any] | None:
    """The launcher's view of a training run (status, exit code, restarts, duration, every attempt), when podrun
    launched it."""
    return None if launch is None else {"status": launch.status, "exit_code": launch.exit_code,
                                        "restarts": launch.restart_count, "duration_s": launch.duration_s,
                                        "attempts": attempt_rows(launch)}


# a run without training steps (a plain command): what its account's training-only categories amount to
COMMAND_RAN = ("startup", "training", "evaluation", "checkpoint")
COMMAND_LABEL = "the command running"


def account_lines(acc: Account, trained: bool = True) -> list[str]:
    """The account as a short table: its wall time and goodput, one line per category that took time (seconds and
    share of the wall), then one line per attempt when there were more than one. Not ``trained`` (a plain command:
    no steps), no goodput, and the time after the launch is the command's (COMMAND_RAN's categories, as one)."""
    wall = acc.run.wall_s
    g = acc.run.goodput if trained else None
    out = [f"where the time went: {human_seconds(wall)}" + (f", goodput {g:.1%} (training / wall)" if g is not None
                                                            else "")]
    seconds = dict(acc.run.seconds)
    labels = dict(LABELS)
    categories = list(CATEGORIES)
    if not trained:
        seconds["command"] = sum(seconds.pop(c, 0.0) for c in COMMAND_RAN)
        labels["command"] = COMMAND_LABEL
        categories = [c for c in categories if c not in COMMAND_RAN]
        categories.insert(categories.index("launch") + 1, "command")
    width = max(len(labels[c]) for c in categories)
    for c in categories:
        secs = seconds.get(c, 0.0)
        if secs > 0 or c == ("training" if trained else "command"):
            out.append(f"  {labels[c]:<{width}}  {human_seconds(secs):>9}  {secs / wall if wall > 0 else 0:6.1%}")
    if len(acc.attempts) > 1 and trained:
        for i, a in enumerate(acc.attempts):
            ga = a.goodput
            out.append(f"  attempt {i}: {human_seconds(a.wall_s)}, goodput {ga:.1%}, failure "
                       f"{human_seconds(a.seconds.get('failure', 0.0))}" if ga is not None else f"  attempt {i}: -")
    return out


def replans(launch: Summary | None) -> list[dict]:
    """The elastic re-plans summary.json records: step, hosts before and after, decomposition before and after."""
    return [{"step": r.get("at_step"), "hosts_lost": r.get("hosts_lost") or [], "old": r.get("old") or {},
             "new": r["new"], "training_after_s": r.get("training_after_s"),
             "resumed_from": typed(r.get("resumed_from"), dict), "path": typed(r.get("path"), str),
             "breakdown": typed(r.get("breakdown"), dict), "inplace_failed": typed(r.get("inplace_failed"), str)}
            for r in (launch.replans if launch is not None else ()) if isinstance(r.get("new"), dict)]


def _hosts_change(r: dict) -> str:
    return f"{len(r['old'].get('hosts') or [])} -> {len(r['new'].get('hosts') or [])} hosts"


def describe_replan(r: dict) -> str:
    """'4 -> 3 hosts (GA 3 -> 4)': one re-plan in a few words, for the curves and the summary."""
    old, new = r["old"], r["new"]
    return f"{_hosts_change(r)} (local batch {old.get('local_batch')} x GA {old.get('grad_accum')} -> " \
           f"{new.get('local_batch')} x GA {new.get('grad_accum')})"


def title_of(run: RunRecord, summary: dict[str, Any]) -> str:
    """The PNG's title: what ran (recipe, cluster, decomposition), how it ended (status, steps, final metric) and
    the run directory's name. From plan.json and summary.json where the run has them, else from metrics.jsonl's
    start record."""
    plan = run.plan or {}
    hosts = plan.get("hosts")
    what = " on ".join(str(x) for x in (plan.get("recipe"), plan.get("cluster")) if x) or "training run"
    where = f"{len(hosts)} host(s), " if isinstance(hosts, list) else ""
    replicas = plan.get("replicas", summary.get("world_size"))
    decomposition = (f"{where}{replicas} replicas x local batch {summary.get('local_batch')} x GA "
                     f"{summary.get('grad_accum')} = global batch {summary.get('global_batch')}")
    launch = run.launch
    status = f"launch {launch.status} (exit {launch.exit_code})" if launch is not None and launch.status else \
        ("finished" if summary.get("finished") else "not finished")
    return (f"{what}: {decomposition}\n{status}, step {summary['steps']}/{summary.get('total_steps') or '?'}, "
            f"{figures_text(summary)}  ({run.path.name})")


def figures_text(summary: dict[str, Any]) -> str:
    """The run's figures as the console's end, the report and the PNG's title all say them (one wording, one
    rounding): whole-run throughput, final train loss (the last steps' mean), validation accuracy (else train)."""
    parts = []
    if summary.get("images_per_sec_run") is not None:
        parts.append(f"{summary['images_per_sec_run']:,.1f} img/s over the run")
    parts.append(f"train loss {summary['final_loss']:.4f} (mean of the last {summary['final_loss_steps']} steps)")
    if "final_val_accuracy" in summary:
        parts.append(f"val accuracy {summary['final_val_accuracy']:.4f} (best {summary['best_val_accuracy']:.4f})")
    else:
        parts.append(f"train accuracy {summary['final_train_accuracy']:.4f}")
    return ", ".join(parts)


def end_lines(run_dir: str | Path) -> list[str] | None:
    """The figures a finished training run's end block on the console says (figures_text of its metrics.jsonl),
    after its steps and wall time; None where the run recorded no training step."""
    try:
        run = read_run(Path(run_dir) / METRICS)
    except PodrunError:
        return None
    if not run.trained:
        return None
    summary = summarize(run.records)
    wall = f" in {human_seconds(summary['run_seconds'])} after start-up" if summary.get("run_seconds") is not None \
        else ""
    epochs = summary["epochs"]
    return [f"{summary['steps']} steps ({epochs:g} epoch{'' if epochs == 1 else 's'}){wall}",
            figures_text(summary)]


SHOWN_HOSTS = 3          # at scale the per-host panel draws the slowest and the fastest this many hosts


def figure(records: list[dict], title: str = "", replanned: list[dict] = (), slow: tuple[dict, ...] = (),
           host_busy: dict | None = None, account: Account | None = None, attempts: tuple = ()):
    """The curves as a matplotlib Figure (Agg): loss, accuracy, images/s; whole steps on every x axis.

    Loss: the y axis fits the training curve; an evaluation loss above it (an early, untrained one) is drawn
    at the top edge as a triangle with its value, and the evaluation line is broken there. Images/s: the warm-up
    steps are left out. metrics.jsonl is rank 0's: its per-instance rate is the total's share (total x local
    ranks / ranks), not a measurement of each host, so it is drawn as the mean per instance, and only when it
    differs from the total (more than one instance). What the run measured per host is its slow ranks
    (summary.json's ``slow_ranks``, from every rank's busy time): each is drawn as a red span over the steps it was
    slow, named with its host and how much slower it was. With ``host_busy`` of more than one host (summary.json's:
    each host's own work per step), a fourth panel draws one line per host (at scale the SHOWN_HOSTS slowest and
    fastest by their median), so a slow host shows where the run's img/s cannot. With the run's ``account``, a
    stacked bar under the curves: where the wall time went, the run's and each attempt's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    steps = latest_by_step(records, "step")
    evals = latest_by_step(records, "eval")
    xs = [r["step"] for r in steps]
    hosts = _shown_hosts(host_busy or {})
    cols = 4 if hosts else 3
    if account is None:
        fig, ax = plt.subplots(1, cols, figsize=(5 * cols, 4))
    else:
        fig, grid = plt.subplots(2, cols, figsize=(5 * cols, 6.5), gridspec_kw={"height_ratios": [4, 1.4]})
        ax = grid[0]
        for a in grid[1]:
            a.remove()
        timeline(fig.add_subplot(grid[1, 0].get_gridspec()[1, :]), records, account, attempts)
    for host in hosts:
        ax[3].plot([p[0] for p in host_busy[host]], [p[1] * 1000 for p in host_busy[host]], label=host)
    if hosts:
        ax[3].set_ylabel("ms of its own work per step")
    losses = [r["loss"] for r in steps]
    ax[0].plot(xs, losses, label="train loss")
    if evals:
        top = max(losses) * 1.1
        ex, ev = [r["step"] for r in evals], [r["val_loss"] for r in evals]
        ax[0].plot(ex, [v if v <= top else float("nan") for v in ev], "o-", color="tab:orange", label="val loss")
        over = [(x, v) for x, v in zip(ex, ev) if v > top]
        if over:                      # off the axis: a triangle on the top edge, the line broken there
            ax[0].set_ylim(top=top)
            ax[0].plot([x for x, _ in over], [top] * len(over), "^", color="tab:orange", ms=9, clip_on=False,
                       label="_val loss off the axis")
            for x, v in over:
                ax[0].annotate(f"val loss {v:.2f} (off the axis)", (x, top), xytext=(8, -2),
                               textcoords="offset points", va="top", fontsize=8, color="tab:orange")
    ax[1].plot(xs, [r["accuracy"] for r in steps], label="train (per step)", alpha=0.6)
    if evals:
        ax[1].plot([r["step"] for r in evals], [r["val_accuracy"] for r in evals], "o-", label="validation")
    ax[1].set_ylim(0, 1)
    skip = warmup_steps(len(steps))
    steady = steps[skip:]
    sx = [r["step"] for r in steady]
    total = [r["images_per_sec"] for r in steady]
    per = [r.get("images_per_sec_instance", t) for r, t in zip(steady, total)]
    if any(abs(p - t) > 1e-9 * t for p, t in zip(per, total)):
        ax[2].plot(sx, total, label="total")
        ax[2].plot(sx, per, label="mean per instance")
    else:
        ax[2].plot(sx, total, label="total (1 instance)")
    last = xs[-1]
    for r in slow:                    # a rank named slow: a span from where it was named to where it recovered
        start, until = r.get("from_step"), r.get("until_step")
        if is_integer(start):
            ax[2].axvspan(start, until if is_integer(until) else last, color="tab:red", alpha=0.12)
            ratio = r.get("max_ratio") or r.get("ratio")
            ax[2].annotate(f" slow: rank {r.get('rank')} on {r.get('host')}"
                           + (f" ({ratio:.1f}x)" if isinstance(ratio, (int, float)) else ""),
                           (start, 0.02 + 0.08 * (len(ax[2].texts) % 4)), xycoords=("data", "axes fraction"),
                           fontsize=8, color="tab:red")
    for a, what in zip(ax, ("loss", "accuracy", f"images/s (after {skip} warm-up step{'s' if skip != 1 else ''})",
                            f"busy per host ({len(hosts)} of {len(host_busy or {})})")):
        a.set_xlabel("step")
        a.set_title(what)
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
        a.legend()
    for r in records:
        if r.get("kind") == "run" and r.get("event") == "resume" and "step" in r:
            for a in ax:
                a.axvline(r["step"], color="grey", ls=":", lw=1)
    for r in replanned:               # an elastic re-plan: a red line where the lost host's step ended
        if isinstance(r["step"], int):
            for a in ax:
                a.axvline(r["step"], color="tab:red", ls="--", lw=1)
            ax[0].annotate(f" re-plan: {_hosts_change(r)}", (r["step"], 1), xycoords=("data", "axes fraction"),
                           va="top", ha="left", fontsize=8, color="tab:red")
    _epochs_lr_and_wall(ax, steps)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def _epochs_lr_and_wall(ax, steps: list[dict]) -> None:
    """On the curves: each epoch's first step as a dotted line (named on the loss panel), the learning rate on the
    loss panel's right axis, and the wall time since the first step (seconds) as the loss panel's top axis."""
    import numpy as np

    for b in [b for a, b in zip(steps, steps[1:]) if b["epoch"] != a["epoch"]]:     # each epoch's first step
        for a in ax[:2]:
            a.axvline(b["step"], color="#999999", ls=(0, (1, 3)), lw=1, label="_epoch")
        ax[0].annotate(f" epoch {b['epoch']}", (b["step"], 0.0), xycoords=("data", "axes fraction"), va="bottom",
                       fontsize=8, color="#666666")
    rates = [(r["step"], r["lr"]) for r in steps if isinstance(r.get("lr"), (int, float))]
    if rates:
        lr = ax[0].twinx()
        lr.plot([x for x, _ in rates], [v for _, v in rates], color="#9467bd", lw=1, ls="--",
                label="learning rate (right)")
        lr.set_ylabel("learning rate", color="#9467bd", fontsize=9)
        lr.tick_params(axis="y", labelsize=8, colors="#9467bd")
        lr.set_ylim(bottom=0)
        handles, labels = ax[0].get_legend_handles_labels()
        h2, l2 = lr.get_legend_handles_labels()
        ax[0].legend(handles + h2, labels + l2, fontsize=8)
    timed = [(r["step"], r["time"]) for r in steps if isinstance(r.get("time"), (int, float))]
    if len(timed) >= 2:
        xs = np.array([t[0] for t in timed], dtype=float)
        ts = np.maximum.accumulate(np.array([t[1] for t in timed], dtype=float))
        ts = ts - ts[0] + 1e-9 * np.arange(len(ts))             # strictly increasing, for the inverse
        top = ax[0].secondary_xaxis("top", functions=(lambda x: np.interp(x, xs, ts),
                                                      lambda t: np.interp(t, ts, xs)))
        top.set_xlabel("wall time since the first step (s)", fontsize=8)
        top.tick_params(labelsize=8)


COLOURS = {"queue": "#bbbbbb", "launch": "#8c564b", "staging": "#17becf", "startup": "#e377c2", "training": "#2ca02c",
           "evaluation": "#1f77b4", "checkpoint": "#ff7f0e", "failure": "#d62728", "idle": "#7f7f7f"}


def _spans(records: list[dict], attempts: tuple, wall_s: float | None = None
           ) -> tuple[float, dict[str, list[tuple[float, float]]], float]:
    """Where each account category happened, from the records' own times and the attempts' (summary.json):
    (the origin, category -> [(start, length)] in seconds after it, the end). The launch from podrun's start (the
    account's ``wall_s`` before the last attempt's end) until every instance was ready; start-up to the first
    step's start; each step's, evaluation's and checkpoint save's own seconds before its record; an attempt that
    ended badly, failure from its last record to the next attempt."""
    def t(r):
        return float(r["time"]) if is_number(r.get("time")) else None

    timed = [r for r in records if t(r) is not None]
    starts = [float(a.started) for a in attempts if isinstance(a.started, (int, float))]
    origin = min(starts + [t(r) for r in timed[:1]]) if starts or timed else 0.0
    ends = [float(a.ended) for a in attempts if isinstance(a.ended, (int, float))]
    launched = max(ends) - wall_s if ends and wall_s is not None and starts else None
    if launched is not None:
        origin = min(origin, launched)
    spans: dict[str, list[tuple[float, float]]] = {c: [] for c in CATEGORIES}

    def add(c: str, lo: float, hi: float) -> None:
        if hi > lo:
            spans[c].append((lo - origin, hi - lo))

    for kind, c, key in (("step", "training", "step_seconds"), ("eval", "evaluation", "seconds"),
                         ("checkpoint", "checkpoint", "seconds")):
        for r in timed:
            secs = r.get(key)
            if r.get("kind") == kind and is_number(secs):
                add(c, t(r) - float(secs), t(r))
    step_starts = sorted(t(r) - float(r.get("step_seconds") or 0.0) for r in timed if r.get("kind") == "step")
    end = max([t(r) for r in timed] + ends + [origin])
    for k, a in enumerate(attempts):
        if not isinstance(a.started, (int, float)) or not isinstance(a.ended, (int, float)):
            continue
        lo, hi = float(a.started), float(a.ended)
        ready = lo + float(a.all_ready_s) if isinstance(a.all_ready_s, (int, float)) else lo
        add("launch", lo, min(ready, hi))
        first = next((x for x in step_starts if lo <= x <= hi), None)
        add("startup", ready, first if first is not None else hi)
        mine = [t(r) for r in timed if lo <= t(r) <= hi]
        if a.status in ENDED_BADLY:
            after = float(attempts[k + 1].started) if k + 1 < len(attempts) and \
                isinstance(attempts[k + 1].started, (int, float)) else hi
            add("failure", max(mine) if mine and first is not None else (first or ready), max(after, hi))
        elif k == len(attempts) - 1 and mine:
            add("idle", max(mine), hi)
    if launched is not None:
        add("launch", launched, min(starts))            # podrun's own start: the plan, the run directory
    if not attempts and step_starts:
        add("startup", origin, step_starts[0])
    return origin, spans, end - origin


def timeline(ax, records: list[dict], account: Account | None, attempts: tuple = ()) -> None:
    """The run as a timeline: wall time on x, each account category drawn where it happened (_spans), epoch
    boundaries as dotted lines; the legend gives each category's seconds and share as the account (summary.json)
    has them, so the figures are the report's."""
    part = account.run if account is not None else None
    origin, spans, length = _spans(records, attempts, part.wall_s if part is not None else None)
    for c in CATEGORIES:
        if spans[c]:
            secs = part.seconds.get(c, 0.0) if part is not None else sum(w for _, w in spans[c])
            share = f" ({secs / part.wall_s:.0%})" if part is not None and part.wall_s > 0 else ""
            ax.broken_barh(spans[c], (0, 1), color=COLOURS[c], label=f"{LABELS[c]}: {human_seconds(secs)}{share}")
    steps = latest_by_step(records, "step")
    for a, b in zip(steps, steps[1:]):
        if b["epoch"] != a["epoch"] and isinstance(b.get("time"), (int, float)):
            x = b["time"] - float(b.get("step_seconds") or 0.0) - origin
            ax.axvline(x, color="black", ls=(0, (1, 3)), lw=1)
            ax.annotate(f"epoch {b['epoch']}", (x, 1.02), xycoords=("data", "axes fraction"), fontsize=8,
                        ha="center")
    ax.set_xlim(0, max(length, 1e-3))
    ax.set_ylim(0, 1)
    ax.set_yticks([])
    ax.set_xlabel("wall time since the launch (s)")
    g = part.goodput if part is not None else None
    ax.set_title("the run's time line" + (f": goodput {g:.1%} of {human_seconds(part.wall_s)}" if g is not None
                                           else ""), fontsize=10, pad=14)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=4, fontsize=9, frameon=False)


def _shown_hosts(host_busy: dict) -> list[str]:
    """The hosts the per-host panel draws: every one up to 2 x SHOWN_HOSTS, else the slowest and the fastest
    SHOWN_HOSTS by their median busy time; none for one host (its line would be the run's)."""
    if len(host_busy) < 2:
        return []
    by = sorted(host_busy, key=lambda h: (statistics.median(p[1] for p in host_busy[h]), h), reverse=True)
    return by if len(by) <= 2 * SHOWN_HOSTS else by[:SHOWN_HOSTS] + by[-SHOWN_HOSTS:]


def plot(records: list[dict], path: str | Path, **views) -> Path:
    """Draw the curves (``figure``, given ``views``: its title, re-plans, slow ranks, ...) to the PNG ``path``."""
    import matplotlib.pyplot as plt

    fig = figure(records, **views)
    path = Path(path)
    try:
        with safefs.replacing(path, "report", durable=False) as f:
            fig.savefig(f, format="png", dpi=90)
    finally:
        plt.close(fig)
    return path


def step_split(launch: Summary | None, plan: dict | None) -> dict[str, Any] | None:
    """The measured step split (summary.json's ``step_split``: input, compute, comm, optim, the mean over ranks and
    the slowest rank's: the most work of its own, comm left out) beside the plan's estimate of the same terms
    (plan.json's ``estimate``: compute from the device rate, comm the all-reduce not hidden, input as a calibration
    with --data measured it, else taken as free, optim taken as free), and the term furthest off: the assumption
    that was wrong. None when no rank reported a split."""
    ranks = (launch.step_split.get("ranks") if launch is not None else None) or {}
    rows = {r: v for r, v in ranks.items() if isinstance(v, dict) and all(
        isinstance(v.get(k), (int, float)) for k in SPLIT_PARTS)}
    if not rows:
        return None
    mean = {k: round(statistics.fmean(v[k] for v in rows.values()), 6) for k in SPLIT_PARTS}
    slowest = max(rows, key=lambda r: sum(rows[r][k] for k in SPLIT_PARTS if k != "comm"))   # its own work: the others
    # wait for it in their comm
    out: dict[str, Any] = {"ranks": len(rows), "measured": mean,
                           "slowest": {"rank": slowest, **{k: rows[slowest].get(k) for k in ("host", *SPLIT_PARTS)}},
                           "input_bound": launch.step_split.get("input_bound"), "estimate": None, "furthest_off": None}
    est = (plan or {}).get("estimate")
    terms = [est.get(k, 0.0) if isinstance(est, dict) else None
             for k in ("step_seconds", "allreduce_seconds", "allreduce_hidden_fraction")]
    if not all(map(is_number, terms)) or terms[0] <= 0:
        return out
    comm = terms[1] * (1.0 - terms[2])
    measured_input, compute = est.get("input_seconds"), est.get("compute_seconds")
    inp = measured_input if is_number(measured_input) else 0.0
    compute = compute if is_number(compute) else terms[0] - comm
    out["estimate"] = {"input": round(inp, 6), "compute": round(compute, 6), "comm": round(comm, 6),
                       "optim": 0.0, "assumptions": list(est.get("assumptions") or [])}
    term = max(SPLIT_PARTS, key=lambda k: abs(mean[k] - out["estimate"][k]))
    assumed = "the measured input rate (podrun calibrate --data)" if term == "input" and measured_input is not None \
        else _ASSUMED[term]
    out["furthest_off"] = {"term": term, "assumption": assumed, "measured_s": mean[term],
                           "estimate_s": out["estimate"][term]}
    return out


_ASSUMED = {"input": "the input pipeline is free", "compute": "the device rate",
            "comm": "the all-reduce (bandwidth, latency, the share hidden behind backward)",
            "optim": "the optimiser step is free"}
