"""How an attempt ended: each instance's state and status, its failures (FailureKind), its record (the run's
Summary), the workers that ended after the root cause (its followers); the Supervisor's parts that gather them in a
run (Instances, Failures)."""
from __future__ import annotations

import collections
import contextlib
import enum
import signal
import time
from dataclasses import dataclass, field
from typing import Callable

from podrun.launch.request import LaunchRequest
from podrun.launch.stacks import rank_ranges
from podrun.rundir.summary import Attempt, RunStatus, Summary
from podrun.wire import protocol

SHOWN_RANGES = 8          # ranges of one exit code of the followers shown on the console (summary.json has all)
TAIL = 10                 # last lines kept per worker (and per instance) for the root cause
OTHERS = 3                # other workers whose last lines the root cause shows
OTHER_TAIL = 5            # lines shown of each of them


class InstanceStatus(str, enum.Enum):
    """An instance's status in an attempt (summary.json's instances[].status)."""

    STARTING = "starting"          # its agent has not said ready yet
    RUNNING = "running"
    OK = "ok"
    FAILED = "failed"              # it failed, or its agent ended before it reported
    TERMINATED = "terminated"      # ended by the run's end everywhere
    LOST = "lost"                  # its host stopped answering


@dataclass
class InstanceState:
    index: int
    host: str
    status: InstanceStatus = InstanceStatus.STARTING
    exit_code: int | None = None
    workers: dict[int, int] = field(default_factory=dict)   # local rank -> return code
    ready_s: float | None = None
    ended_s: float | None = None
    max_gap_s: float | None = None      # the largest silence between two of its lines (the loss's, if lost)
    lost_silence: float | None = None   # its silence when it was declared lost
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=TAIL))
    # local rank (None: lines of no worker) -> its last lines, and when it last wrote (a sequence number)
    worker_tails: dict = field(default_factory=dict)
    worker_seen: dict = field(default_factory=dict)
    agents_done: dict = field(default_factory=dict)   # local rank -> done code, with one agent per worker

    def __setattr__(self, name: str, value) -> None:
        if name == "status" and not isinstance(value, InstanceStatus):
            raise TypeError(f"an instance's status is an InstanceStatus, not {value!r}")
        super().__setattr__(name, value)

    def worker_tail(self, local_rank: int | None) -> collections.deque:
        return self.worker_tails.setdefault(local_rank, collections.deque(maxlen=TAIL))


class FailureKind(str, enum.Enum):
    """What went wrong, as a value: the run's status and every decision on a failure read this, never the text."""

    EXITED = "exited"              # a worker exited non-zero
    AGENT_ENDED = "agent-ended"    # an instance's agent ended before it reported its workers' exits
    LOST = "lost"                  # a host stopped answering (no heartbeat, or its connection dropped)
    HUNG = "hung"                  # no rank made progress for the hang window (--on-hang end)
    STRAGGLERS = "stragglers"      # workers still running --straggler-timeout after one exited 0
    CONTROLLER_LOST = "controller-lost"   # an agent heard nothing from the controller within its bound and stopped

    @property
    def status(self) -> RunStatus:
        """The run's status when a failure of this kind is its root cause."""
        return {FailureKind.LOST: RunStatus.LOST, FailureKind.HUNG: RunStatus.HUNG}.get(self, RunStatus.FAILED)


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
    followers: dict | None = None      # the other workers that ended non-zero (summarise_followers)
    rank: int | None = None            # the failing worker's global rank (None: no worker's, or not known)

    def to_dict(self) -> dict:
        d = {"instance": self.instance, "host": self.host, "local_rank": self.local_rank, "rank": self.rank,
             "exit_code": self.exit_code, "kind": self.kind.value, "reason": self.reason, "last_lines": self.last_lines,
             "error": self.error, "others": self.others, "followers": self.followers}
        if 128 < self.exit_code < 160:
            d["signal"] = exit_signal(self.exit_code) or self.exit_code - 128
        return d


def exit_signal(code: int) -> str | None:
    """143 -> "SIGTERM": the signal an exit code above 128 says ended the process (None: none, or not one known)."""
    if 128 < code < 160:
        with contextlib.suppress(ValueError):
            return signal.Signals(code - 128).name
    return None


def describe_code(code: int) -> str:
    sig = exit_signal(code)
    return f"exited by signal {sig} (exit code {code})" if sig is not None else f"exited with code {code}"


