"""The local runs under a runs directory, newest first: each one's id, status, steps, wall time, goodput and path."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from podrun.errors import PodrunError
from podrun.rundir.metrics import StepLog
from podrun.rundir.report import written_at
from podrun.rundir.summary import read_summary

NO_SUMMARY = "no summary"     # a run without summary.json: still running, or its podrun was ended


def list_runs(runs_dir: str | Path) -> list[dict[str, Any]]:
    """One row per run directory under ``runs_dir`` (as `podrun report` finds the newest): newest first."""
    d = Path(runs_dir)
    if not d.is_dir():
        raise PodrunError(f"--runs-dir {d}: no such directory",
                          hint="pass --runs-dir where podrun launch wrote its runs (default: runs)")
    found = sorted(((t, sub.name, sub) for sub in d.iterdir() if (t := written_at(sub)) is not None), reverse=True)
    rows = []
    for written, name, sub in found:
        s = read_summary(sub)
        log = StepLog.read(sub)
        acc = s.account if s is not None else None
        rows.append({
            "id": name,
            "status": NO_SUMMARY if s is None else (s.status or "unknown"),
            "exit_code": None if s is None else s.exit_code,
            "steps": max((step for step, _ in log.steps), default=None),
            "wall_s": None if s is None else s.duration_s,
            "goodput": None if acc is None or not log.steps else acc.run.goodput,
            "written": written,
            "dir": str(sub),
        })
    return rows
