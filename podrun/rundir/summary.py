"""summary.json, one typed value: what a launch records of its run (podrun.launch.run writes it once an attempt and
once at its end; the CLI, podrun report, podrun resume, the elastic re-plan and the account read it as this type).
Read tolerantly: a part of the wrong shape reads as absent."""
from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from podrun.rundir.account import Account
from podrun.rundir.layout import SUMMARY, write_summary


class RunStatus(str, enum.Enum):
    """How an attempt (and the run) ended: summary.json's and --json's ``status``, an attempt's too."""

    OK = "ok"
    FAILED = "failed"
    LOST = "lost"
    HUNG = "hung"
    INTERRUPTED = "interrupted"
    PREFLIGHT_FAILED = "preflight_failed"     # a host failed its check: nothing was started
    START_FAILED = "start_failed"             # an agent could not be started: nothing is left running

    def __str__(self) -> str:
        return self.value

    @classmethod
    def read(cls, v: Any) -> RunStatus | None:
        """summary.json's status read back (None: absent, or not one known)."""
        try:
            return cls(v) if isinstance(v, str) else None
        except ValueError:
            return None


def typed(v: Any, *types: type) -> Any:
    """``v`` when it is of one of ``types`` (a bool is no number), else None: a part of the wrong shape is absent."""
    return v if isinstance(v, types) and (bool in types or not isinstance(v, bool)) else None


def _each(v: Any, of: type, absent: Any = ()) -> Any:
    """The items of a list that are ``of`` a type, as a tuple; ``absent`` for a part that is no list."""
    return tuple(x for x in v if isinstance(x, of)) if isinstance(v, list) else absent


ATTEMPT_ALWAYS = ("launch", "restart_count", "exit_code", "status", "root_cause")   # in an attempt's record, even None


@dataclass(frozen=True)
class Attempt:
    """One attempt as the supervisor returns it (in its Summary, as torch elastic's RunResult) and as
    summary.json's ``attempts`` holds it, every launch's (``launch``: 0 the first, 1 its first `podrun resume`...)."""

    launch: int = 0
    restart_count: int | None = None
    exit_code: int | None = None
    status: RunStatus | None = None
    root_cause: dict | None = None
    plan: str | None = None            # an elastic attempt's plan file (layout.plan_of)
    started: float | None = None       # its start and end (wall clock), every instance ready (s after its start)
    ended: float | None = None
    all_ready_s: float | None = None
    failed_at: float | None = None     # when its root cause began (wall clock)

    @classmethod
    def from_dict(cls, a: dict) -> Attempt:
        def num(k: str) -> float | None:
            return typed(a.get(k), int, float)

        return cls(typed(a.get("launch"), int) or 0, typed(a.get("restart_count"), int), typed(a.get("exit_code"), int),
                   RunStatus.read(a.get("status")), typed(a.get("root_cause"), dict), typed(a.get("plan"), str),
                   num("started"), num("ended"), num("all_ready_s"), num("failed_at"))

    def to_dict(self) -> dict:
        """The record as summary.json holds it (``plan`` and the moments only when there are some)."""
        d = {**asdict(self), "status": None if self.status is None else self.status.value}
        return {k: v for k, v in d.items() if v is not None or k in ATTEMPT_ALWAYS}


