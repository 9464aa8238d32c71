"""The instance agent (`python -m podrun.host.agent`): spawns an instance's workers and supervises them.

One agent runs per instance, started by a transport. It sets the env contract for each local worker,
starts each worker in its own process group with PR_SET_PDEATHSIG, streams their output as protocol
lines (podrun.wire.protocol, lines cut at protocol.MAX_LINE bytes so memory stays bounded; each worker's
stdout and stderr are SOCK_SEQPACKET sockets whose messages the kernel stamps, read by one thread that keeps
the order they were written in) on stdout, sends a heartbeat every --heartbeat seconds, forwards SIGINT/SIGTERM/SIGHUP, and ends every worker (the
signal or SIGTERM, then SIGKILL after --grace seconds) when one fails, when it is signalled, when the
controller asks (a ``T`` on stdin), or when it loses its controller (stdin closed, or silent for
--stdin-timeout seconds). The agent is a child subreaper (PR_SET_CHILD_SUBREAPER): whatever its
workers leave behind (a daemon started with setsid, a child of a killed shell) becomes its child, and
when the run ends it kills the workers' process groups and then every remaining descendant, so
nothing outlives the run, whether it succeeded or not. With --warm it forks the workers (and rank 0's store
host) from this host's zygote when one runs (podrun.host.zygote), and otherwise starts them as usual and
then starts the zygote for the attempts that may follow; where the host runs several workers of a program that
imports torch, the first attempt's agent (and every attempt's under srun or mpirun, --index-from-env) starts the
zygote first and forks them all from it; when it loses its controller (stdin closed or
silent, or reparented: the controller died) it tells the zygote to end at once. The agent runs under umask
077: whatever its workers write (torch's error files, metrics, checkpoints, snapshots) is private to the user
(0600 files, 0700 directories), as the run directory is.
Exit code: the first failing worker's (128+signal for a signal), 128+signal when signalled, else 0.
With --rank-from-env (mpirun) the agent runs one worker, the one whose global rank is
the launcher's rank, so each worker is an MPI rank; its lines then carry that worker's local rank.
With --hold (the ssh transport's preflight) it first reports its host's facts and starts workers only
when the controller, having heard from every host, writes ``G``; it exits 0 with nothing started if
told to stop instead. Each worker gets a progress pipe (PODRUN_PROGRESS_FD, podrun.runtime.progress) whose
records the agent relays as ``prog`` lines, and podrun's sitecustomize first on its PYTHONPATH
(podrun/runtime/site), which registers faulthandler on STACK_SIGNAL in each of its Python processes; an
``S`` on stdin (or, with --no-stdin-watch under mpirun/srun, a new token in the run dir's stacks-request
file, checked each second) makes the agent signal those processes and relay their stacks as ``stack``
lines, with the CPU time of each worker's process tree read just before (the controller tells a busy silent
script from a stuck one by two of them) and whether it was blocked reading the launcher's stdin then (a rank
waiting for its user: input(), pdb's prompt), while the workers go on.
With --agent-store, the agent of global rank 0 holds --master-port from its start
and serves the run's TCPStore on it (podrun.host.store).
With --env-stdin the agent first reads the run's --env from its stdin (podrun.wire.envchannel: one framed
message, before any other byte the controller writes) and sets it on its own environment, which its workers
inherit, as they would inherit values put before the agent on a command line.
With --join HOST:PORT (an agent started by srun or mpirun) the agent takes the run's key out of its environment,
joins its controller over TCP (podrun.wire.join) and speaks over that connection instead of stdout and stdin;
with --join-fd N the connection is descriptor N, joined already by a copy of `podrun launch` (one per node).
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

from podrun import safefs
from podrun.errors import PodrunError
from podrun.host import output, zygote_client
from podrun.host.link import ControllerLink
from podrun.host.proctree import end_descendants, reading_stdin, reap_orphans, tree_cpu
from podrun.host import stackdump
from podrun.host.stop import Stop, StopKind
from podrun.host.workers import (bind_worker, fresh_error_file, instance_workers, launcher_fds, read_env_stdin,
                                 read_error_file)
from podrun.wire import protocol
from podrun.wire.agent_args import AgentArgs, FromEnv, cores_text
from podrun.wire.liveness import FIRST_HEARTBEAT_S
from podrun.wire.worker_env import INPLACE_PLAN_ENV as INPLACE_ENV, PROGRESS_FD_ENV as PROGRESS_ENV
from podrun.proctl import PR_SET_CHILD_SUBREAPER, die_with_parent, prctl as _prctl, signal_group, signal_led_group

# the agent's own: it ends its workers with the one it got (SIGUSR1: Slurm's warning, sent to every task)
HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
EXIT_CHECK_S = 0.5          # how often the agent looks for workers hung at exit
SUPERVISE_TICK_S = 0.25     # the supervising loop's longest sleep between looks (its stdin silence check's step)
EXIT_CPU_S = 0.2            # CPU seconds a worker whose exit began may use without being called busy
EXIT_STACK_LINES = 60       # lines of a hung-at-exit worker's stacks put in the instance log
LINK_CLOSE_S = 10.0         # at its end, how long the agent waits for its last line to reach a slow controller


class Agent(ControllerLink):
    """One instance's workers on this host: started, waited on and ended together, as the module says."""

    def __init__(self, args: AgentArgs, index: int, envs: list[dict[str, str]], *, out=None,
                 probe: dict | None = None, local_ranks: list[int] | None = None, agent_rank: int | None = None,
                 warm: zygote_client.WarmHost | None = None):
        self.index = index
        # fork workers from this host's zygote (podrun.host.zygote) when it is there; start it for the next
        # attempt when it is not and one may follow
        self.warm = warm
        self.lease = None
        self.run_dir = args.attempt.run_dir   # without a stdin watch: where the controller's requests appear
        # the workers' local ranks (envs[i] is local rank local_ranks[i]): all of the instance's, or with
        # --rank-from-env the one worker this agent runs, whose local rank then also tags agent lines
        self.local_ranks = list(range(len(envs))) if local_ranks is None else list(local_ranks)
        self.agent_rank = agent_rank
        self.command = list(args.command)
        self.envs = envs
        self.grace = args.grace
        self.interrupt_grace = args.interrupt_grace
        watch = args.stdin_timeout is not None
        self.link_init(out, args.heartbeat, watch, args.stdin_timeout if watch else 0.0)
        self.stop: Stop | None = None
        self.stop_signal = signal.SIGTERM
        self.signalled: int | None = None
        self.first_failure: int | None = None   # the return code of the first worker to fail (before a teardown)
        self.procs: list[subprocess.Popen | None] = []
        self.readers: list[list[threading.Thread]] = []
        self.teardown_started = False
        self.probe = probe           # --hold: facts to report, then wait for the controller's go
        self.subreaper = False       # PR_SET_CHILD_SUBREAPER took effect (Linux)
        self.stack_root: str | None = None   # per worker w<n>/: the pid files of its faulthandler dumps
        # where each worker reads the controller's new plan (in-place recovery): a run that may restart, with stdin
        self.plan_root: str | None = None
        self.inplace = watch and args.attempt.restart_count < args.attempt.max_restarts
        self.parent = os.getppid()   # the controller (local) or the shell ssh started: gone when it changes
        self.zygote_told = False
        self.worker_stdin = args.worker_stdin_fd  # what local rank 0 reads as stdin (else /dev/null, as the others)
        self.stdin_id: tuple[int, int] | None = None   # that stdin's (st_dev, st_ino): a worker reading it waits
        self.helpers: list = []      # callables giving the pid of one of the agent's own children (or None)
        self.store = None            # rank 0's store (podrun.host.store.AgentStore), started before the workers
        self.ending: dict[int, list[float]] = {}   # worker whose exit began -> [idle since, its CPU seconds then]
        self.hung_exits: set[int] = set()          # workers ended as hung at exit
        # the supervising loop sleeps until a worker's exit (SIGCHLD; a zygote's fork: its exit line), a stop asked
        # (a signal, a token, a failure) or its next timed check: a byte on this pipe wakes it
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def request_stop(self, kind: StopKind, message: str, sig: int = signal.SIGTERM, silent_s: float = 0.0) -> None:
        if kind is StopKind.CONTROLLER_LOST or os.getppid() != self.parent:
            self._controller_gone()
        if self.stop is None:
            self.stop = Stop(kind, message, silent_s)
            self.stop_signal = sig
        self._wake()

    def _wake(self, *_) -> None:
        """Wake the supervising loop (also SIGCHLD's handler)."""
        with contextlib.suppress(OSError):          # full: it wakes anyway
            os.write(self.wake_w, b"!")

    def _sleep(self, until: float) -> None:
        """The supervising loop's wait: until a wake-up, an exit line on a zygote's fork's connection, or ``until``
        (monotonic), at most SUPERVISE_TICK_S."""
        wait = min(max(0.0, until - time.monotonic()), SUPERVISE_TICK_S)
        forks = [p.conn for p in self.procs if isinstance(p, zygote_client.WarmProc) and p.returncode is None]
        try:
            select.select([self.wake_r, *forks], [], [], wait)
        except (OSError, ValueError):     # a fork's connection closed meanwhile (its exit was read): look again
            return
        with contextlib.suppress(OSError):
            os.read(self.wake_r, 4096)

    def run_over(self) -> bool:
        """Whether the run ends here for this host: the agent lost its controller (which then drops this host), or
        was sent SIGINT or SIGTERM before anything else stopped it and no worker had failed. A signal after a
        worker's failure (even one that raced its exit line), or the controller's T, is the teardown before a
        restart, which reads this host's snapshots."""
        return self.stop is not None and (self.stop.kind is StopKind.CONTROLLER_LOST or (
            self.stop.kind is StopKind.SIGNALLED and self.stop_signal in (signal.SIGINT, signal.SIGTERM)
            and self.first_failure is None))

    def _controller_gone(self) -> None:
        """No attempt will follow: this host's zygote ends now, with the processes it forked."""
        if self.warm is None or self.zygote_told:
            return
        self.zygote_told = True
        zygote_client.quit_host(self.warm.run_dir, self.warm.host)

    # -- threads --------------------------------------------------------------------------
    def _dump_loop(self) -> None:
        while True:
            self.dumps.acquire()
            if self.stack_root is None:
                continue
            live = [(pos, p) for pos, p in enumerate(self.procs) if p is not None and p.poll() is None]
            at = time.monotonic()            # every worker's CPU time first, before any dump costs it some
            cpu = tree_cpu([p.pid for _, p in live])
            asking = set() if self.stdin_id is None else reading_stdin([p.pid for _, p in live], self.stdin_id)
            got = stackdump.collect(self.stack_root, [(pos, p.pid) for pos, p in live])
            for pos, p in live:
                g = got[pos]
                self.send(pos, protocol.Stacks(tuple(g["procs"]), g["problem"], g.get("exiting") is True,
                                               cpu.get(p.pid), round(at, 3), p.pid in asking))

    def _on_signal(self, signum, frame) -> None:  # noqa: ARG002
        self.signalled = signum
        self.request_stop(StopKind.SIGNALLED, f"received {signal.Signals(signum).name}", signum)

    # -- lifecycle ------------------------------------------------------------------------
    def spawn(self) -> None:
        self.zygote_first()
        if self.store is not None:      # served before any worker starts (forked by the zygote where one listens)
            self.store.start(self.envs, lambda text: self.emit(None, "note", text), warm=self.warm,
                             now=zygote_client.imports_torch(self.command))
            self.helpers.append(self.store.pid)
        base = dict(os.environ)
        keep_fds = launcher_fds(base)
        with contextlib.suppress(OSError, PodrunError):      # no stack directory: no stacks
            self.stack_root = safefs.make_temp_dir("podrun-stacks-")
        if self.inplace:
            with contextlib.suppress(OSError, PodrunError):      # no directory: the workers restart as before
                self.plan_root = safefs.make_temp_dir("podrun-inplace-")
        from podrun.runtime.snapshot import prepare_dirs

        for problem in prepare_dirs(self.envs):      # private snapshot directories, made before any worker runs
            self.emit(None, "err", problem)
        for local_rank, wenv in enumerate(self.envs):
            fresh_error_file(wenv.get("TORCHELASTIC_ERROR_FILE"))
            self._spawn_one(local_rank, {**base, **wenv}, keep_fds)
        if self.worker_stdin is not None:     # the worker holds it: its end of input is the terminal's
            with contextlib.suppress(OSError):
                st = os.fstat(self.worker_stdin)
                self.stdin_id = (st.st_dev, st.st_ino)
            os.close(self.worker_stdin)
            self.worker_stdin = None
        if self.warm is not None:
            self._keep_zygote()

    def _spawn_one(self, local_rank: int, env: dict[str, str], keep_fds: tuple[int, ...]) -> None:
        """Start the worker at ``local_rank`` (its environment ``env``, this host's and its contract), with its
        output sockets and progress pipe relayed by threads of their own; a worker that cannot start is
        reported as exited 127 (not found) or 126 and stops the others."""
        from podrun.wire.worker_env import OUTPUT_CHUNK_ENV, STACK_DIR_ENV, STACK_SIGNAL_ENV   # the env contract's

        r, w = os.pipe()
        env[PROGRESS_ENV] = str(w)
        if self.plan_root is not None:
            env[INPLACE_ENV] = os.path.join(self.plan_root, f"w{local_rank}.json")
        if self.stack_root is not None:
            where = os.path.join(self.stack_root, f"w{local_rank}")
            safefs.make_dir(where, "stack directory")
            env.update({STACK_DIR_ENV: where, STACK_SIGNAL_ENV: str(stackdump.STACK_SIGNAL)},
                       PYTHONPATH=os.pathsep.join(x for x in (stackdump.SITE_DIR, env.get("PYTHONPATH")) if x))
        streams, ends = output.output_sockets()
        # the largest write one message takes (the kernel refuses more with EMSGSIZE): Python workers write
        # more in pieces (podrun's sitecustomize)
        env[OUTPUT_CHUNK_ENV] = str(ends[0].getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) // 2)
        stdin = self.worker_stdin if self.local_ranks[local_rank] == 0 else None
        cores = bind_worker(env)
        if cores is not None:      # the instance log's line per worker: its rank and cores
            self.emit(local_rank, "note", f"--cpu-bind: local rank {self.local_ranks[local_rank]} (rank "
                                          f"{env.get('RANK', '?')}) on cores {cores_text(cores)}")
        p = self._spawn_warm(local_rank, env, w, ends, stdin) if self.warm is not None else None
        try:
            if p is None:
                p = subprocess.Popen(self.command, env=env, stdin=subprocess.DEVNULL if stdin is None else stdin,
                                     stdout=ends[0].fileno(), stderr=ends[1].fileno(),
                                     start_new_session=True, preexec_fn=_preexec(cores),
                                     pass_fds=(*keep_fds, w))
        except OSError as exc:
            os.close(r)
            for _, s in streams:
                s.close()
            self.emit(local_rank, "err", f"podrun agent: cannot start {self.command[0]!r}: {exc.strerror}")
            self.procs.append(None)
            self.readers.append([])
            self.send(local_rank, protocol.WorkerExit(127 if isinstance(exc, FileNotFoundError) else 126, time.time()))
            self.request_stop(StopKind.SPAWN_FAILED, f"local rank {local_rank} could not start")
            return
        finally:
            os.close(w)
            for s in ends:              # the worker holds the write ends now: their end is its output's
                s.close()
        self.procs.append(p)
        emit = functools.partial(self.emit, local_rank)
        reader = threading.Thread(target=output.pump, args=(streams, emit), daemon=True)
        threading.Thread(target=output.pump_progress, args=(r, emit), daemon=True).start()
        reader.start()
        self.readers.append([reader])
        self.send(local_rank, protocol.Start(p.pid))

    def _spawn_warm(self, local_rank: int, env: dict[str, str], progress_fd: int, ends, stdin: int | None = None):
        """The worker forked by this host's zygote, or None (no zygote: the caller starts it as usual); it
        writes its stdout and stderr to ``ends``, the write ends of the agent's output sockets, and reads
        ``stdin`` (a descriptor; else the zygote's choice)."""
        p = zygote_client.spawn(self.warm.run_dir, self.warm.host, self.command,
                                {k: v for k, v in env.items() if k != PROGRESS_ENV}, os.getcwd(),
                                {1: ends[0].fileno(), 2: ends[1].fileno(), PROGRESS_ENV: progress_fd,
                                 **({} if stdin is None else {0: stdin})})
        if isinstance(p, zygote_client.WarmProc):
            self.emit(local_rank, "note", f"warm start: local rank {self.local_ranks[local_rank]} forked by the "
                                          f"zygote (pid {p.zygote_pid}) as pid {p.pid}")
            return p
        if self.warm.later and p != zygote_client.NOT_PYTHON:
            self.emit(local_rank, "note", f"cold start: local rank {self.local_ranks[local_rank]}: {p}")
        return None

    def zygote_first(self) -> None:
        """Import once per host: where this first attempt's several workers (under a launcher, every attempt's) run a
        program that imports torch, start this host's zygote at the usual priority unless one listens already and
        wait for it (its imports are the workers' own, done once), so that the workers (and rank 0's store host) are
        forked from it as well; a zygote that fails to start, or ends or does not listen in time
        (zygote_client.wait_first), leaves them to start cold, with a note."""
        if self.warm is None or not self.warm.first or not zygote_client.imports_torch(self.command):
            return
        run_dir, host = self.warm.run_dir, self.warm.host
        self.lease = zygote_client.hold(run_dir, host, 0.0)     # an earlier attempt's, still there
        if self.lease is None:
            if not self._start_zygote(now=True):
                self.emit(None, "note", f"cold start: this host's zygote did not start (its log: "
                                        f"{zygote_client.socket_path(run_dir, host)[:-5]}.log)")
                return
            self.lease, why = zygote_client.wait_first(run_dir, host)
            if self.lease is None:
                self.emit(None, "note", f"cold start: {why}")

    def _start_zygote(self, now: bool = False) -> bool:
        """Start this host's zygote outside this subreaper's tree (it outlives the agent); False when it failed."""
        if self.subreaper:
            _prctl(PR_SET_CHILD_SUBREAPER, 0)
        try:
            return zygote_client.start(self.warm.run_dir, self.warm.host, now=now)
        finally:
            if self.subreaper:
                _prctl(PR_SET_CHILD_SUBREAPER, 1)

    def _keep_zygote(self) -> None:
        """Hold a lease on this host's zygote for the agent's life; start the zygote first when it is not
        there and another attempt may follow."""
        run_dir, host = self.warm.run_dir, self.warm.host
        if self.lease is None:
            self.lease = zygote_client.hold(run_dir, host, 0.0)
        if self.lease is not None or not self.warm.start_next or zygote_client.warm_target(self.command) is None \
                or not self._start_zygote():
            return

        def lease():       # however long its imports take under load (a daemon thread: it ends with the agent)
            self.lease = zygote_client.hold(run_dir, host, float("inf"))
        threading.Thread(target=lease, daemon=True).start()

    def _signal_all(self, sig: int) -> None:
        """``sig`` to each worker's process group: a live worker's, and a reaped worker's while the group lives
        (proctl.signal_led_group: never a later process given the worker's pid)."""
        for p in self.procs:
            if p is not None:
                signal_led_group(p, sig)

    def tell_plan(self, token) -> None:
        """The controller's new plan (a podrun.wire.plan_token.PlanToken) to each worker's plan file, written whole
        (its watch reads it within podrun.runtime.inplace.POLL_S); a note when it cannot be written."""
        if self.plan_root is None:
            return
        for pos, lr in enumerate(self.local_ranks):
            text = json.dumps({"generation": token.generation, "rank": token.first_rank + lr, "world": token.world,
                               "local_batch": token.local_batch, "grad_accum": token.grad_accum}) + "\n"
            try:
                safefs.write_file(os.path.join(self.plan_root, f"w{pos}.json"), text, "in-place plan",
                                  durable=False)
            except (OSError, PodrunError) as exc:
                self.emit(None, "note", f"cannot write the new plan for local rank {lr}: {exc}")

    def own(self) -> frozenset[int]:
        """The pids of the agent's own helpers among its children (the store host): no worker left them."""
        return frozenset(pid for pid in (h() for h in self.helpers) if pid is not None)

    def run(self) -> int:
        code: int | None = None
        try:
            code = self._run()
            return code
        finally:                                # also on an unexpected error: nothing outlives the agent
            self._signal_all(signal.SIGKILL)
            end_descendants(spare=self.own())
            import shutil

            for root in (self.stack_root, self.plan_root):
                if root is not None:
                    shutil.rmtree(root, ignore_errors=True)
            if self.procs:                      # workers ran: their snapshots go when no restart can use them
                from podrun.runtime.snapshot import drop_when_done

                drop_when_done(self.envs, code, self.run_over())

    def _run(self) -> int:
        self.subreaper = _prctl(PR_SET_CHILD_SUBREAPER, 1)
        for s in HANDLED:
            signal.signal(s, self._on_signal)
        signal.signal(signal.SIGCHLD, self._wake)
        self.send(None, protocol.Ready(socket.gethostname(), os.getpid(), len(self.envs)))
        threading.Thread(target=self._heartbeat, daemon=True).start()
        if self.stdin_watch:
            threading.Thread(target=self._watch_stdin, daemon=True).start()
        threading.Thread(target=self._dump_loop, daemon=True).start()
        if self.probe is not None and not self._held_until_go():
            self.send(None, protocol.Done(0))
            return 0
        self.spawn()
        self._supervise_workers()
        self._end_leftovers()
        code = self._exit_code()
        self.send(None, protocol.Done(code))
        return code

    def _supervise_workers(self) -> None:
        """Until every worker is reaped: report each exit, end them all once a stop is asked (its signal, then
        SIGTERM after --grace where that was another, then SIGKILL), and collect orphans that reparent here."""
        reaped = [p is None for p in self.procs]
        kill_at: float | None = None
        term_at: float | None = None
        next_reap = next_exit = time.monotonic() + 1.0
        while not all(reaped):
            self._reap_exited(reaped)
            self._check_stdin_silence()
            if self.stack_root is not None and not self.teardown_started and time.monotonic() >= next_exit:
                next_exit = time.monotonic() + EXIT_CHECK_S
                self._watch_exits(reaped)
            if self.stop is not None and not self.teardown_started:
                term_at, kill_at = self._begin_teardown(all(reaped))
            if term_at is not None and time.monotonic() >= term_at:
                term_at = None
                self._signal_all(signal.SIGTERM)
            if kill_at is not None and time.monotonic() >= kill_at:
                self._signal_all(signal.SIGKILL)
                kill_at = time.monotonic() + 1.0
            if self.subreaper and time.monotonic() >= next_reap:
                next_reap = time.monotonic() + 1.0
                reap_orphans({p.pid for p in self.procs if p is not None})
            self._sleep(min(t for t in (next_reap, next_exit, term_at, kill_at, time.monotonic() + 1.0)
                            if t is not None))

    def _reap_exited(self, reaped: list[bool]) -> None:
        """Report each worker that exited since the last look (its @record error first when it failed); the first
        to fail before any teardown asks every other to stop."""
        exited = []                            # every worker ended now, stamped when reaped (one pass, before
        for lr, p in enumerate(self.procs):    # any wait for a worker's last lines delays the others' stamps; a
            if not reaped[lr] and p is not None and p.poll() is not None:    # zygote's fork: when the zygote did)
                reaped[lr] = True
                at = getattr(p, "ended_at", None)     # a zygote's fork: when the zygote reaped it
                exited.append((lr, p.returncode, time.time() if at is None else at))
        for lr, rc, ended in sorted(exited, key=lambda e: e[2]):     # the first to end is told first
            for t in self.readers[lr]:
                t.join(timeout=1.0)
            info = read_error_file(self.envs[lr].get("TORCHELASTIC_ERROR_FILE") or "") if rc != 0 else None
            if info is not None:         # its @record error file, as an ``error`` line (JSON)
                self.send(lr, info)
            self.send(lr, protocol.WorkerExit(rc, ended, self.teardown_started, lr in self.hung_exits))
            if rc != 0 and self.first_failure is None and not self.teardown_started:
                self.first_failure = rc         # its teardown may precede a restart: snapshots stay
                self.request_stop(StopKind.WORKER_FAILED,
                                  f"local rank {lr} exited with {protocol.exit_code_from_returncode(rc)}")

    def _watch_exits(self, reaped: list[bool]) -> None:
        """End each worker whose exit began (its <pid>.ending, podrun/runtime/site) and that has stayed alive since
        without using CPU (EXIT_CPU_S) for protocol.EXIT_HANG_S: hung at exit, its stacks first in the instance log."""
        now = time.monotonic()
        ending = [(lr, p) for lr, p in enumerate(self.procs) if not reaped[lr] and p is not None
                  and lr not in self.hung_exits and os.path.exists(os.path.join(self.stack_root, f"w{lr}",
                                                                                 f"{p.pid}.ending"))]
        cpu = tree_cpu([p.pid for _, p in ending]) if ending else {}
        for lr, p in ending:
            if (used := cpu.get(p.pid)) is None:
                continue
            seen = self.ending.setdefault(lr, [now, used])
            if used - seen[1] > EXIT_CPU_S:
                seen[:] = [now, used]
            elif now - seen[0] >= protocol.EXIT_HANG_S:
                self._end_hung_exit(lr, p.pid)

    def _end_hung_exit(self, lr: int, pid: int) -> None:
        """A worker hung at exit: its Python stacks (none once past its atexit) and its threads' kernel waits to the
        instance log, then SIGKILL; its exit line says why."""
        self.hung_exits.add(lr)
        got = stackdump.collect(self.stack_root, [(lr, pid)])[lr]
        text = "\n".join([*(x["text"] for x in got["procs"] if x["text"]), stackdump.kernel_waits(pid)])
        self.emit(lr, "note", f"local rank {self.local_ranks[lr]} hung at exit: alive {protocol.EXIT_HANG_S:g} s "
                              f"after its program returned, using no CPU; ending it (SIGKILL). Its stacks:")
        for line in text.splitlines()[:EXIT_STACK_LINES]:
            self.emit(lr, "note", line)
        signal_group(pid, signal.SIGKILL)

    def _begin_teardown(self, all_reaped: bool) -> tuple[float | None, float]:
        """Signal every worker with the stop's signal; returns when to send SIGTERM (None: no need) and SIGKILL."""
        self.teardown_started = True
        if not all_reaped:
            self.send(None, protocol.AgentStop(self.stop.kind.value, time.time(), self.stop.silent_s))
            self.emit(None, "note", f"ending workers: {self.stop.message}")
        self._signal_all(self.stop_signal)
        if self.stop_signal != signal.SIGTERM:   # SIGINT, SIGHUP or SIGUSR1 first: SIGTERM for what outlives it
            term_at = time.monotonic() + self.interrupt_grace
            return term_at, term_at + protocol.TERM_TO_KILL_S
        return None, time.monotonic() + self.grace

    def _end_leftovers(self) -> None:
        """Once every worker is reaped: kill what is left of their process groups and whatever escaped them, then
        let the last lines out."""
        self._signal_all(signal.SIGKILL)   # leftovers in the workers' process groups
        left = end_descendants(spare=self.own())   # then whatever escaped them (setsid daemons, orphans)
        if left:
            self.emit(None, "note", f"ended {len(left)} leftover process(es) the workers left behind: "
                                    + ", ".join(left))
        deadline = time.monotonic() + 5.0  # every writer is gone: the pipes end, the last lines get out
        for t in (t for ts in self.readers for t in ts):
            t.join(timeout=max(0.0, deadline - time.monotonic()))

    def _exit_code(self) -> int:
        """The first failing worker's code, 128+signal when signalled, 127 when a worker could not start, else the
        teardown's 128+signal when workers were ended by it, else 0."""
        if self.first_failure is not None:
            return protocol.exit_code_from_returncode(self.first_failure)
        if self.signalled is not None:
            return 128 + self.signalled
        if any(p is None for p in self.procs):
            return 127
        if any(p is not None and p.returncode != 0 for p in self.procs):
            return 128 + int(self.stop_signal)   # workers ended by the teardown the controller asked for
        return 0


