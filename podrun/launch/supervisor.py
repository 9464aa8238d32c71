"""The supervisor: runs a transport's agents, parses their protocol, logs, fails fast, detects lost hosts.

Whatever the transport, it reads the agent line protocol from every InstanceHandle through bounded
queues, writes runs/<id>/instance-<i>.log as lines come (a log that cannot be written, e.g. on a full
disk, is reported once and the run goes on with the console only), sends a heartbeat to every agent
each ``heartbeat`` seconds, and ends the run everywhere on the first worker failure, on SIGINT/SIGTERM/SIGHUP,
when an instance has been silent for ``keepalive`` seconds, the liveness bound (podrun.wire.liveness: a lost
host; summary.json gives each instance's largest silence), or when workers are still running
``straggler_timeout`` seconds after one exited 0 (stragglers, named by rank), or when no worker made
progress (an output line, or a ``prog`` report outside eval/checkpoint) for the hang window
(podrun.launch.hangs.WatchOptions) and, for a plain script that reports nothing through the runtime, no rank
moved between two samples of its stack and CPU time taken as the window ends (hangs.busy_ranks): then it
first asks every agent for its workers' stacks (``S``), writes them to runs/<id>/stacks/ and shows them merged. A rank whose reported busy time stays well above the
others' is named once (podrun.launch.slow_ranks.SlowRanks) and listed in summary.json's ``slow_ranks``.
``podrun stack`` asks for the same view through the run's control socket at any time. The root cause is
the failure with the earliest agent time; its
report carries that worker's own last lines (kept per worker, bounded), its @record error if it wrote
one, separately the last lines of the others, and the workers that ended after it in one summary
(podrun.launch.followers).
"""
from __future__ import annotations

import collections
import enum
import json
import math
import queue
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from podrun.errors import PodrunError
from podrun.human import human_seconds
from podrun.launch import control, followers, hangs, slow_ranks, stacks
from podrun.launch.request import LaunchRequest
from podrun.launch.rundir import private_open, private_subdir
from podrun.launch.transports.base import InstanceHandle, Transport
from podrun.redaction import redact_argv, redact_record, redact_text
from podrun.wire import owner, protocol
from podrun.wire.liveness import FIRST_HEARTBEAT_S, Every, Hearing, scan_every

LOST_EXIT = 255           # like ssh: the connection to a host was lost
TAIL = 10                 # last lines kept per worker (and per instance) for the root cause
OTHERS = 3                # other workers whose last lines the root cause shows
OTHER_TAIL = 5            # lines shown of each of them
STRAGGLER_EXIT = 124      # like timeout(1): workers still running past --straggler-timeout
QUEUED = 256              # protocol lines waiting for the supervisor (bounded: memory stays flat)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)   # SIGHUP: terminal closed, ssh dropped

# sink(instance, host, local_rank, stream, text): a worker's line, already filtered for the console
Sink = Callable[[int | None, str, int | None, str, str], None]
# notice(text): podrun's own status messages
Notice = Callable[[str], None]
# progress(rank, host, record): a worker's progress report (podrun.runtime.progress), for the console
Progress = Callable[[int, str, dict], None]


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