@dataclass(frozen=True)
class Summary:
    """summary.json: the run's last attempt (its status, exit code, root cause, instances, timings, what the live
    watch gathered), every attempt, the elastic record and the account; or, for a launch that started nothing, its
    ``problems`` (preflight) or ``error``. ``not_written``: the files the disk refused (said on the console)."""

    run_id: str | None = None
    exit_code: int | None = None
    status: RunStatus | None = None
    transport: str | None = None
    restart_count: int | None = None
    command: tuple[str, ...] | None = None
    master: str | None = None          # "addr:port": present in an attempt's record, absent in one of no attempt
    root_cause: dict | None = None
    instances: tuple[dict, ...] = ()
    heartbeat: dict | None = None
    started: float | None = None       # the last attempt's timings (wall clock; all_ready_s: s after its start)
    ended: float | None = None
    duration_s: float | None = None
    all_ready_s: float | None = None
    hang: dict | None = None
    slow_ranks: tuple[dict, ...] = ()  # ranks the run named slow (rank, host, ratio, from_step, until_step)
    host_busy: dict = field(default_factory=dict)   # host -> [(step, busy s), ...]: each host's own work per step
    step_split: dict = field(default_factory=dict)  # {"ranks": {rank: {host, reports, input, compute, comm, optim}},
    #                                                  "input_bound": ...}: each rank's mean step split
    joins: dict | None = None
    problems: tuple[str, ...] | None = None
    error: str | None = None
    max_restarts: int | None = None
    attempts: tuple[Attempt, ...] = ()
    elastic: dict | None = None        # an elastic run's record (podrun.elastic.replan.ElasticRecord)
    account: Account | None = None     # where the launch's wall time went (podrun.rundir.account)
    not_written: tuple[str, ...] = ()

    def redacted(self) -> Summary:
        """The record with a secret hidden wherever a worker, the command or the host names may have said one
        (podrun.redaction), as summary.json holds it: the command, the master, the root causes, the instances, the
        hang, the slow ranks."""
        from podrun.redaction import redact_argv, redact_record

        return replace(self, command=None if self.command is None else tuple(redact_argv(self.command)),
                       master=redact_record(self.master), root_cause=redact_record(self.root_cause),
                       instances=tuple(redact_record(self.instances)), hang=redact_record(self.hang),
                       slow_ranks=tuple(redact_record(self.slow_ranks)),
                       attempts=tuple(replace(a, root_cause=redact_record(a.root_cause)) for a in self.attempts))

    @property
    def replans(self) -> tuple[dict, ...]:
        """An elastic run's re-plans (its ``elastic`` record's)."""
        return _each((self.elastic or {}).get("replans"), dict)

    @classmethod
    def from_dict(cls, d: dict) -> Summary:
        timings = typed(d.get("timings"), dict) or {}

        def get(k: str, *types: type) -> Any:
            return typed(d.get(k), *types)

        def num(k: str) -> float | None:
            return typed(timings.get(k), int, float)

        return cls(
            get("run_id", str), get("exit_code", int), RunStatus.read(d.get("status")), get("transport", str),
            get("restart_count", int), _each(d.get("command"), str, None), get("master", str),
            get("root_cause", dict), _each(d.get("instances"), dict), get("heartbeat", dict),
            num("started"), num("ended"), num("duration_s"), num("all_ready_s"), get("hang", dict),
            _each(d.get("slow_ranks"), dict), _host_busy(d.get("host_busy")), get("step_split", dict) or {},
            get("joins", dict), _each(d.get("problems"), str, None), get("error", str), get("max_restarts", int),
            tuple(Attempt.from_dict(a) for a in _each(d.get("attempts"), dict)), get("elastic", dict),
            Account.from_dict(d.get("account")), _each(d.get("not_written"), str))

    def to_dict(self) -> dict:
        """summary.json's record (and --json's): an attempt's parts where it had one, ``problems`` or ``error``
        where it started nothing, ``attempts`` but where the first check failed."""
        d: dict[str, Any] = {"run_id": self.run_id, "exit_code": self.exit_code,
                             "status": None if self.status is None else self.status.value,
                             "transport": self.transport}
        if self.master is not None:
            d.update({
                "restart_count": self.restart_count, "command": None if self.command is None else list(self.command),
                "master": self.master, "root_cause": self.root_cause, "instances": list(self.instances),
                "heartbeat": self.heartbeat,
                "timings": {"started": self.started, "ended": self.ended, "duration_s": self.duration_s,
                            "all_ready_s": self.all_ready_s},
                "hang": self.hang, "slow_ranks": list(self.slow_ranks), "host_busy": self.host_busy,
                "step_split": self.step_split})
        more = {"joins": self.joins if self.master is not None else None, "problems": None if self.problems is None else list(self.problems), "error": self.error,
                "max_restarts": self.max_restarts,
                "attempts": [a.to_dict() for a in self.attempts] if self.attempts or self.problems is None else None,
                "elastic": self.elastic, "account": None if self.account is None else self.account.record(),
                "not_written": list(self.not_written) or None}
        return {**d, **{k: v for k, v in more.items() if v is not None}}


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


def save(run_dir: str | Path, summary: Summary) -> Path:
    """summary.json written (redacted: podrun.rundir.layout.write_summary): the one write of the record."""
    return write_summary(run_dir, summary.to_dict())


def read_summary(run_dir: str | Path, problems: list[str] | None = None) -> Summary | None:
    """The run's summary.json, typed; None when there is none or it cannot be read."""
    data = read_json(Path(run_dir) / SUMMARY, [] if problems is None else problems)
    return None if data is None else Summary.from_dict(data)
