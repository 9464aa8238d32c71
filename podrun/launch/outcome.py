"""How an attempt ended, as values: each instance's state, its failures (FailureKind), the Outcome and its record."""
from __future__ import annotations

import collections
import enum
import signal
from dataclasses import dataclass, field

from podrun.launch.request import LaunchRequest
from podrun.redaction import redact_argv, redact_record
from podrun.wire import protocol

TAIL = 10                 # last lines kept per worker (and per instance) for the root cause
OTHERS = 3                # other workers whose last lines the root cause shows
OTHER_TAIL = 5            # lines shown of each of them


@dataclass
class InstanceState:
    index: int
    host: str
    status: str = "starting"          # starting|running|ok|failed|terminated|lost
    exit_code: int | None = None
    workers: dict[int, int] = field(default_factory=dict)   # local rank -> return code
    agent_host: str | None = None
    ready_s: float | None = None
    ended_s: float | None = None
    last_seen: float = 0.0
    max_gap_s: float | None = None      # the largest silence between two of its lines (the loss's, if lost)
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=TAIL))
    # local rank (None: lines of no worker) -> its last lines, and when it last wrote (a sequence number)
    worker_tails: dict = field(default_factory=dict)
    worker_seen: dict = field(default_factory=dict)
    agents_done: dict = field(default_factory=dict)   # local rank -> done code, with one agent per worker

    def worker_tail(self, local_rank: int | None) -> collections.deque:
        t = self.worker_tails.get(local_rank)
        if t is None:
            t = self.worker_tails[local_rank] = collections.deque(maxlen=TAIL)
        return t


class FailureKind(str, enum.Enum):
    """What went wrong, as a value: the run's status and every decision on a failure read this, never the text."""

    EXITED = "exited"              # a worker exited non-zero
    AGENT_ENDED = "agent-ended"    # an instance's agent ended before it reported its workers' exits
    LOST = "lost"                  # a host stopped answering (no heartbeat, or its connection dropped)
    HUNG = "hung"                  # no rank made progress for the hang window (--on-hang end)
    STRAGGLERS = "stragglers"      # workers still running --straggler-timeout after one exited 0
    CONTROLLER_LOST = "controller-lost"   # an agent heard nothing from the controller within its bound and stopped

    @property
    def status(self) -> str:
        """The run's status when a failure of this kind is its root cause."""
        return {FailureKind.LOST: "lost", FailureKind.HUNG: "hung"}.get(self, "failed")


@dataclass
class Failure:
    instance: int | None
    host: str
    local_rank: int | None
    exit_code: int
    kind: FailureKind
    reason: str                        # the message, made from the facts where the failure was seen
    at: float                          # agent wall time (controller's for lost hosts)
    last_lines: list[str] = field(default_factory=list)    # the failing worker's own (its instance's if none)
    error: dict | None = None          # its @record error file: {message, traceback, file}
    others: list[dict] = field(default_factory=list)       # [{instance, host, local_rank, last_lines}]
    followers: dict | None = None      # the other workers that ended non-zero (podrun.launch.followers)

    def to_dict(self) -> dict:
        sig = self.exit_code - 128 if 128 < self.exit_code < 160 else None
        d = {"instance": self.instance, "host": self.host, "local_rank": self.local_rank,
             "exit_code": self.exit_code, "kind": self.kind.value, "reason": self.reason, "last_lines": self.last_lines,
             "error": self.error, "others": self.others, "followers": self.followers}
        if sig:
            try:
                d["signal"] = signal.Signals(sig).name
            except ValueError:
                d["signal"] = sig
        return d


@dataclass
class Outcome:
    exit_code: int
    status: str                        # ok|failed|lost|interrupted
    root_cause: Failure | None
    instances: list[InstanceState]
    started: float
    ended: float
    all_ready_s: float | None
    hang: dict | None = None           # the hang that ended (or was dumped in) the run: window, merged stacks
    slow_ranks: list = field(default_factory=list)   # ranks named slow (podrun.launch.slow_ranks.SlowRanks records)

    def summary(self, request: LaunchRequest) -> dict:
        """The attempt's record, redacted (podrun.redaction): summary.json, --json and the console's root cause
        are made from it."""
        return redact_record({
            "run_id": request.run_id, "exit_code": self.exit_code, "status": self.status,
            "transport": request.transport, "restart_count": request.restart_count,
            "command": redact_argv(request.command), "master": f"{request.master_addr}:{request.master_port}",
            "root_cause": self.root_cause.to_dict() if self.root_cause else None,
            "instances": [{"index": s.index, "host": s.host, "status": s.status, "exit_code": s.exit_code,
                           "workers": {str(k): protocol.exit_code_from_returncode(v) for k, v in s.workers.items()},
                           "ready_s": s.ready_s, "ended_s": s.ended_s, "max_heartbeat_gap_s": s.max_gap_s}
                          for s in self.instances],
            "heartbeat": request.liveness.to_dict(),
            "timings": {"started": self.started, "ended": self.ended,
                        "duration_s": round(self.ended - self.started, 3), "all_ready_s": self.all_ready_s},
            "hang": self.hang,
            "slow_ranks": self.slow_ranks,
        })


def exit_signal(code: int) -> str | None:
    """143 -> "SIGTERM": the signal an exit code above 128 says ended the process (None: none, or not one known)."""
    if 128 < code < 160:
        try:
            return signal.Signals(code - 128).name
        except ValueError:
            pass
    return None


def describe_code(code: int) -> str:
    sig = exit_signal(code)
    return f"exited by signal {sig} (exit code {code})" if sig is not None else f"exited with code {code}"


def explain(root: Failure, states: dict[int, InstanceState], failures: list[Failure],
            errors: dict[tuple[int, int | None], dict]) -> None:
    """The root cause's report: the failing worker's own last lines (its instance's when the failure
    is no worker's, e.g. a lost host) and its @record error; then the other workers' last lines,
    failed ones first, then the most recent to write."""
    if root.instance is None:
        return
    st = states[root.instance]
    own = st.worker_tails.get(root.local_rank) if root.local_rank is not None else None
    root.last_lines = list(own) if own else list(st.tail)
    root.error = errors.get((root.instance, root.local_rank))
    failed = {(f.instance, f.local_rank): n for n, f in enumerate(sorted(failures, key=lambda f: f.at))}
    cands = []
    for s in states.values():
        for lr, tail in s.worker_tails.items():
            key = (s.index, lr)
            if not tail or key == (root.instance, root.local_rank) or (lr is None and s.index == root.instance
                                                                      and root.local_rank is None):
                continue
            cands.append((key not in failed, failed.get(key, 0), -s.worker_seen.get(lr, 0), s, lr, tail))
    cands.sort(key=lambda c: c[:3])
    root.others = [{"instance": s.index, "host": s.host, "local_rank": lr,
                    "last_lines": list(tail)[-OTHER_TAIL:]} for *_, s, lr, tail in cands[:OTHERS]]
