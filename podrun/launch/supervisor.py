"""The supervisor: runs a transport's agents, parses their protocol, fails fast, detects lost hosts.

Whatever the transport, it reads the agent line protocol from every InstanceHandle through bounded
queues, writes each instance's lines to its log (podrun.launch.instance_logs) as they come, sends a heartbeat
to every agent each ``heartbeat`` seconds, and ends the run everywhere on the first worker failure, on
SIGINT/SIGTERM/SIGHUP, when an instance has been silent for ``keepalive`` seconds, the liveness bound
(podrun.wire.liveness: a lost host; summary.json gives each instance's largest silence), when workers are still
running ``straggler_timeout`` seconds after one exited 0 (stragglers, named by rank), or on a hang found by its
watch of the live run (podrun.launch.live_watch: progress, the hang window, stacks, slow ranks, ``podrun stack``).
The Supervisor holds parts with narrow state and wires them: the Listener (podrun.launch.listener), the
Instances, the Failures (podrun.launch.outcome), the LiveWatch and the InstanceLogs (the output).
The root cause is the failure with the earliest agent time; its report (podrun.launch.outcome.Failures) carries
that worker's own last lines (kept per worker, bounded), its @record error if it wrote one, and separately the
last lines of the others, and the workers that ended after it in one summary (outcome.summarise_followers).
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from podrun.launch import control, hangs
from podrun.launch.instance_logs import InstanceLogs, Sink
from podrun.launch.listener import STALL_S, Listener, Silent
from podrun.launch.live_watch import LiveWatch, Progress
from podrun.launch.outcome import (Failure, FailureKind, Failures, Instances, InstanceState, InstanceStatus,
                                   attempt_outcome)
from podrun.launch.outcome import describe_code as _describe_code   # the wording of an exit, looked up at each
from podrun.launch.request import LaunchRequest
from podrun.launch.transports.base import InstanceHandle, Transport
from podrun.redaction import redact_text
from podrun.rundir import layout
from podrun.rundir.summary import Summary
from podrun.wire import protocol
from podrun.wire.protocol import LOST_EXIT
from podrun.wire.control import STACKS, Ask

STRAGGLER_EXIT = 124      # like timeout(1): workers still running past --straggler-timeout
# SIGHUP: terminal closed, ssh dropped; SIGUSR1: Slurm's warning before a preemption or the time limit
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)
# a launcher of joined agents (mpirun, srun) still running this long after its last agent ended well is ended: Open
# MPI 5's prterun was seen to hang at its teardown now and then after every rank had ended
LAUNCHER_LINGER_S = 5.0
WAITING_SAID_AFTER_S = 1.0   # workers still running this long after a SIGINT passed on are named on the console

# each protocol line's handler (a Supervisor method) by its kind: with UNHANDLED, every kind of protocol.KINDS
HANDLERS = {"out": "_on_output", "err": "_on_output", "part": "_on_part", "prog": "_on_progress", "stack": "_on_stacks",
            "ready": "_on_ready", "exit": "_on_exit", "error": "_on_error", "stop": "_on_stop", "note": "_on_note",
            "done": "_on_done"}
# what the loop does each turn after the item it heard, in this order (Supervisor methods)
DUTIES = ("_find_lost", "_watch_live", "_find_stragglers", "_begin_end", "_kill_late")
# the protocol's kinds the supervisor's loop does not read: why
UNHANDLED = {"probe": "a preflight answer, read by the transport's preflight before the loop starts",
             "start": "a worker's pid as its agent spawned it: the agent's own record, nothing the controller decides",
             "hb": "a heartbeat: every line is one (the Listener's hearing), this one carries nothing more"}

# notice(text): podrun's own status messages
Notice = Callable[[str], None]


@dataclass
class Ending:
    """The run's end everywhere once begun: since when, the deadline for agents that do not end, whether a second
    Ctrl-C asked for it now, whether the line naming the ranks still in their handler was said, and since when
    only launchers are left."""

    since: float | None = None
    kill_at: float | None = None
    force: bool = False
    waiting_said: bool = False
    launchers_alone: float | None = None   # since when only launchers' own handles (no instance) are open


class Supervisor:
    """One attempt's agents, from their start to its record (the module says how)."""

    def __init__(self, request: LaunchRequest, transport: Transport, *, sink: Sink | None = None,
                 notice: Notice | None = None, only_output_from: int | None = None, workers_per_instance: int = 1,
                 watch: hangs.WatchOptions | None = None, progress: Progress | None = None):
        self.req = request
        self.transport = transport
        self.notice = _safe(notice or (lambda t: None))
        self.instances = Instances(request, workers_per_instance)
        self.logs = InstanceLogs(request.run_dir, self.notice, sink, only_output_from, workers_per_instance > 1,
                                 request.rank_files, lambda i, lr, stream: layout.rank_log(
                                     request.restart_count, self.instances.rank(i, lr), stream))
        self.listener = Listener(request.liveness)
        self.failures = Failures()
        self.live = LiveWatch(request, self.instances, self.notice, transport.merged, self._hung, watch, progress)
        self.signalled: int | None = None
        self.ending = Ending()
        self.launchers: list[InstanceHandle] = []      # the handles of joined agents' launchers (no instance)
        self.answers: dict[str, Callable[[], dict]] = {}   # more control-socket requests by name (live views')
        self.inplace = None     # an elastic run's in-place recovery (podrun.elastic.inplace.InPlaceRecovery)

    def _hung(self, failure: Failure) -> None:
        if self.signalled is None:
            self.failures.append(failure)

    def _handle_line(self, h: InstanceHandle, ev: protocol.Event) -> None:
        """One agent line: output that is not the protocol's goes to the log and console of the handle's instance;
        a protocol line to its kind's handler (HANDLERS), with the instance's state and the time it was taken."""
        if ev.instance is None or ev.instance not in self.instances:    # the handle's own output
            idx = h.instances[0] if len(h.instances) == 1 else None
            self.instances.heard(idx, None, self.logs.output(idx, h.label, None, ev.kind, ev.text), ev.text)
            return
        if ev.kind in HANDLERS:
            getattr(self, HANDLERS[ev.kind])(self.instances[ev.instance], ev, time.monotonic())

    def _on_output(self, st: InstanceState, ev: protocol.Event, now: float) -> None:
        shown = self.logs.output(st.index, st.host, ev.local_rank, ev.kind, ev.text)
        self.instances.heard(st.index, ev.local_rank, shown, ev.text)
        if ev.local_rank is not None:
            self.live.moved(now)

    def _on_part(self, st: InstanceState, ev: protocol.Event, now: float) -> None:
        if (part := protocol.Part.read(ev.text)) is not None:
            self.logs.partial(st.index, st.host, ev.local_rank, part)     # the console's alone: logs keep lines
            self.live.moved(now)

    def _on_progress(self, st: InstanceState, ev: protocol.Event, now: float) -> None:
        if self.inplace is not None and self.inplace.heard(self, st, ev.local_rank, ev.text):
            return
        self.live.progress_report(st, ev.local_rank, ev.text, now)

    def _on_stacks(self, st: InstanceState, ev: protocol.Event, now: float) -> None:  # noqa: ARG002
        self.live.got_stacks(st.index, ev.local_rank, ev.text)

    def _on_ready(self, st: InstanceState, ev: protocol.Event, now: float) -> None:  # noqa: ARG002
        if (ready := protocol.Ready.read(ev.text)) is not None:
            st.host = self.transport.host_named(st.index, ready.hostname) or st.host
            st.status = InstanceStatus.RUNNING
            st.ready_s = round(time.time() - self.instances.t0, 3)

    def _on_exit(self, st: InstanceState, ev: protocol.Event, now: float) -> None:
        if (ex := protocol.WorkerExit.read(ev.text)) is None:
            return
        st.workers[ev.local_rank] = ex.code
        self.live.moved(now, started=False)  # a worker ending is news; the others get a new window
        if ex.code == 0 and self.instances.first_ok is None:
            self.instances.first_ok = (now, st.index, ev.local_rank)
        if ex.code != 0 and not ex.teardown and self.signalled is None:
            code = protocol.exit_code_from_returncode(ex.code)
            kind, reason = FailureKind.EXITED, _describe_code(code)
            if ex.hung_at_exit:          # its agent ended it (podrun.host.agent's exit watch)
                kind, reason = FailureKind.HUNG, (
                    f"hung at exit after its last line: alive {protocol.EXIT_HANG_S:g} s after its program returned, "
                    f"using no CPU; its agent ended it ({reason}); its stacks are in instance-{st.index}.log")
            self.failures.append(Failure(st.index, st.host, ev.local_rank, code, kind, reason, ex.at))

    def _on_error(self, st: InstanceState, ev: protocol.Event, now: float) -> None:  # noqa: ARG002
        if (info := protocol.WorkerError.read(ev.text)) is not None:
            self.failures.errors[(st.index, ev.local_rank)] = info.to_dict()

    def _on_stop(self, st: InstanceState, ev: protocol.Event, now: float) -> None:  # noqa: ARG002
        why = ev.text.partition(" ")[0]      # numbers that do not read: stamped now, no silence
        self._agent_stopping(st, protocol.AgentStop.read(ev.text) or protocol.AgentStop(why))

    def _on_note(self, st: InstanceState, ev: protocol.Event, now: float) -> None:  # noqa: ARG002
        self.logs.write(st.index, f"# podrun agent: {redact_text(ev.text)}")

    def _on_done(self, st: InstanceState, ev: protocol.Event, now: float) -> None:  # noqa: ARG002
        if (done := protocol.Done.read(ev.text)) is None:
            return
        code = done.code
        if ev.local_rank is not None:      # one agent per worker (mpirun --rank-from-env)
            st.agents_done[ev.local_rank] = code
            if len(st.agents_done) < self.instances.wpi:
                return
            code = next((c for c in st.agents_done.values() if c != 0), 0)
        status = InstanceStatus.OK if code == 0 else (InstanceStatus.FAILED if any(
            f.instance == st.index for f in self.failures) else InstanceStatus.TERMINATED)
        self.instances.end(st, st.status if st.status is InstanceStatus.LOST else status, code)

    def _agent_stopping(self, st, stop: protocol.AgentStop) -> None:
        """An agent began ending its workers (a ``stop`` line). One that heard nothing from this controller within
        its bound, or was signalled (not by this controller), while the run was not being stopped, is a failure of
        its own: the controller (or the link to the host) went silent, or the agent's launcher or someone ended it,
        and this is what the root cause says, not the workers' SIGTERM exits that follow."""
        if (stop.why not in (protocol.STOP_CONTROLLER_LOST, protocol.STOP_SIGNALLED) or self.ending.since is not None
                or self.signalled is not None
                or st.status is InstanceStatus.LOST):   # a host this controller found lost: its own loss says it
            return
        if stop.why == protocol.STOP_SIGNALLED:
            code, gone = self._launcher_gone() or (LOST_EXIT, None)
            self.failures.append(Failure(
                st.index, st.host, None, code, FailureKind.AGENT_ENDED,
                f"its agent was signalled and ended its workers: {gone}" if gone is not None else
                "its agent was signalled, not by this controller, and ended its workers (the host, the job's "
                "scheduler or a user ended it)", stop.at))
            return
        heard = (f"heard no heartbeat from the controller for {stop.silent_s:g} s" if stop.silent_s > 0
                 else "lost its connection to the controller")
        self.failures.append(Failure(
            st.index, st.host, None, LOST_EXIT, FailureKind.CONTROLLER_LOST,
            f"its agent {heard} and ended its workers: this machine (the controller's) or the link to the host "
            f"stalled; a heavily loaded controller machine needs a longer --keepalive "
            f"(now {self.req.liveness.controller_silence:g} s for an agent)", stop.at))

    def _launcher_gone(self) -> tuple[int, str] | None:
        """(its exit code, how) the launcher of joined agents (a handle that carries no instance: mpirun's, srun's)
        ended, when it has ended with a code that is not 0; else None."""
        for h in self.launchers:
            rc = h.poll()
            if rc is not None and rc != 0:
                code = protocol.exit_code_from_returncode(rc)
                return code, (f"{h.label}, the launcher of the agents, {_describe_code(code)} while the run went on: "
                              "its end ended them")
        return None

    def _handle_eof(self, h: InstanceHandle, silences: dict, at: float | None = None) -> None:
        """A handle's end (``at``: when it was heard; None: now): its instances that had not ended are lost or ended
        with its code, and a failure when the run was not ending. A joined agents' launcher that ended while they
        ran (killed, its step cancelled) is the failure instead: its own end (the launcher's handle may end after
        the agents it took with it: srun's helper holds its pipe), or the cause of its agents' connections ending."""
        at = time.time() if at is None else at
        rc = h.wait(timeout=2.0)
        quiet = self.ending.since is None and self.signalled is None        # the run was not being ended
        gone = self._launcher_gone() if quiet else None
        running = [st for st in self.instances.values()     # ready (joined): one never joined says so itself
                   if st.exit_code is None and st.status is InstanceStatus.RUNNING]
        if not h.instances and running and gone is not None:
            self.failures.append(Failure(running[0].index, running[0].host, None, gone[0], FailureKind.AGENT_ENDED,
                                         gone[1], at))
        for idx in h.instances:
            st = self.instances[idx]
            if st.exit_code is None and st.status is not InstanceStatus.LOST:
                code = LOST_EXIT if rc is None else (protocol.exit_code_from_returncode(rc) or 1)
                if code == LOST_EXIT and silences.get(idx) is not None:
                    st.lost_silence = silences[idx]   # its connection ended (ssh's own keepalive) after this
                taken = code == LOST_EXIT and gone is not None and h.lost_why is None     # by its launcher's end
                code = gone[0] if taken else code
                ending = self.ending.since is not None
                # an ssh connection that breaks while the run ends for another host's failure: this host crashed
                # too, and its peers' workers, whose connections to it were reset, merely said so first; lost, so
                # that a re-plan drops it and not the survivor that reported first
                dropped = (code == LOST_EXIT and ending and not quiet and self.signalled is None
                           and self.req.kind.ssh_per_host and h.lost_why is None)
                self.instances.end(st, InstanceStatus.LOST if dropped else
                                   InstanceStatus.TERMINATED if ending else InstanceStatus.FAILED, code)
                if dropped:
                    self.failures.append(Failure(idx, st.host, None, code, FailureKind.LOST,
                                                 "the connection to it was lost as the run ended for another "
                                                 f"failure (host crashed, sshd or agent killed; see "
                                                 f"instance-{idx}.log)", at))
                if quiet:
                    what = ("the connection to it was lost" if code == LOST_EXIT
                            else f"its agent ended with code {code}")
                    kind = FailureKind.LOST if code == LOST_EXIT else FailureKind.AGENT_ENDED
                    why = (f"its agent ended before it reported: {gone[1]}" if taken else h.lost_why or (
                        f"{what} before it reported ({self.req.kind.lost_means}; see instance-{idx}.log)"))
                    self.failures.append(Failure(idx, st.host, None, code, kind, why, at))

    # -- the loop ---------------------------------------------------------------------------
    def _on_signal(self, signum, frame) -> None:  # noqa: ARG002
        if self.signalled is None:
            self.signalled = signum
            self.logs.interrupted()
        else:
            self.ending.force = True          # a second Ctrl-C: do not wait for the grace period

    def run(self) -> Summary:
        """The attempt from its agents' start to its record, in the run directory the launch made and holds."""
        old = ({s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
               if threading.current_thread() is threading.main_thread() else {})
        server = None
        try:
            try:
                server = control.serve(self.req.run_dir, self._control)
            except OSError as exc:
                self.notice(f"cannot listen on {Path(self.req.run_dir) / layout.CONTROL_SOCKET}: "
                            f"{exc.strerror or exc}; podrun stack cannot reach this run")
            return self._run_started()
        finally:
            control.stop(self.req.run_dir, server)
            for s, h in old.items():
                signal.signal(s, h)
            self.logs.close()
            self.transport.close()

    def _control(self, ask: Ask) -> dict:
        if ask.what == STACKS:
            return self.live.request_stacks()
        if ask.what in self.answers:
            return self.answers[ask.what]()
        return {"error": f"unknown request {ask.what!r}"}

    def _run_started(self) -> Summary:
        handles = self.transport.start()
        self.launchers = [h for h in handles if not h.instances]
        try:
            # the controller listens and beats before agents held by the preflight start their workers: once they
            # do, the machine may be too busy to start a thread per host for seconds (64 took 8.9 s on 2 cores),
            # while the agents count their controller's silence from the go. The line hub reads what it can
            # (pipes: local, OpenSSH) from one thread; a handle it cannot read gets a thread of its own
            self.listener.start(handles)
            self.transport.release(handles)
            return self._loop(set(handles), {i: h for h in handles for i in h.instances})
        except BaseException:
            self.listener.done.set()
            for h in handles:          # never leave agents behind on an unexpected error
                h.terminate()
                h.kill()
            raise
        finally:
            self.listener.done.set()

    def _loop(self, open_handles: set, carrier: dict) -> Summary:
        """Each turn: one item heard (a line, or a handle's end), then every duty of DUTIES once."""
        turn = time.monotonic()
        while open_handles:
            self.listener.handles = tuple(open_handles)
            heard = self.listener.next(0.1)
            if heard is not None and heard.event is None:
                self._handle_eof(heard.handle, heard.silences, heard.at)
                open_handles.discard(heard.handle)
                heard.handle.close()
            elif heard is not None:
                self._handle_line(heard.handle, heard.event)
            now = time.monotonic()
            stalled, turn = now - turn - STALL_S, now
            if stalled > 0:              # this loop did not run (a starved or stopped controller): nobody listened
                self.listener.hearing.stall(stalled)
            for duty in DUTIES:
                getattr(self, duty)(now, open_handles, carrier)
        self.live.end()
        return self._outcome()

    def _find_lost(self, now: float, open_handles: set, carrier: dict) -> None:
        alive = [i for i, st in self.instances.items() if st.exit_code is None]
        for silent in self.listener.silent(now, alive, carrier):
            self._lost(silent, open_handles)
        if self.inplace is not None:
            self.inplace.tick(self, now)

    def _watch_live(self, now: float, open_handles: set, carrier: dict) -> None:  # noqa: ARG002
        self.live.tick(now, open_handles, self.ending.since is not None)

    def _find_stragglers(self, now: float, open_handles: set, carrier: dict) -> None:  # noqa: ARG002
        """Workers still running ``straggler_timeout`` s after the first one exited 0: a failure naming them."""
        first_ok = self.instances.first_ok
        if (self.req.straggler_timeout is None or first_ok is None or self.ending.since is not None
                or self.failures or now - first_ok[0] < self.req.straggler_timeout):
            return
        hung = self.instances.running(starting=True)
        if not hung:
            return
        ranks = ", ".join(_rank_text(self.instances.rank(*k)) for k in hung)
        _, inst, lr = first_ok
        st = self.instances[hung[0][0]]
        self.failures.append(Failure(
            st.index, st.host, hung[0][1], STRAGGLER_EXIT, FailureKind.STRAGGLERS,
            f"rank{'s' if len(hung) > 1 else ''} {ranks} still running {self.req.straggler_timeout:g} s after "
            f"rank {_rank_text(self.instances.rank(inst, lr))} exited 0 (--straggler-timeout): hung or stragglers",
            time.time()))

    def _begin_end(self, now: float, open_handles: set, carrier: dict) -> None:  # noqa: ARG002
        """On the first failure or signal: end the run on every host (the signal podrun got, else SIGTERM) and set
        the deadline for agents that do not end; the waiting line a moment after a signal."""
        if self.ending.since is None and (self.failures or self.signalled is not None):
            self.ending.since = now
            if self.signalled is not None:
                why = f"received {signal.Signals(self.signalled).name}"
            else:
                failed = self.failures[0]
                rank = "" if failed.local_rank is None else f", local rank {failed.local_rank}"
                why = f"{failed.reason} (instance {failed.instance} on {failed.host}{rank})"
            self.notice(f"ending the run on every host: {why}")
            first = self.signalled if self.signalled is not None else signal.SIGTERM
            for x in open_handles:
                if x.instances:
                    x.terminate(first)   # podrun's SIGINT or SIGHUP goes on as it is, as torchrun's does
                # a launcher of joined agents (its handle carries no instance) is left to end with them: its own
                # end (srun's abort of the step, mpirun's of the job) would kill them before they report
                # (_kill_late ends it once they have)
            grace = self.req.grace if first == signal.SIGTERM else self.req.interrupt_grace
            self.ending.kill_at = now + grace + protocol.TERM_TO_KILL_S + 3.0
        self._say_waiting(now)

    def _kill_late(self, now: float, open_handles: set, carrier: dict) -> None:  # noqa: ARG002
        """Agents still there at the deadline (or at once after a second Ctrl-C) are killed; so is a launcher whose
        joined agents have all ended (mpirun, srun: one that waits on a lost host's daemon, or hangs at its own
        teardown), a moment after them (LAUNCHER_LINGER_S after a run that ended well)."""
        kill_at = now if self.ending.kill_at is not None and self.ending.force else self.ending.kill_at
        if not any(x.instances for x in open_handles):
            if self.ending.launchers_alone is None:
                self.ending.launchers_alone = now
            alone_until = self.ending.launchers_alone + (
                protocol.TERM_TO_KILL_S if self.ending.since is not None else LAUNCHER_LINGER_S)
            kill_at = alone_until if kill_at is None else min(kill_at, alone_until)
        if kill_at is not None and now >= kill_at:
            for x in list(open_handles):
                if x.instances:
                    self.notice(f"{x.label}: the instance agent did not end in time; killing it")
                x.kill()
                x.close()
                self._handle_eof(x, {})
                open_handles.discard(x)

    def _say_waiting(self, now: float) -> None:
        """Once, a moment after a signal other than SIGTERM went on to the workers: the ranks still in their handler
        (a KeyboardInterrupt that saves), how long they get before SIGTERM, and that a second Ctrl-C ends them now."""
        if (self.ending.waiting_said or self.signalled in (None, signal.SIGTERM) or self.ending.since is None
                or self.ending.force or now - self.ending.since < WAITING_SAID_AFTER_S):
            return
        self.ending.waiting_said = True
        running = self.instances.running(starting=True)
        if not running:
            return
        from podrun.launch.stacks import rank_ranges

        by_host: dict[str, list[int]] = {}
        for index, lr in running:
            by_host.setdefault(self.instances[index].host, []).append(self.instances.rank(index, lr))
        who = "; ".join(f"rank{'s' if len(r) > 1 else ''} {rank_ranges(sorted(r), 8)} on {h}"
                        for h, r in list(by_host.items())[:4])
        more = f" and {len(by_host) - 4} more hosts" if len(by_host) > 4 else ""
        name = signal.Signals(self.signalled).name
        handler = "KeyboardInterrupt handler" if self.signalled == signal.SIGINT else f"{name} handler"
        whose = f"its {handler}" if len(running) == 1 else f"their {handler}s"
        self.notice(f"waiting up to {self.req.interrupt_grace:g} s for {who}{more} ({whose}); "
                    f"Ctrl-C again ends {'it' if len(running) == 1 else 'them'} now")

    def _lost(self, silent: Silent, open_handles: set) -> None:
        """An instance silent past its bound: its host is lost; it is ended, its loss said, and a handle that
        carries only lost instances is let go (nothing more will come from it)."""
        st = self.instances[silent.instance]
        self.instances.end(st, InstanceStatus.LOST, LOST_EXIT)
        if silent.heard:
            st.lost_silence = silent.seconds
            why = f"no heartbeat for {self.req.keepalive:g} s"
            self.notice(f"instance {st.index} on {st.host}: lost (no heartbeat for {self.req.liveness.describe()})")
        else:
            why = f"its agent sent nothing in the first {silent.limit:g} s"
            self.notice(f"instance {st.index} on {st.host}: lost ({why})")
        if self.signalled is None:
            failure = Failure(st.index, st.host, None, LOST_EXIT, FailureKind.LOST,
                              f"host {st.host} lost: {why} (link down, "
                              f"{'sshd gone' if self.req.kind.ssh_per_host else 'its agent stopped'} or "
                              "machine frozen)",
                              time.time())
            if self.inplace is None or not self.inplace.begin(self, st, failure, open_handles):
                self.failures.append(failure)
        lost = {i for i, s in self.instances.items() if s.status is InstanceStatus.LOST}
        for x in list(open_handles):
            if x.instances and set(x.instances) <= lost:    # a launcher's own handle carries none
                x.kill()
                x.close()
                open_handles.discard(x)

    def _outcome(self) -> Summary:
        """The attempt's record, once every handle has ended (no reader adds to the hearing's gaps any more)."""
        return attempt_outcome(self.req, self.instances, self.failures.root_cause(self.instances), self.signalled,
                               self.listener.hearing.gaps(),
                               self.live.hang, [dict(r) for r in self.live.slow.records],
                               {h: [list(p) for p in xs] for h, xs in self.live.hosts.series.items()},
                               self.live.splits.to_dict(), self.transport.joins())


def _rank_text(rank: int) -> str:
    return str(rank) if rank >= 0 else "?"


def _safe(f: Notice) -> Notice:
    def call(text: str) -> None:
        with contextlib.suppress(Exception):   # podrun's stderr closed: keep supervising
            f(text)
    return call