def summarise_followers(ended: list[tuple[int, str, int]]) -> dict | None:
    """(rank, host, exit code) of every other worker that ended non-zero -> {"count", "hosts", "by_code":
    [{"exit_code", "ranks"}]} (the codes most common first), or None when there is none."""
    if not ended:
        return None
    by: dict[int, list[int]] = {}
    for rank, _, code in ended:
        by.setdefault(code, []).append(rank)
    return {"count": len(ended), "hosts": len({h for _, h, _ in ended}),
            "by_code": [{"exit_code": c, "ranks": sorted(r)}
                        for c, r in sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[0]))]}


def _short_code(code: int) -> str:
    """143 -> "exit 143 (SIGTERM)"; 1 -> "exit 1"."""
    sig = exit_signal(code)
    return f"exit {code} ({sig})" if sig is not None else f"exit {code}"


def followers_line(followers: dict) -> str:
    """One line whatever the number of ranks: "then 255 other ranks on 4 hosts ended: exit 1 (ranks 0-38, 40-199),
    exit 143 (SIGTERM) (ranks 200-255)"."""
    n, hosts = followers["count"], followers["hosts"]
    parts = [f"{_short_code(g['exit_code'])} ({'rank' if len(g['ranks']) == 1 else 'ranks'} "
             f"{rank_ranges(g['ranks'], SHOWN_RANGES)})" for g in followers["by_code"]]
    return (f"then {n} other rank{'s' if n != 1 else ''} on {hosts} host{'s' if hosts != 1 else ''} ended: "
            + ", ".join(parts))


class Instances(dict):
    """The Supervisor's part that holds each instance's state in an attempt (index -> InstanceState) and the facts
    about its workers: their ranks, the order in which they last wrote, the first to exit 0."""

    def __init__(self, request: LaunchRequest, workers_per_instance: int):
        super().__init__((i.index, InstanceState(i.index, i.host)) for i in request.instances)
        self.worker_envs: Callable[[int], list[dict]] = request.worker_envs
        self.wpi = workers_per_instance
        self.seq = 0
        self.rank_of: dict[tuple[int, int], int] = {}
        self.first_ok: tuple[float, int, int | None] | None = None   # (monotonic, instance, local rank)
        self.t0 = time.time()

    def end(self, st: InstanceState, status: InstanceStatus, code: int) -> None:
        st.status, st.exit_code, st.ended_s = status, code, round(time.time() - self.t0, 3)

    def heard(self, index: int | None, local_rank: int | None, shown: str, text: str) -> None:
        """A line of instance ``index`` (as its log shows it, and as its worker wrote it), kept for the root cause."""
        st = self.get(index)
        if st is not None:
            st.tail.append(shown)
            st.worker_tail(local_rank).append(text)
            self.seq += 1
            st.worker_seen[local_rank] = self.seq

    def rank(self, instance: int, local_rank: int | None) -> int:
        """A worker's global rank (-1: not known)."""
        key = (instance, local_rank)
        if key not in self.rank_of:        # every worker of the instance at once: its envs are made whole
            for pos, env in enumerate(self.worker_envs(instance)):
                r = env.get("RANK", "?")
                self.rank_of[(instance, pos)] = int(r) if r.isdigit() else -1
            self.rank_of.setdefault(key, -1)
        return self.rank_of[key]

    def running(self, starting: bool = False) -> list[tuple[int, int]]:
        """(instance, local rank) of every worker not known to have exited, in instance order, of the instances
        running (``starting``: and of those not yet ready)."""
        return [(st.index, lr) for st in self.values() if st.exit_code is None
                and (starting or st.status is InstanceStatus.RUNNING) for lr in range(self.wpi) if lr not in st.workers]


