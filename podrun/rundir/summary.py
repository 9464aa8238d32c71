"""summary.json read back, typed: what a launch recorded of its run (podrun.launch.outcome writes it; podrun report,
podrun resume and the elastic restarts read it through here). Tolerant: a part of the wrong shape reads as absent."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podrun.rundir.account import Account
from podrun.rundir.layout import SUMMARY


def _dict(v: Any) -> dict:
    return v if isinstance(v, dict) else {}


def _dicts(v: Any) -> tuple[dict, ...]:
    return tuple(x for x in v if isinstance(x, dict)) if isinstance(v, list) else ()


@dataclass(frozen=True)
class Attempt:
    """One of summary.json's ``attempts``: every launch's (``launch``: 0 the first, 1 its first `podrun resume`...)."""

    launch: Any = 0
    restart_count: Any = None
    exit_code: Any = None
    status: Any = None
    root_cause: dict | None = None
    plan: str | None = None            # an elastic attempt's plan file (layout.plan_of)
    started: Any = None                # its start and end (wall clock), every instance ready (s after its start)
    ended: Any = None
    all_ready_s: Any = None
    failed_at: Any = None              # when its root cause began (wall clock)

    @classmethod
    def from_dict(cls, a: dict) -> Attempt:
        return cls(a.get("launch", 0), a.get("restart_count"), a.get("exit_code"), a.get("status"),
                   a.get("root_cause"), a.get("plan"), a.get("started"), a.get("ended"), a.get("all_ready_s"),
                   a.get("failed_at"))

    def to_dict(self) -> dict:
        """The record as summary.json holds it (``plan`` and the moments only when there are some)."""
        d = {"launch": self.launch, "restart_count": self.restart_count, "exit_code": self.exit_code,
             "status": self.status, "root_cause": self.root_cause}
        more = {"plan": self.plan, "started": self.started, "ended": self.ended, "all_ready_s": self.all_ready_s,
                "failed_at": self.failed_at}
        return {**d, **{k: v for k, v in more.items() if v is not None}}


@dataclass(frozen=True)
class Summary:
    """What a report, a resume and a re-plan read of summary.json."""

    run_id: Any = None
    status: Any = None
    exit_code: Any = None
    transport: Any = None
    command: Any = None
    restart_count: Any = None
    attempts: tuple[Attempt, ...] = ()
    instances: tuple[dict, ...] = ()
    root_cause: dict | None = None
    duration_s: Any = None
    all_ready_s: Any = None
    replans: tuple[dict, ...] = ()     # an elastic run's re-plans (its ``elastic`` record)
    error: Any = None
    problems: Any = None
    slow_ranks: tuple[dict, ...] = ()  # ranks the run named slow (rank, host, ratio, from_step, until_step)
    host_busy: dict = field(default_factory=dict)   # host -> [(step, busy s), ...]: each host's own work per step
    account: Account | None = None     # where the launch's wall time went (podrun.rundir.account)
    step_split: dict = field(default_factory=dict)  # {"ranks": {rank: {host, reports, input, compute, comm, optim}},
    #                                                  "input_bound": ...}: each rank's mean step split

    @classmethod
    def from_dict(cls, d: dict) -> Summary:
        timings = _dict(d.get("timings"))
        return cls(d.get("run_id"), d.get("status"), d.get("exit_code"), d.get("transport"), d.get("command"),
                   d.get("restart_count"), tuple(Attempt.from_dict(a) for a in _dicts(d.get("attempts"))),
                   _dicts(d.get("instances")), d.get("root_cause") if isinstance(d.get("root_cause"), dict) else None,
                   timings.get("duration_s"), timings.get("all_ready_s"),
                   _dicts(_dict(d.get("elastic")).get("replans")), d.get("error"), d.get("problems"),
                   _dicts(d.get("slow_ranks")), _host_busy(d.get("host_busy")), Account.from_dict(d.get("account")),
                   _dict(d.get("step_split")))


def _host_busy(v) -> dict:
    """summary.json's host_busy read tolerantly: hosts whose points are [int step, number] pairs, the rest dropped."""
    out = {}
    for host, xs in (v.items() if isinstance(v, dict) else ()):
        pts = [(p[0], float(p[1])) for p in xs if isinstance(p, list) and len(p) == 2 and isinstance(p[0], int)
               and not isinstance(p[0], bool) and isinstance(p[1], (int, float)) and not isinstance(p[1], bool)] \
            if isinstance(xs, list) else []
        if isinstance(host, str) and pts:
            out[host] = pts
    return out


def read_json(path: Path, problems: list[str]) -> dict | None:
    """A JSON object record of the run directory; None when absent or unreadable (then said in ``problems``)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        problems.append(f"{path}: unreadable ({type(exc).__name__})")
        return None
    if not isinstance(data, dict):
        problems.append(f"{path}: not a JSON object")
        return None
    return data


def read_summary(run_dir: str | Path, problems: list[str] | None = None) -> Summary | None:
    """The run's summary.json, typed; None when there is none or it cannot be read."""
    data = read_json(Path(run_dir) / SUMMARY, [] if problems is None else problems)
    return None if data is None else Summary.from_dict(data)
