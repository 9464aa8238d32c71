"""What `podrun top` shows of a run: the run directory it names (this user's own, as `podrun resume` requires) and
its live state, asked of its controller over the control socket (podrun.live.state's record) or, where none answers
(a batch job's controller on another node, an ended run), made from the run directory's records (summary.json,
metrics.jsonl); torch-free and rich-free (podrun.cli.top_cmd renders it)."""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from podrun.errors import LaunchError
from podrun.redaction import escape_controls as esc
from podrun.live.state import STATE_ASK, cause_line, host_counts, host_row
from podrun.rundir.layout import CONTROL_SOCKET, METRICS, SPLIT_PARTS, SUMMARY, check_run_id
from podrun.rundir.metrics import new_records
from podrun.rundir.summary import Summary
from podrun.safefs import RECORD_LIMIT, check_dir, read_trusted
from podrun.wire.owner import listening

TAIL_BYTES = 1 << 16            # of metrics.jsonl read for its last records


def find(run: str | None, runs_dir: str, command: str = "top") -> Path:
    """RUN's directory for `podrun COMMAND` (a run id in ``runs_dir``, or a run directory's path; None: the newest
    running one there), refused unless it is a directory of this user that no one else may write
    (podrun.safefs.check_dir, as `podrun resume` refuses); the user's words escaped in every message."""
    if run is None:
        base = Path(runs_dir)
        try:
            found = sorted((d for d in base.glob("*") if listening(d)), key=lambda d: d.stat().st_mtime) \
                if base.is_dir() else []
        except OSError as exc:
            raise LaunchError(f"cannot read --runs-dir {esc(str(base))}: {exc.strerror or exc}") from None
        if not found:
            raise LaunchError(f"no running launch in {esc(str(base))} (no run directory there has a live "
                              f"{CONTROL_SOCKET})", hint=f"give the run: podrun {command} RUN, or --runs-dir where it runs")
        target = found[-1]
    else:
        if os.sep not in run:
            check_run_id(run, "RUN")             # a plain name: a run id in --runs-dir (at most 128 characters)
        target = Path(os.path.abspath(run)) if os.sep in run or os.path.isdir(run) else Path(runs_dir) / run
    try:
        is_dir = target.is_dir()
    except OSError as exc:
        raise LaunchError(f"{esc(str(target))[:300]}: {exc.strerror or exc}",
                          hint="give a run directory or a run id in --runs-dir") from None
    if not is_dir:
        raise LaunchError(f"{esc(str(target))}: no such run directory", hint="give a run directory or a run id in --runs-dir")
    return check_dir(target, "run directory", shared_read=True, error=LaunchError,
                     hint=f"podrun {command} reads run directories of your own")


def state(run_dir: Path) -> dict[str, Any]:
    """The run's live state: its controller's answer (``source``: "controller"), else its records' ("records")."""
    from podrun.launch import control
    from podrun.wire.control import Ask

    if listening(run_dir):
        try:
            reply = control.ask(str(run_dir), Ask(STATE_ASK), timeout=10.0)
            if isinstance(reply, dict) and "error" not in reply and isinstance(reply.get("hosts"), list):
                return {**reply, "source": "controller"}
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ECONNREFUSED, None) and not isinstance(exc, TimeoutError):
                raise LaunchError(f"cannot ask run {run_dir.name} for its state: {exc.strerror or exc}") from None
        except ValueError:
            pass
    return from_records(run_dir)


def _last_records(run_dir: Path) -> list[dict]:
    """metrics.jsonl's well-formed records in its last TAIL_BYTES (a line cut at the start reads as none)."""
    try:
        size = os.lstat(run_dir / METRICS).st_size
    except OSError:
        return []
    return new_records(run_dir / METRICS, max(size - TAIL_BYTES, 0))[0]


def from_records(run_dir: Path) -> dict[str, Any]:
    """The state the run directory's records give: the last step of metrics.jsonl; once an attempt ended, each
    host's end, the account and the root cause from summary.json."""
    try:
        summary = json.loads(read_trusted(run_dir / SUMMARY, SUMMARY, limit=RECORD_LIMIT, error=LaunchError))
    except (OSError, ValueError):
        summary = None
    summary = summary if isinstance(summary, dict) else {}
    account = summary.get("account")          # shown as recorded (its figures as rounded there)
    summary = Summary.from_dict(summary)
    records = _last_records(run_dir)
    steps = [r for r in records if r.get("kind") == "step"]
    last = steps[-1] if steps else {}
    starts = [r for r in records if r.get("kind") == "run" and r.get("event") in ("start", "resume")]
    attempts = summary.attempts
    cause = (attempts[-1].root_cause if attempts else None) or summary.root_cause
    slow = {r.get("rank") for r in summary.slow_ranks}
    ranks = [{"rank": int(r), "host": v.get("host"), "busy_s": None, "reports": v.get("reports"), "slow": int(r) in slow,
              "split": {k: v.get(k) for k in SPLIT_PARTS}}
             for r, v in (summary.step_split.get("ranks") or {}).items() if str(r).isdigit()]
    hosts = [host_row(i.get("host"), i.get("index"), i.get("status"), None, i.get("exit_code"), ranks)
             for i in summary.instances]
    total = last.get("total", (starts[-1] if starts else {}).get("total_steps"))
    return {"run_id": summary.run_id or run_dir.name, "run_dir": str(run_dir), "recipe": None, "cluster": None,
            "transport": summary.transport, "restarts": max(len(attempts) - 1, 0), "running": False,
            "step": last.get("step"), "total": total if isinstance(total, int) else None, "epoch": last.get("epoch"),
            "loss": last.get("loss"), "samples_per_sec": last.get("images_per_sec", last.get("samples_per_sec")),
            "time_left_s": None, "account": account, "hosts": hosts, "ranks": ranks,
            **host_counts(hosts), "hosts_running": 0, "slow_ranks": sorted(r for r in slow if isinstance(r, int)),
            "slow_ratio": None, "root_cause": cause_line(cause) if isinstance(cause, dict) else None,
            "status": summary.status, "source": "records"}