class Failures(list):
    """The Supervisor's part that holds the attempt's failures in the order found, and the workers' @record errors
    ((instance, local rank) -> error); the root cause is the failure with the earliest agent time."""

    def __init__(self):
        super().__init__()
        self.errors: dict[tuple[int, int | None], dict] = {}
        self.root: Failure | None = None        # the root cause, once the attempt has ended (root_cause)

    def root_cause(self, instances: Instances) -> Failure | None:
        """The earliest failure with its report: the failing worker's own last lines (its instance's when the
        failure is no worker's, e.g. a lost host) and its @record error; then the other workers' last lines, failed
        ones first, then the most recent to write; and the other workers that ended non-zero, summed up."""
        if not self:
            return None
        root = self.root = min(self, key=lambda f: f.at)
        if root.instance is not None:
            self._explain(root, instances)
        root.followers = summarise_followers([
            (instances.rank(s.index, lr), s.host, protocol.exit_code_from_returncode(rc))
            for s in instances.values() for lr, rc in s.workers.items()
            if rc != 0 and (s.index, lr) != (root.instance, root.local_rank)])
        return root

    def _explain(self, root: Failure, instances: Instances) -> None:
        st = instances[root.instance]
        root.rank = None if root.local_rank is None else instances.rank(root.instance, root.local_rank)
        own = st.worker_tails.get(root.local_rank) if root.local_rank is not None else None
        root.last_lines = list(own) if own else list(st.tail)
        root.error = self.errors.get((root.instance, root.local_rank))
        failed = {(f.instance, f.local_rank): n for n, f in enumerate(sorted(self, key=lambda f: f.at))}
        cands = sorted(((key not in failed, failed.get(key, 0), -s.worker_seen.get(lr, 0), s, lr, tail)
                        for s in instances.values() for lr, tail in s.worker_tails.items()
                        if tail and (key := (s.index, lr)) != (root.instance, root.local_rank)), key=lambda c: c[:3])
        root.others = [{"instance": s.index, "host": s.host, "local_rank": lr,
                        "rank": None if lr is None else instances.rank(s.index, lr),
                        "last_lines": list(tail)[-OTHER_TAIL:]} for *_, s, lr, tail in cands[:OTHERS]]


def attempt_outcome(request: LaunchRequest, instances: Instances, root: Failure | None, signalled: int | None,
                    gaps: dict[int, float], hang: dict | None, slow_ranks: list, host_busy: dict, step_split: dict,
                    joins: dict | None = None) -> Summary:
    """How the attempt ended, as the run's record of it (its one Attempt in ``attempts``; redacted:
    Summary.redacted): its root cause (Failures.root_cause), else the signal that stopped it, else the first
    instance that ended non-zero; each instance's largest silence (``gaps``, the hearing's; a lost host's silence
    when it was declared lost, if longer); when every instance was ready; with what the live watch gathered (the
    slow ranks, each host's busy time, each rank's step split) and the agents that joined."""
    ended = time.time()
    if root is not None:
        code, status = root.exit_code, root.kind.status
    elif signalled is not None:
        code, status = 128 + signalled, RunStatus.INTERRUPTED
    else:
        bad = [s for s in instances.values() if s.exit_code not in (0, None)]
        code, status = (bad[0].exit_code, RunStatus.FAILED) if bad else (0, RunStatus.OK)
    ready = [s.ready_s for s in instances.values()]
    all_ready = max(ready) if ready and None not in ready else None
    for s in instances.values():
        seen = [g for g in (gaps.get(s.index), s.lost_silence) if g is not None]
        s.max_gap_s = round(max(seen), 3) if seen else None
    cause = None if root is None else root.to_dict()
    attempt = Attempt(0, request.restart_count, code, status, cause, None, instances.t0, ended, all_ready,
                      failed_at(root, hang, instances))
    return Summary(
        run_id=request.run_id, exit_code=code, status=status, transport=request.transport,
        restart_count=request.restart_count, command=tuple(request.command),
        master=f"{request.master_addr}:{request.master_port}", root_cause=cause,
        instances=tuple(
            {"index": s.index, "host": s.host, "status": s.status.value, "exit_code": s.exit_code,
             "workers": {str(k): protocol.exit_code_from_returncode(v) for k, v in s.workers.items()},
             "ready_s": s.ready_s, "ended_s": s.ended_s, "max_heartbeat_gap_s": s.max_gap_s}
            for s in sorted(instances.values(), key=lambda s: s.index)),
        heartbeat=request.liveness.to_dict(), started=instances.t0, ended=ended,
        duration_s=round(ended - instances.t0, 3), all_ready_s=all_ready, hang=hang,
        slow_ranks=tuple(slow_ranks), host_busy=host_busy, step_split=step_split, joins=joins,
        max_restarts=request.max_restarts, attempts=(attempt,)).redacted()


def failed_at(root: Failure | None, hang: dict | None, instances: Instances) -> float | None:
    """When the root cause began (wall clock; None: none): a worker's exit when its agent saw it, a hang or a lost
    host from the start of the silence that named it (the run's account counts failure from there)."""
    if root is None:
        return None
    quiet = None
    if root.kind is FailureKind.HUNG and hang is not None:
        quiet = hang.get("silent_s")
    elif root.kind is FailureKind.LOST:
        quiet = next((s.lost_silence for s in instances.values() if s.index == root.instance), None)
    return root.at - (quiet if isinstance(quiet, (int, float)) else 0.0)