class Supervisor:
    def __init__(self, request: LaunchRequest, transport: Transport, *, sink: Sink | None = None,
                 notice: Notice | None = None, only_output_from: int | None = None, workers_per_instance: int = 1,
                 watch: hangs.WatchOptions | None = None, progress: Progress | None = None):
        self.req = request
        self.watch = watch or hangs.WatchOptions(hang_timeout=None)
        self.progress = progress
        self.last_progress = time.monotonic()
        self.started = False                     # some worker made progress in this attempt
        self.step_times: list[float] = []       # recent step_seconds reported by any worker (auto window)
        self.slow = slow_ranks.SlowRanks()         # each rank's recent busy_seconds: names a slow rank
        self.phases: dict[tuple[int, int | None], str] = {}   # (instance, local rank) -> last reported phase
        self.dump: stacks.StackCollection | None = None  # the stack collection in flight
        self.reported = False                    # a worker reported through podrun's runtime in this attempt
        # a plain script's first sample of a silence: (last_progress it was taken in, {(instance, lr): RankSample})
        self.sample: tuple[float, dict] | None = None
        self.busy_reset: float | None = None     # the new window the last busy verdict opened (its last_progress)
        self.quiet_from = 0.0                    # the last real progress before busy verdicts' new windows
        self.asks: queue.Queue = queue.Queue()   # control-socket requests: (done event, reply holder)
        self.handles: tuple[InstanceHandle, ...] = ()
        self.hang: dict | None = None
        self.rank_of: dict[tuple[int, int], int] = {}
        self.transport = transport
        self.sink = sink or (lambda *a: None)
        self.notice = _safe(notice or (lambda t: None))
        self.only = only_output_from
        self.multi = workers_per_instance > 1
        self.wpi = workers_per_instance
        self.errors: dict[tuple[int, int | None], dict] = {}   # (instance, local rank) -> @record error
        self.seq = 0
        self.q: queue.Queue = queue.Queue(maxsize=QUEUED)
        self.first_ok: tuple[float, int, int | None] | None = None   # (monotonic, instance, local rank)
        self.hearing = Hearing()                 # when each instance was last heard, less the controller's own waits
        self.lost_silence: dict[int, float] = {}  # instance -> its silence when it was declared lost
        self.hb_handles: tuple[InstanceHandle, ...] = ()
        self.done = threading.Event()
        self.states = {i.index: InstanceState(i.index, i.host) for i in request.instances}
        self.logs = {}
        self.failures: list[Failure] = []
        self.signalled: int | None = None
        self.stopping_since: float | None = None
        self.force = False
        self.t0 = time.time()

    # -- events ---------------------------------------------------------------------------
    def _reader(self, h: InstanceHandle) -> None:
        """Move h's lines to the supervisor's bounded queue, noting when each instance was last heard from
        and how long the reader waited on a full queue (a slow console or disk holds the supervisor back,
        not the host: that wait does not count as the host's silence)."""
        try:
            for stream, line in h.lines():
                if line.startswith(protocol.PREFIX):
                    ev = protocol.parse(line, stream)
                    if ev.instance is not None:
                        self.hearing.heard(h, ev.instance)
                self.hearing.wait_begins(h)
                self.q.put((h, stream, line))
                self.hearing.wait_ends(h)
        finally:
            self.hearing.end(h)         # its end is queued: nothing more to hear
            self.q.put((h, None, None))

    def _heartbeats(self) -> None:
        """A byte to every open agent each heartbeat period, from its own thread: the agents keep their
        controller even while the supervisor waits on a slow console."""
        while not self.done.wait(self.req.heartbeat):
            for h in self.hb_handles:
                h.heartbeat()

    def _log(self, index: int | None, text: str) -> None:
        if index is None:
            return
        f = self.logs.get(index, False)
        if f is None:                  # this log failed before: the console has the output
            return
        path = Path(self.req.run_dir) / f"instance-{index}.log"
        try:
            if f is False:
                f = self.logs[index] = open(path, "a", buffering=1, opener=private_open)
            f.write(text + "\n")
        except OSError as exc:
            self.logs[index] = None
            if f:
                _close_quietly(f)
            self.notice(f"cannot write {path}: {exc.strerror or exc}; instance {index}'s output goes on "
                        "to the console only")

    def _output(self, idx: int | None, host: str, lr: int | None, stream: str, text: str) -> None:
        st = self.states.get(idx) if idx is not None else None
        shown = f"[{lr}] {text}" if self.multi and lr is not None else text
        self._log(idx, shown)
        if st is not None:
            st.tail.append(shown)
            st.worker_tail(lr).append(text)
            self.seq += 1
            st.worker_seen[lr] = self.seq
        if self.only is None or idx == self.only or stream == "err" or idx is None:
            try:
                self.sink(idx, host, lr, stream, text)
            except Exception:  # noqa: BLE001 - a closed terminal/pipe must not stop supervision
                self.sink = lambda *a: None

    def _handle_line(self, h: InstanceHandle, stream: str, line: str) -> None:
        now = time.monotonic()
        ev = protocol.parse(line, stream)
        if ev.instance is None or ev.instance not in self.states:
            idx = h.instances[0] if len(h.instances) == 1 else None
            self._output(idx, h.label, None, ev.kind, ev.text)
            return
        st = self.states[ev.instance]
        st.last_seen = now
        if ev.kind in ("out", "err"):
            self._output(st.index, st.host, ev.local_rank, ev.kind, ev.text)
            if ev.local_rank is not None:
                self.last_progress, self.started = now, True
        elif ev.kind == "prog":
            self._progress(st, ev.local_rank, ev.text, now)
        elif ev.kind == "stack":
            if self.dump is not None and ev.local_rank is not None:
                try:
                    self.dump.got[(st.index, ev.local_rank)] = json.loads(ev.text)
                except ValueError:
                    pass
        elif ev.kind == "ready":
            st.status = "running"
            st.agent_host = ev.text.split(" ")[0]
            st.ready_s = round(time.time() - self.t0, 3)
        elif ev.kind == "exit":
            parts = ev.text.split()
            rc, at = int(parts[0]), float(parts[1]) if len(parts) > 1 else time.time()
            st.workers[ev.local_rank] = rc
            self.last_progress = now             # a worker ending is news; the others get a new window
            if rc == 0 and self.first_ok is None:
                self.first_ok = (now, st.index, ev.local_rank)
            if rc != 0 and "teardown" not in parts[2:] and self.signalled is None:
                code = protocol.exit_code_from_returncode(rc)
                self.failures.append(Failure(st.index, st.host, ev.local_rank, code, FailureKind.EXITED,
                                             _describe_code(code), at))
        elif ev.kind == "error":
            try:
                info = json.loads(ev.text)
            except ValueError:
                info = None
            if isinstance(info, dict):
                self.errors[(st.index, ev.local_rank)] = info
        elif ev.kind == "note":
            self._log(st.index, f"# podrun agent: {redact_text(ev.text)}")
        elif ev.kind == "done":
            if ev.local_rank is not None:      # one agent per worker (mpirun --rank-from-env)
                st.agents_done[ev.local_rank] = int(ev.text or 0)
                if len(st.agents_done) < self.wpi:
                    return
                codes = [c for c in st.agents_done.values() if c]
                ev = protocol.Event(ev.instance, None, ev.kind, str(codes[0] if codes else 0))
            st.exit_code = int(ev.text or 0)
            st.ended_s = round(time.time() - self.t0, 3)
            if st.status != "lost":
                st.status = "ok" if st.exit_code == 0 else ("failed" if any(
                    f.instance == st.index for f in self.failures) else "terminated")

    def _handle_eof(self, h: InstanceHandle) -> None:
        rc = h.wait(timeout=2.0)
        for idx in h.instances:
            st = self.states[idx]
            if st.exit_code is None and st.status != "lost":
                code = LOST_EXIT if rc is None else (protocol.exit_code_from_returncode(rc) or 1)
                st.exit_code = code
                st.ended_s = round(time.time() - self.t0, 3)
                st.status = "terminated" if self.stopping_since else "failed"
                if self.stopping_since is None and self.signalled is None:
                    what = ("the connection to it was lost" if code == LOST_EXIT
                            else f"its agent ended with code {code}")
                    kind = FailureKind.LOST if code == LOST_EXIT else FailureKind.AGENT_ENDED
                    self.failures.append(Failure(idx, st.host, None, code, kind,
                                                 f"{what} before it reported (host crashed, sshd or agent killed; "
                                                 f"see instance-{idx}.log)", time.time()))

    # -- the loop ---------------------------------------------------------------------------
    def _on_signal(self, signum, frame) -> None:  # noqa: ARG002
        if self.signalled is None:
            self.signalled = signum
        else:
            self.force = True          # a second Ctrl-C: do not wait for the grace period

    def run(self) -> Outcome:
        Path(self.req.run_dir).mkdir(parents=True, exist_ok=True)
        old = {}
        if threading.current_thread() is threading.main_thread():
            for s in STOP_SIGNALS:
                old[s] = signal.signal(s, self._on_signal)
        try:
            return self._run()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            for f in self.logs.values():
                if f:
                    _close_quietly(f)
            self.transport.close()

    def _run(self) -> Outcome:
        try:
            server = control.serve(self.req.run_dir, self._control)
        except OSError as exc:
            server = None
            self.notice(f"cannot listen on {Path(self.req.run_dir) / owner.SOCKET_NAME}: {exc.strerror or exc}; "
                        "podrun stack cannot reach this run")
        try:
            return self._run_started()
        finally:
            control.stop(self.req.run_dir, server)

    def _control(self, request) -> dict:
        if not isinstance(request, dict):
            return {"error": "a request is a JSON object"}
        if request.get("ask") == "stacks":
            return self.request_stacks()
        return {"error": f"unknown request {request.get('ask')!r}"}

    def _run_started(self) -> Outcome:
        handles = self.transport.start()
        try:
            return self._supervise(handles)
        except BaseException:
            for h in handles:          # never leave agents behind on an unexpected error
                h.terminate()
                h.kill()
            raise

    def _supervise(self, handles: list[InstanceHandle]) -> Outcome:
        now = time.monotonic()
        for st in self.states.values():
            st.last_seen = now
        open_handles = set(handles)
        carrier = {i: h for h in handles for i in h.instances}
        for h in handles:
            threading.Thread(target=self._reader, args=(h,), daemon=True).start()
        self.hb_handles = tuple(open_handles)
        threading.Thread(target=self._heartbeats, daemon=True).start()
        try:
            return self._loop(open_handles, carrier)
        finally:
            self.done.set()

    def _loop(self, open_handles: set, carrier: dict) -> Outcome:
        lost: set[int] = set()
        kill_at = None
        scan = Every(scan_every(self.req.liveness))
        while open_handles:
            self.hb_handles = self.handles = tuple(open_handles)
            try:
                h, stream, line = self.q.get(timeout=0.1)
            except queue.Empty:
                pass
            else:
                if stream is None:
                    self._handle_eof(h)
                    open_handles.discard(h)
                    h.close()
                else:
                    self._handle_line(h, stream, line)
            now = time.monotonic()
            for st in (self.states.values() if scan.due(now) else ()):   # not once per line: O(hosts) each
                if st.exit_code is not None or st.status == "lost":
                    continue
                silent = self.hearing.silence(st.index, carrier.get(st.index))
                heard = silent is not None
                if not heard:            # not heard yet: its agent may still be starting (the fan-out, a slow python)
                    silent, limit = now - st.last_seen, max(self.req.keepalive, FIRST_HEARTBEAT_S)
                else:
                    limit = self.req.keepalive
                if silent > limit:
                    st.status, st.exit_code = "lost", LOST_EXIT
                    st.ended_s = round(time.time() - self.t0, 3)
                    lost.add(st.index)
                    if heard:
                        self.lost_silence[st.index] = silent
                        why = f"no heartbeat for {self.req.keepalive:g} s"
                        self.notice(f"instance {st.index} on {st.host}: lost (no heartbeat for "
                                    f"{self.req.liveness.describe()})")
                    else:
                        why = f"its agent sent nothing in the first {limit:g} s"
                        self.notice(f"instance {st.index} on {st.host}: lost ({why})")
                    if self.signalled is None:
                        self.failures.append(Failure(st.index, st.host, None, LOST_EXIT, FailureKind.LOST,
                                                     f"host {st.host} lost: {why} "
                                                     "(link down, sshd gone or machine frozen)", time.time()))
                    for x in list(open_handles):
                        if set(x.instances) <= lost:   # nothing more will come from it
                            x.kill()
                            x.close()
                            open_handles.discard(x)
            self._watch(now)
            if (self.req.straggler_timeout is not None and self.first_ok is not None and self.stopping_since is None
                    and not self.failures and now - self.first_ok[0] >= self.req.straggler_timeout):
                self._stragglers()
            if self.stopping_since is None and (self.failures or self.signalled is not None):
                self.stopping_since = now
                why = (f"received {signal.Signals(self.signalled).name}" if self.signalled is not None
                       else self.failures[0].reason + f" (instance {self.failures[0].instance} on {self.failures[0].host})")
                self.notice(f"ending the run on every host: {why}")
                first = self.signalled if self.signalled is not None else signal.SIGTERM
                for x in open_handles:
                    x.terminate(first)       # podrun's SIGINT or SIGHUP goes on as it is, as torchrun's does
                kill_at = now + self.req.grace + protocol.TERM_TO_KILL_S + 3.0
            if kill_at is not None and self.force:
                kill_at = now
            if kill_at is not None and now >= kill_at:
                for x in list(open_handles):
                    self.notice(f"{x.label}: the instance agent did not end in time; killing it")
                    x.kill()
                    x.close()
                    self._handle_eof(x)
                    open_handles.discard(x)
        if self.dump is not None:             # the run ended meanwhile: answer who asked, blame no one
            self.dump.reason = "request"
            self._finish_dump()
        return self._outcome()

    # -- progress, hangs and stacks ------------------------------------------------------------
    def _progress(self, st: InstanceState, lr: int | None, text: str, now: float) -> None:
        try:
            rec = json.loads(text)
        except ValueError:
            return
        if not isinstance(rec, dict) or lr is None:
            return
        self.last_progress, self.started, self.reported = now, True, True
        self.phases[(st.index, lr)] = str(rec.get("phase", "train"))
        dt = rec.get("step_seconds")
        if isinstance(dt, (int, float)) and dt > 0:
            self.step_times.append(float(dt))
            del self.step_times[:-hangs.AUTO_WINDOW]
        busy = rec.get("busy_seconds")
        if isinstance(busy, (int, float)) and not isinstance(busy, bool) and math.isfinite(busy) and busy >= 0:
            rank = self._rank_int(st.index, lr)
            step = rec.get("step")
            named = self.slow.add(rank, st.host, float(busy), step if isinstance(step, int) else None)
            if named is not None:
                self.notice(slow_ranks.slow_rank_line(named))
        if self.progress is not None:
            try:
                self.progress(self._rank_int(st.index, lr), st.host, rec)
            except Exception:  # noqa: BLE001 - a closed terminal must not stop supervision
                self.progress = None

    def _rank_int(self, instance: int, lr: int) -> int:
        key = (instance, lr)
        if key not in self.rank_of:        # every worker of the instance at once: its envs are made whole
            for pos, env in enumerate(self.req.worker_envs(instance)):
                r = env.get("RANK", "?")
                self.rank_of[(instance, pos)] = int(r) if r.isdigit() else -1
            self.rank_of.setdefault(key, -1)
        return self.rank_of[key]

    def window(self) -> float | None:
        """The hang window now (None: hangs are not watched)."""
        return self.watch.window(self.step_times, self.started)

    def _watch(self, now: float) -> None:
        """Start a dump on a hang or on a control-socket request; finish one that is complete or overdue."""
        while True:
            try:
                ask = self.asks.get_nowait()
            except queue.Empty:
                break
            if self.dump is None:
                self._start_dump("request", now)
            self.dump.asks.append(ask)
        if self.dump is not None:
            if self.dump.complete(now):
                self._finish_dump()
            return
        win = self.window()
        if win is None or self.stopping_since is not None:
            return
        silent = now - self.last_progress
        if self.reported:               # the runtime's step reports set the window: silence past it is a hang
            if silent <= win:
                return
            if any(self.phases.get(k, "train") != "train" for k in self._running()):
                return                  # eval or checkpoint: the runtime said what it is doing
            self._start_dump("hang", now, win)
            return
        # a plain script: silence is judged by two samples of every rank's stack and CPU time, the first
        # taken just before the window ends, the second when it ends (hangs.busy_ranks)
        fresh = self.sample is not None and self.sample[0] == self.last_progress
        if not fresh and silent > win - hangs.probe_gap(win):
            self._start_dump("probe", now, win)
        elif fresh and silent > win:
            self._start_dump("hang", now, win)

    def _running(self) -> list[tuple[int, int]]:
        return [(st.index, lr) for st in self.states.values() if st.exit_code is None and st.status == "running"
                for lr in range(self.wpi) if lr not in st.workers]

    def _start_dump(self, reason: str, now: float, window: float | None = None) -> None:
        self.dump = stacks.StackCollection(reason, window, self._running(), now + stacks.DUMP_WAIT_S,
                                    now - self.last_progress)
        if reason == "hang" and self.reported:     # a plain script's is said once the samples say stuck
            self.notice(f"no progress from any rank for {human_seconds(window)} ({self.watch.source}); "
                        "collecting every worker's stacks")
        self.dump.progress_at = self.last_progress
        for h in self.handles:
            try:
                h.request_stacks()
            except Exception:  # noqa: BLE001 - a broken link shows as a worker without stacks
                pass
        if self.transport.merged:        # mpirun/srun agents have no stdin: they watch the run dir
            try:
                protocol.write_request(self.req.run_dir)
            except OSError as exc:
                self.notice(f"cannot ask the mpirun/srun agents for stacks: {exc.strerror or exc}")

    def _finish_dump(self) -> None:
        d, self.dump = self.dump, None
        workers = []
        for inst, lr in d.want:
            st = self.states[inst]
            rec = d.got.get((inst, lr))
            rank = self._rank_int(inst, lr)
            if rec is None:
                workers.append(stacks.WorkerStack(rank, inst, lr, st.host, (), "its agent sent no stacks in time "
                                                    "(host cut off, or under mpirun/srun a run dir it does not share)"))
                continue
            procs = tuple(stacks.ProcessStack(int(p.get("pid", 0)), stacks.parse_dump(str(p.get("text", "")),
                                                                                           p.get("main")))
                          for p in rec.get("procs", ()) if isinstance(p, dict))
            procs = tuple(p for p in procs if p.threads)
            workers.append(stacks.WorkerStack(rank, inst, lr, st.host, procs,
                                                None if procs else rec.get("problem") or "no stack"))
        groups = stacks.merge(workers)
        lines = stacks.render_lines(groups)
        busy = self._judge(d, workers)
        if d.asks or (d.reason == "hang" and not busy):
            self._write_stacks(workers, lines)
        reply = redact_record({"run_id": self.req.run_id, "ranks": len(workers), "groups": stacks.to_json(groups),
                               "lines": lines, "stacks_dir": str(Path(self.req.run_dir) / stacks.STACKS_DIR)})
        for done, holder in d.asks:
            holder.append(reply)
            done.set()
        if d.reason != "hang":
            return
        if busy:
            if self.busy_reset != d.progress_at:     # real progress since the last verdict: a new silence
                self.quiet_from = d.progress_at
            self.last_progress = self.busy_reset = time.monotonic()   # a new window, a new first sample in it
            why = "; ".join(f"rank {self._rank_int(*k)} {w}" for k, w in sorted(busy.items())[:4])
            self.notice(f"no output from any rank for {human_seconds(self.last_progress - self.quiet_from)} "
                        f"(window {human_seconds(d.window)}, {self.watch.source}), but {len(busy)} rank(s) moved "
                        f"({why}{'; ...' if len(busy) > 4 else ''}): busy, not hung; watching on")
            return
        if not self.reported:
            self.notice(f"no progress from any rank for {human_seconds(d.window)} ({self.watch.source}), and "
                        "no rank moved between two samples of its stack and CPU time; collecting every "
                        "worker's stacks")
        self.notice(f"the stacks of {len(workers)} worker(s), odd ranks first "
                    f"(every thread in {Path(self.req.run_dir) / stacks.STACKS_DIR}/rank-N.txt):\n  "
                    + "\n  ".join(lines))
        self.hang = {"window_s": d.window, "silent_s": round(d.silent_s, 3), "on_hang": self.watch.on_hang,
                     "found_s": round(time.monotonic() - d.progress_at, 3),
                     "judged_by": "progress reports" if self.reported else "stack and CPU samples",
                     "groups": [{"ranks": list(g.ranks), "hosts": sorted({w.host for w in g.workers}),
                                 "stack": g.workers[0].processes[0].main_frames()[0].where()
                                 if g.workers[0].processes and g.workers[0].processes[0].main_frames() else None,
                                 "summary": stacks.describe(g.workers[0].processes[0].main_frames())
                                 if g.workers[0].processes else g.workers[0].problem} for g in groups]}
        if self.watch.on_hang == "end" and groups and self.signalled is None:
            odd = groups[0].workers[0]
            what = (stacks.describe(odd.processes[0].main_frames()) if odd.processes else odd.problem)
            odd_label = "the odd rank out" if len(groups) > 1 else "every rank"
            self.failures.append(Failure(
                odd.instance, odd.host, odd.local_rank, hangs.HANG_EXIT, FailureKind.HUNG,
                f"hung: no progress from any rank for {human_seconds(d.window)} ({self.watch.source}); "
                f"{odd_label}: rank {odd.rank} on {odd.host} in {what}", time.time()))
        else:
            self.last_progress = time.monotonic()    # dump again after another silent window

    def _judge(self, d: stacks.StackCollection, workers: list) -> dict:
        """For a plain script's collection: keep a first sample ("probe"), or compare the second ("hang") with
        it; returns the busy ranks ((instance, local rank) -> why), empty when stuck or not judged here."""
        if self.reported or d.reason not in ("probe", "hang"):
            return {}
        now = {}
        for w in workers:
            rec = d.got.get((w.instance, w.local_rank)) or {}
            cpu, at = rec.get("cpu"), rec.get("at")
            now[(w.instance, w.local_rank)] = hangs.RankSample(
                w.key() if w.processes else None, stacks.in_collective(w),
                float(cpu) if isinstance(cpu, (int, float)) and not isinstance(cpu, bool) else None,
                float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else None)
        if d.reason == "probe":
            self.sample = (d.progress_at, now)
            return {}
        before = self.sample[1] if self.sample is not None and self.sample[0] == d.progress_at else {}
        self.sample = None
        return hangs.busy_ranks(before, now)

    def _write_stacks(self, workers: list, lines: list[str]) -> None:
        where = Path(self.req.run_dir) / stacks.STACKS_DIR
        try:
            private_subdir(self.req.run_dir, stacks.STACKS_DIR, "stacks directory")
            for w in workers:
                with open(where / f"rank-{w.rank}.txt", "w", opener=private_open) as f:
                    f.write(redact_text(stacks.stack_file_text(w)))
            with open(where / "merged.txt", "w", opener=private_open) as f:
                f.write(redact_text("\n".join(lines) + "\n"))
        except OSError as exc:
            self.notice(f"cannot write the stacks to {where}: {exc.strerror or exc}")
        except PodrunError as exc:
            self.notice(f"not writing the stacks: {exc.message}")

    def request_stacks(self, timeout: float = stacks.DUMP_WAIT_S * 3) -> dict:
        """From another thread (the control socket): the merged stacks of the running workers, now."""
        done, holder = threading.Event(), []
        self.asks.put((done, holder))
        if not done.wait(timeout) or not holder:
            return {"error": "the run did not answer in time (it may be ending)"}
        return holder[0]

    def _stragglers(self) -> None:
        """Workers still running ``straggler_timeout`` s after the first one exited 0: a failure naming them."""
        hung = []
        for st in sorted(self.states.values(), key=lambda s: s.index):
            if st.exit_code is not None:
                continue
            envs = None
            for lr in range(self.wpi):
                if lr not in st.workers:
                    if envs is None:
                        envs = self.req.worker_envs(st.index)
                    hung.append((st, lr, envs[lr].get("RANK", "?") if lr < len(envs) else "?"))
        if not hung:
            return
        _, inst, lr = self.first_ok
        first = self._rank(inst, lr)
        ranks = ", ".join(r for _, _, r in hung)
        st, lr, _ = hung[0]
        self.failures.append(Failure(
            st.index, st.host, lr, STRAGGLER_EXIT, FailureKind.STRAGGLERS,
            f"rank{'s' if len(hung) > 1 else ''} {ranks} still running {self.req.straggler_timeout:g} s after "
            f"rank {first} exited 0 (--straggler-timeout): hung or stragglers", time.time()))

    def _rank(self, instance: int, local_rank: int | None) -> str:
        envs = self.req.worker_envs(instance)
        return envs[local_rank].get("RANK", "?") if local_rank is not None and local_rank < len(envs) else "?"

    def _outcome(self) -> Outcome:
        ended = time.time()
        root = min(self.failures, key=lambda f: f.at) if self.failures else None
        if root is not None:
            self._explain(root)
            code, status = root.exit_code, root.kind.status
        elif self.signalled is not None:
            code, status = 128 + self.signalled, "interrupted"
        else:
            bad = [s for s in self.states.values() if s.exit_code not in (0, None)]
            code, status = (bad[0].exit_code, "failed") if bad else (0, "ok")
        ready = [s.ready_s for s in self.states.values()]
        for s in self.states.values():
            gaps = [g for g in (self.hearing.max_gap(s.index), self.lost_silence.get(s.index)) if g is not None]
            s.max_gap_s = round(max(gaps), 3) if gaps else None
        return Outcome(code, status, root, sorted(self.states.values(), key=lambda s: s.index), self.t0, ended,
                       max(ready) if ready and None not in ready else None, self.hang,
                       [dict(r) for r in self.slow.records])


    def _explain(self, root: Failure) -> None:
        """The root cause's report: the failing worker's own last lines (its instance's when the failure
        is no worker's, e.g. a lost host) and its @record error; then the other workers' last lines,
        failed ones first, then the most recent to write."""
        if root.instance is None:
            return
        st = self.states[root.instance]
        own = st.worker_tails.get(root.local_rank) if root.local_rank is not None else None
        root.last_lines = list(own) if own else list(st.tail)
        root.error = self.errors.get((root.instance, root.local_rank))
        failed = {(f.instance, f.local_rank): n for n, f in enumerate(sorted(self.failures, key=lambda f: f.at))}
        cands = []
        for s in self.states.values():
            for lr, tail in s.worker_tails.items():
                key = (s.index, lr)
                if not tail or key == (root.instance, root.local_rank) or (lr is None and s.index == root.instance
                                                                          and root.local_rank is None):
                    continue
                cands.append((key not in failed, failed.get(key, 0), -s.worker_seen.get(lr, 0), s, lr, tail))
        cands.sort(key=lambda c: c[:3])
        root.others = [{"instance": s.index, "host": s.host, "local_rank": lr,
                        "last_lines": list(tail)[-OTHER_TAIL:]} for *_, s, lr, tail in cands[:OTHERS]]
        root.followers = followers.summarise([
            (self._rank_int(s.index, lr), s.host, protocol.exit_code_from_returncode(rc))
            for s in self.states.values() for lr, rc in s.workers.items()
            if rc != 0 and (s.index, lr) != (root.instance, root.local_rank)])


def _describe_code(code: int) -> str:
    if 128 < code < 160:
        try:
            return f"exited by signal {signal.Signals(code - 128).name} (exit code {code})"
        except ValueError:
            pass
    return f"exited with code {code}"


def _close_quietly(f) -> None:
    try:
        f.close()
    except OSError:            # e.g. the last buffered line on a full disk
        pass


def _safe(f: Notice) -> Notice:
    def call(text: str) -> None:
        try:
            f(text)
        except Exception:  # noqa: BLE001 - podrun's stderr closed: keep supervising
            pass
    return call