def _preexec(cores: tuple[int, ...] | None):
    """The worker's preexec_fn: it dies with the agent and, bound (--cpu-bind), runs on ``cores`` only."""
    die = die_with_parent()
    if cores is None:
        return die

    def preexec() -> None:
        die()
        os.sched_setaffinity(0, cores)
    return preexec


def main(argv: list[str] | None = None) -> int:
    args = AgentArgs.parse(argv, __doc__.splitlines()[0])
    os.umask(0o077)                    # the workers' files are private, as the run directory's
    key = None
    if args.join is not None:          # the run's key, out of the environment before any worker's is made
        from podrun.wire.join import take_key

        key = take_key()
    if args.env_stdin:
        read_env_stdin()
    index, local_ranks, agent_rank, envs = instance_workers(args)
    rank0 = any(e["RANK"] == "0" for e in envs)
    store = None
    if args.agent_store and rank0:
        from podrun.host.store import AgentStore

        store = AgentStore.open(args.attempt.master_port, args.listen_fd)    # reserve the port now, before any report
    probe = _probe(args, rank0, store) if args.hold else None
    restart, max_restarts = args.attempt.restart_count, args.attempt.max_restarts
    # an agent that a launcher started (srun, mpirun: a new step each attempt, where an earlier step's zygote may have
    # ended with it) forks every attempt's several workers, starting this host's zygote when none listens
    launched = args.instance is FromEnv.INDEX
    warm = None
    if args.warm:
        warm = zygote_client.WarmHost(args.attempt.run_dir, socket.gethostname(), start_next=restart < max_restarts,
                                      later=restart > 0, first=len(envs) > 1 and (restart == 0 or launched))
    agent = Agent(args, index, envs, probe=probe, local_ranks=local_ranks, agent_rank=agent_rank, warm=warm)
    if args.join is not None or args.join_fd is not None:
        agent.join_controller(args.join, args.join_fd, args.attempt.run_id, key, FIRST_HEARTBEAT_S)
    if store is not None and not (probe is not None and probe.ports_busy):    # busy: the controller will not say go
        agent.store = store
    try:
        code = agent.run()
    finally:
        if store is not None:
            store.close()
        agent.link_close(LINK_CLOSE_S)
    # Leave without the interpreter's finalization: what it would do is done (the last line out when delivered,
    # every process and helper ended), its module teardown and collection cost ~15 ms of CPU alone and more where
    # every host's agent ends at once (2 CPU-s over 64 agents on one machine, bench/RESULTS.md), and when the last
    # line is still blocked on a controller that reads no more, its flush of stdout can abort on the daemon thread
    # that holds stdout's lock.
    sys.stderr.flush()
    os._exit(code)


def _probe(args: AgentArgs, rank0: bool, store):
    """--hold: this host's facts for the controller's preflight (podrun.wire.probe.facts)."""
    from podrun.wire.probe import facts

    at = args.attempt
    ports = [at.master_port] if rank0 else []
    # the agent store's port is busy when it could not be bound; else (no agent store) facts() tries it
    return facts(ports, None if store is None else ports if store.error is not None else [], needs=list(args.needs),
                 master_addr=at.master_addr, master_port=None if rank0 else at.master_port)


if __name__ == "__main__":
    sys.exit(main())
