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
then starts the zygote for the attempts that may follow; when it loses its controller (stdin closed or
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
script from a stuck one by two of them), while the workers go on. With --agent-store, the agent of global rank 0 holds --master-port from its start
and serves the run's TCPStore on it (podrun.host.store).
With --env-stdin the agent first reads the run's --env from its stdin (podrun.wire.envchannel: one framed
message, before any other byte the controller writes) and sets it on its own environment, which its workers
inherit, as they would inherit values put before the agent on a command line.
"""
from __future__ import annotations

import argparse
import enum
import json
import mmap
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from podrun.host import stackdump
from podrun.host.stackdump import STACK_SIGNAL
from podrun.wire import protocol
from podrun.wire.liveness import FIRST_HEARTBEAT_S, HEARTBEAT_MISSES, HEARTBEAT_S
from podrun.wire.proctl import PR_SET_CHILD_SUBREAPER, die_with_parent, prctl as _prctl, proc_stats
from podrun.runtime.progress import FD_ENV as PROGRESS_ENV

INDEX_ENV = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")
ERROR_TRACEBACK_LINES = 40   # of a worker's @record traceback, sent to the controller
ERROR_MESSAGE_CHARS = 2000
SITE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runtime", "site")
HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)   # the agent's own: it ends its workers with the one it got


def worker_envs(plan, index: int, *, run_id: str, run_dir: str, plan_path: str, master_addr: str,
                master_port: int, restart_count: int = 0, max_restarts: int = 0,
                agent_store: bool = False) -> list[dict[str, str]]:
    """The env contract of instance ``index``'s workers on this host (podrun.plan.worker_env.instance_envs),
    with this host's environment, the cores this agent may use and, in a run over several hosts, gloo's
    interface where this host's name resolves to loopback (podrun.wire.probe.gloo_interface)."""
    from podrun.wire.probe import gloo_interface
    from podrun.plan.worker_env import instance_envs

    several = len({p.host for p in plan.placement}) > 1
    return instance_envs(plan, index, run_id=run_id, run_dir=run_dir, plan_path=plan_path,
                         master_addr=master_addr, master_port=master_port, restart_count=restart_count,
                         max_restarts=max_restarts, agent_store=agent_store, host_env=os.environ,
                         cpus=len(os.sched_getaffinity(0)),
                         gloo_ifname=gloo_interface(master_addr) if several else None)


def read_error_file(path: str) -> dict | None:
    """What torch's ``@record`` wrote to TORCHELASTIC_ERROR_FILE: {message, traceback, file}, or None.

    The file is JSON, ``{"message": {"message": "Type: text", "extraInfo": {"py_callstack": ...}}}``
    (or ``{"message": "text"}``); the traceback is cut to its last ERROR_TRACEBACK_LINES lines.
    """
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    msg = data.get("message") if isinstance(data, dict) else None
    tb = ""
    if isinstance(msg, dict):
        extra = msg.get("extraInfo") if isinstance(msg.get("extraInfo"), dict) else {}
        tb = str(extra.get("py_callstack") or "")
        msg = msg.get("message")
    if msg is None:
        return None
    lines = tb.rstrip("\n").splitlines()[-ERROR_TRACEBACK_LINES:]
    return {"message": str(msg)[:ERROR_MESSAGE_CHARS], "traceback": [l[:ERROR_MESSAGE_CHARS] for l in lines],
            "file": path}


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, state) of the live processes whose parent is ``pid``, from /proc."""
    return [(p, fields[0].decode()) for p, fields in proc_stats() if len(fields) > 1 and int(fields[1]) == pid]


def tree_cpu(roots: list[int]) -> dict[int, float]:
    """CPU seconds (user + system, every thread, and the reaped children's) of each root's process tree:
    the process and all its live descendants, read from /proc in one pass."""
    tick = os.sysconf("SC_CLK_TCK")
    parent, used = {}, {}
    for pid, fields in proc_stats():
        if len(fields) > 14:      # after the name: state ppid ... utime(12) stime(13) cutime(14) cstime(15)
            parent[pid] = int(fields[1])
            used[pid] = sum(int(x) for x in fields[11:15]) / tick
    kids: dict[int, list[int]] = {}
    for pid, pp in parent.items():
        kids.setdefault(pp, []).append(pid)
    out = {}
    for root in roots:
        if root not in used:
            continue
        total, todo, seen = 0.0, [root], {root}
        while todo:
            pid = todo.pop()
            total += used.get(pid, 0.0)
            for k in kids.get(pid, ()):
                if k not in seen:
                    seen.add(k)
                    todo.append(k)
        out[root] = round(total, 3)
    return out


def _reap(pid: int) -> bool:
    """Collect ``pid`` if it has ended; True when it is gone."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return True


def _describe(pid: int) -> str:
    """``pid N (command line)`` of a live process, its command line cut at 300 characters."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        cmd = ""
    return f"pid {pid} ({cmd[:300] or '?'})"


def end_descendants(timeout: float = 5.0, spare: frozenset[int] = frozenset()) -> list[str]:
    """Kill every child of this process (and, as a subreaper, every orphan that reparents to it) but the
    ``spare`` ones (the agent's own helpers, ended by their owners) until none is left or ``timeout``
    passes; returns each killed process as ``pid N (command line)``."""
    me, killed = os.getpid(), {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = [(pid, state) for pid, state in _children(me) if pid not in spare]
        if not kids:
            break
        for pid, state in kids:
            if state != "Z":
                if pid not in killed:
                    killed[pid] = _describe(pid)
                for kill in (os.killpg, os.kill):
                    try:
                        kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
            _reap(pid)
        time.sleep(0.01)
    return list(killed.values())


class StopKind(enum.Enum):
    """Why an agent ends its workers: what it decides on (whether snapshots outlive it) reads this, not the text."""

    CONTROLLER_LOST = "controller-lost"     # stdout or stdin closed, or no heartbeat on stdin: the run is over here
    CONTROLLER_ASKED = "controller-asked"   # a T on stdin
    SIGNALLED = "signalled"                 # SIGTERM, SIGINT or SIGHUP to the agent
    WORKER_FAILED = "worker-failed"         # a worker exited non-zero
    SPAWN_FAILED = "spawn-failed"           # a worker could not start


@dataclass(frozen=True)
class Stop:
    """The first reason to end this agent's workers, and the line the agent says about it."""

    kind: StopKind
    message: str


class Agent:
    def __init__(self, index: int, command: list[str], envs: list[dict[str, str]], *, grace: float,
                 stdin_watch: bool, stdin_timeout: float, heartbeat: float = HEARTBEAT_S, out=None,
                 probe: dict | None = None, local_ranks: list[int] | None = None, agent_rank: int | None = None,
                 run_dir: str | None = None, warm: tuple[str, str, bool] | None = None,
                 worker_stdin: int | None = None):
        self.index = index
        # (run dir, host, start one): fork workers from this host's zygote (podrun.host.zygote) when it is
        # there; start it for the next attempt when it is not and one may follow
        self.warm = warm
        self.lease = None
        self.run_dir = run_dir       # without a stdin watch: where the controller's stacks-request appears
        # the workers' local ranks (envs[i] is local rank local_ranks[i]): all of the instance's, or with
        # --rank-from-env the one worker this agent runs, whose local rank then also tags agent lines
        self.local_ranks = list(range(len(envs))) if local_ranks is None else list(local_ranks)
        self.agent_rank = agent_rank
        self.command = command
        self.envs = envs
        self.grace = grace
        self.stdin_watch = stdin_watch
        self.stdin_timeout = stdin_timeout
        self.heartbeat = heartbeat   # seconds between this agent's heartbeats to the controller
        self.out = out if out is not None else sys.stdout.buffer
        self.lock = threading.Lock()
        self.stop: Stop | None = None
        self.stop_signal = signal.SIGTERM
        self.signalled: int | None = None
        self.worker_failed = False          # a worker failed before any teardown began
        self.controller_lost = False
        self.last_stdin = time.monotonic()
        self.got_stdin = False       # before the first heartbeat: the controller may still be starting others
        self.procs: list[subprocess.Popen | None] = []
        self.readers: list[list[threading.Thread]] = []
        self.teardown_started = False
        self.probe = probe           # --hold: facts to report, then wait for the controller's go
        self.go = threading.Event()
        self.subreaper = False       # PR_SET_CHILD_SUBREAPER took effect (Linux)
        self.stack_root: str | None = None   # per worker w<n>/: the pid files of its faulthandler dumps
        self.dumps = threading.Semaphore(0)  # one release per ``S`` on stdin
        self.parent = os.getppid()   # the controller (local) or the shell ssh started: gone when it changes
        self.zygote_told = False
        self.worker_stdin = worker_stdin  # what local rank 0 reads as stdin (else /dev/null, as the others)
        self.helpers: list = []      # callables giving the pid of one of the agent's own children (or None)

    # -- output ---------------------------------------------------------------------------
    def emit(self, local_rank: int | None, kind: str, text: str = "") -> None:
        """One protocol line; ``local_rank`` is the worker's position in ``envs`` (None: the agent's own)."""
        local_rank = self.agent_rank if local_rank is None else self.local_ranks[local_rank]
        line = (protocol.encode(self.index, local_rank, kind, text) + "\n").encode("utf-8", "replace")
        with self.lock:
            if self.controller_lost:
                return
            try:
                self.out.write(line)
                self.out.flush()
            except (BrokenPipeError, OSError, ValueError):
                self.controller_lost = True
                self.request_stop(StopKind.CONTROLLER_LOST, "lost the controller (stdout closed)")

    def request_stop(self, kind: StopKind, message: str, sig: int = signal.SIGTERM) -> None:
        if kind is StopKind.CONTROLLER_LOST or os.getppid() != self.parent:
            self._controller_gone()
        if self.stop is None:
            self.stop = Stop(kind, message)
            self.stop_signal = sig

    def run_over(self) -> bool:
        """Whether the run ends here for this host: the agent lost its controller (which then drops this host), or
        was sent SIGINT or SIGTERM before anything else stopped it and no worker had failed. A signal after a
        worker's failure (even one that raced its exit line), or the controller's T, is the teardown before a
        restart, which reads this host's snapshots."""
        if self.stop is None:
            return False
        if self.stop.kind is StopKind.CONTROLLER_LOST:
            return True
        return (self.stop.kind is StopKind.SIGNALLED and self.stop_signal in (signal.SIGINT, signal.SIGTERM)
                and not self.worker_failed)

    def _controller_gone(self) -> None:
        """No attempt will follow: this host's zygote ends now, with the processes it forked."""
        if self.warm is None or self.zygote_told:
            return
        self.zygote_told = True
        from podrun.host import zygote

        zygote.quit_host(*self.warm[:2])

    # -- threads --------------------------------------------------------------------------
    def _pump(self, local_rank: int, streams: list[tuple[str, socket.socket]]) -> None:
        """Relay a worker's stdout and stderr as ``out``/``err`` lines in the order it wrote them.

        Each stream is a SOCK_SEQPACKET socket whose every write is one message stamped by the kernel when
        it was sent (SO_TIMESTAMPNS); one thread reads both and emits in stamp order. A message read in one
        pass may be preceded (in stamp order) by one of the other stream that arrives in the next pass only
        if the writer's sendmsg was in flight across the first; so a pass emits what earlier passes read,
        merged with this pass's messages stamped before the last of them, and holds the rest one more pass."""
        socks = {s.fileno(): (kind, s) for kind, s in streams}
        lines = {kind: protocol.LineAssembler() for kind, _ in streams}
        room = max(s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) for _, s in streams)
        buf = mmap.mmap(-1, max(room, _WRITE_BUF * 2))    # untouched pages cost nothing
        poller = select.poll()
        for fd in socks:
            poller.register(fd, select.POLLIN)
        held: list[tuple[int, int, str, bytes]] = []       # read in an earlier pass: (stamp, order, kind, data)
        order = 0

        def emit(kind: str, data: bytes) -> None:
            for raw in lines[kind].feed(data):
                self.emit(local_rank, kind, raw.decode("utf-8", "replace"))

        try:
            while socks or held:
                poller.poll(0 if held else None)
                new = []
                capped = []                               # last stamps of streams left unread past a pass's share
                for fd, (kind, s) in list(socks.items()):
                    got = 0
                    while True:
                        if got >= room:                   # a pass takes at most a receive buffer of each stream:
                            capped.append(new[-1][0])     # memory stays bounded however fast the worker writes
                            break
                        try:
                            n, anc, _, _ = s.recvmsg_into([buf], _STAMP_ROOM, socket.MSG_DONTWAIT)
                        except (BlockingIOError, InterruptedError):
                            break
                        except OSError:
                            n, anc = 0, []
                        if n == 0 and not anc:            # every copy of the write end is closed
                            poller.unregister(fd)
                            s.close()
                            del socks[fd]
                            break
                        order += 1
                        got += n
                        new.append((_stamp(anc), order, kind, bytes(buf[:n])))
                merged = sorted(held + new)
                old = {m[1] for m in held}
                last_old = max((i for i, m in enumerate(merged) if m[1] in old), default=-1)
                if not socks:                             # nothing more can come: all of it, in order
                    last_old = len(merged) - 1
                if capped:                                # a stream's unread messages may precede later stamps
                    last_old = min(last_old, max((i for i, m in enumerate(merged) if m[0] <= min(capped)),
                                                 default=-1))
                for _, _, kind, data in merged[:last_old + 1]:
                    emit(kind, data)
                held = merged[last_old + 1:]
            for kind in lines:
                for raw in lines[kind].end():
                    self.emit(local_rank, kind, raw.decode("utf-8", "replace"))
        except (OSError, ValueError):
            pass
        finally:
            buf.close()
            for _, s in socks.values():
                s.close()

    def _pump_progress(self, local_rank: int, fd: int) -> None:
        """Relay a worker's progress records (JSON lines on its PODRUN_PROGRESS_FD pipe) as ``prog`` lines."""
        try:
            with os.fdopen(fd, "rb") as f:
                for raw in protocol.bounded_lines(f, 4096):
                    text = raw.decode("utf-8", "replace").strip()
                    if text.startswith("{"):
                        self.emit(local_rank, "prog", text)
        except (OSError, ValueError):
            pass

    def _dump_loop(self) -> None:
        while True:
            self.dumps.acquire()
            if self.stack_root is None:
                continue
            live = [(pos, p) for pos, p in enumerate(self.procs) if p is not None and p.poll() is None]
            at = time.monotonic()            # every worker's CPU time first, before any dump costs it some
            cpu = tree_cpu([p.pid for _, p in live])
            got = stackdump.collect(self.stack_root, [(pos, p.pid) for pos, p in live])
            for pos, p in live:
                rec = {**got[pos], "cpu": cpu.get(p.pid), "at": round(at, 3)}
                self.emit(pos, "stack", json.dumps(rec, separators=(",", ":")))

    def _heartbeat(self) -> None:
        from podrun.wire.protocol import read_request, read_stop

        watch_file = not self.stdin_watch and self.run_dir is not None
        token = read_request(self.run_dir) if watch_file else ""
        stop_token = read_stop(self.run_dir)[0] if watch_file else ""
        while True:
            self.emit(None, "hb", f"{time.time():.3f}")
            if watch_file:
                now = read_request(self.run_dir)
                if now != token:
                    token = now
                    self.dumps.release()
                now, sig = read_stop(self.run_dir)
                if now != stop_token and sig is not None:
                    stop_token = now
                    self.request_stop(StopKind.CONTROLLER_ASKED, f"the controller relayed {signal.Signals(sig).name}",
                                      sig)
            time.sleep(self.heartbeat)

    def _watch_stdin(self) -> None:
        while True:
            try:
                data = os.read(0, 256)
            except OSError:
                data = b""
            if not data:
                self.request_stop(StopKind.CONTROLLER_LOST, "lost the controller (stdin closed)")
                return
            self.last_stdin = time.monotonic()
            self.got_stdin = True
            if b"G" in data:
                self.go.set()
            stops = sorted((data.index(tok), tok) for tok in protocol.STOP_TOKENS if tok in data)
            if stops:                                        # the first in the stream wins
                tok = stops[0][1]
                name = protocol.STOP_TOKENS[tok]
                self.request_stop(StopKind.CONTROLLER_ASKED, "the controller asked to stop" if tok == b"T"
                                  else f"the controller relayed {name}", getattr(signal, name))
            for _ in range(data.count(b"S")):
                self.dumps.release()

    def _on_signal(self, signum, frame) -> None:  # noqa: ARG002
        self.signalled = signum
        self.request_stop(StopKind.SIGNALLED, f"received {signal.Signals(signum).name}", signum)

    # -- lifecycle ------------------------------------------------------------------------
    def spawn(self) -> None:
        base = dict(os.environ)
        keep_fds = _launcher_fds(base)
        try:
            self.stack_root = tempfile.mkdtemp(prefix="podrun-stacks-")
        except OSError:
            self.stack_root = None
        from podrun.runtime.snapshot import prepare_dirs

        for problem in prepare_dirs(self.envs):      # private snapshot directories, made before any worker runs
            self.emit(None, "err", problem)
        for local_rank, wenv in enumerate(self.envs):
            _fresh_error_file(wenv.get("TORCHELASTIC_ERROR_FILE"))
            env = {**base, **wenv}
            r, w = os.pipe()
            env[PROGRESS_ENV] = str(w)
            if self.stack_root is not None:
                where = os.path.join(self.stack_root, f"w{local_rank}")
                os.mkdir(where, 0o700)
                env.update(PODRUN_STACK_DIR=where, PODRUN_STACK_SIGNAL=str(STACK_SIGNAL),
                           PYTHONPATH=os.pathsep.join(x for x in (SITE_DIR, env.get("PYTHONPATH")) if x))
            streams, ends = _output_sockets()
            # the largest write one message takes (the kernel refuses more with EMSGSIZE): Python workers write
            # more in pieces (podrun's sitecustomize)
            env["PODRUN_OUTPUT_CHUNK"] = str(ends[0].getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) // 2)
            stdin = self.worker_stdin if self.local_ranks[local_rank] == 0 else None
            p = self._spawn_warm(local_rank, env, w, ends, stdin) if self.warm is not None else None
            try:
                if p is None:
                    p = subprocess.Popen(self.command, env=env, stdin=subprocess.DEVNULL if stdin is None else stdin,
                                         stdout=ends[0].fileno(), stderr=ends[1].fileno(),
                                         start_new_session=True, preexec_fn=die_with_parent(), pass_fds=(*keep_fds, w))
            except OSError as exc:
                os.close(r)
                os.close(w)
                for s in (*ends, *(s for _, s in streams)):
                    s.close()
                self.emit(local_rank, "err", f"podrun agent: cannot start {self.command[0]!r}: {exc.strerror}")
                self.procs.append(None)
                self.readers.append([])
                self.emit(local_rank, "exit", f"{127 if isinstance(exc, FileNotFoundError) else 126} {time.time():.3f}")
                self.request_stop(StopKind.SPAWN_FAILED, f"local rank {local_rank} could not start")
                continue
            os.close(w)
            for s in ends:                  # the worker holds the write ends now: their end is its output's
                s.close()
            self.procs.append(p)
            threads = [threading.Thread(target=self._pump, args=(local_rank, streams), daemon=True)]
            threading.Thread(target=self._pump_progress, args=(local_rank, r), daemon=True).start()
            for t in threads:
                t.start()
            self.readers.append(threads)
            self.emit(local_rank, "start", str(p.pid))
        if self.worker_stdin is not None:     # the worker holds it: its end of input is the terminal's
            os.close(self.worker_stdin)
            self.worker_stdin = None
        if self.warm is not None:
            self._keep_zygote()

    def _spawn_warm(self, local_rank: int, env: dict[str, str], progress_fd: int, ends, stdin: int | None = None):
        """The worker forked by this host's zygote, or None (no zygote: the caller starts it as usual); it
        writes its stdout and stderr to ``ends``, the write ends of the agent's output sockets, and reads
        ``stdin`` (a descriptor; else the zygote's choice)."""
        from podrun.host import zygote

        run_dir, host, _ = self.warm
        p = zygote.spawn(run_dir, host, self.command, {k: v for k, v in env.items() if k != PROGRESS_ENV},
                         os.getcwd(), {1: ends[0].fileno(), 2: ends[1].fileno(), PROGRESS_ENV: progress_fd,
                                       **({} if stdin is None else {0: stdin})})
        if p is not None:
            self.emit(local_rank, "note", f"warm start: local rank {self.local_ranks[local_rank]} forked by the "
                                          f"zygote (pid {p.zygote_pid}) as pid {p.pid}")
        return p

    def _keep_zygote(self) -> None:
        """Hold a lease on this host's zygote for the agent's life; start the zygote first when it is not
        there and another attempt may follow (outside this subreaper's tree: it outlives the agent)."""
        from podrun.host import zygote

        run_dir, host, start = self.warm
        self.lease = zygote.hold(run_dir, host, 0.0)
        if self.lease is not None or not start or zygote.warm_target(self.command) is None:
            return
        if self.subreaper:
            _prctl(PR_SET_CHILD_SUBREAPER, 0)
        try:
            zygote.start(run_dir, host)
        finally:
            if self.subreaper:
                _prctl(PR_SET_CHILD_SUBREAPER, 1)

        def lease():       # however long its imports take under load (a daemon thread: it ends with the agent)
            self.lease = zygote.hold(run_dir, host, float("inf"))
        threading.Thread(target=lease, daemon=True).start()

    def _report_error_file(self, pos: int) -> None:
        """A failed worker's @record error file, if it wrote one, as an ``error`` line (JSON)."""
        info = read_error_file(self.envs[pos].get("TORCHELASTIC_ERROR_FILE") or "")
        if info is not None:
            self.emit(pos, "error", json.dumps(info, separators=(",", ":")))

    def _held_until_go(self) -> bool:
        """Report the preflight facts and wait for ``G`` on stdin; False when told to stop (``T``, stdin
        closed: another host failed its preflight), when signalled, or with no go within FIRST_HEARTBEAT_S."""
        self.emit(None, "probe", json.dumps(self.probe, separators=(",", ":")))
        deadline = time.monotonic() + FIRST_HEARTBEAT_S
        while not self.go.wait(0.005):
            if self.stop is not None or time.monotonic() > deadline:
                return False
        return True

    def _signal_all(self, sig: int) -> None:
        for p in self.procs:
            if p is not None:
                try:
                    os.killpg(p.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    def own(self) -> frozenset[int]:
        """The pids of the agent's own helpers among its children (the store host): no worker left them."""
        return frozenset(pid for pid in (h() for h in self.helpers) if pid is not None)

    def _reap_orphans(self) -> None:
        """Collect ended orphans that reparented to this subreaper (never a worker: Popen owns those)."""
        workers = {p.pid for p in self.procs if p is not None}
        for pid, state in _children(os.getpid()):
            if state == "Z" and pid not in workers:
                _reap(pid)

    def run(self) -> int:
        code: int | None = None
        try:
            code = self._run()
            return code
        finally:                                # also on an unexpected error: nothing outlives the agent
            self._signal_all(signal.SIGKILL)
            end_descendants(spare=self.own())
            if self.stack_root is not None:
                shutil.rmtree(self.stack_root, ignore_errors=True)
            if self.procs:                      # workers ran: their snapshots go when no restart can use them
                from podrun.runtime.snapshot import drop_when_done

                drop_when_done(self.envs, code, self.run_over())

    def _run(self) -> int:
        self.subreaper = _prctl(PR_SET_CHILD_SUBREAPER, 1)
        for s in HANDLED:
            signal.signal(s, self._on_signal)
        self.emit(None, "ready", f"{socket.gethostname()} {os.getpid()} {len(self.envs)}")
        threading.Thread(target=self._heartbeat, daemon=True).start()
        if self.stdin_watch:
            threading.Thread(target=self._watch_stdin, daemon=True).start()
        threading.Thread(target=self._dump_loop, daemon=True).start()
        if self.probe is not None and not self._held_until_go():
            self.emit(None, "done", "0")
            return 0
        self.spawn()
        first_failure: int | None = None
        reaped = [p is None for p in self.procs]
        kill_at: float | None = None
        term_at: float | None = None
        next_reap = time.monotonic() + 1.0
        while not all(reaped):
            exited = []                        # every worker ended now, stamped when reaped (one pass, before
            for lr, p in enumerate(self.procs):  # any wait for a worker's last lines delays the others' stamps)
                if not reaped[lr] and p is not None and p.poll() is not None:
                    reaped[lr] = True
                    exited.append((lr, p.returncode, time.time()))
            for lr, rc, ended in exited:
                for t in self.readers[lr]:
                    t.join(timeout=1.0)
                tag = " teardown" if self.teardown_started else ""
                if rc != 0:
                    self._report_error_file(lr)
                self.emit(lr, "exit", f"{rc} {ended:.3f}{tag}")
                if rc != 0 and first_failure is None and not self.teardown_started:
                    first_failure = rc
                    self.worker_failed = True       # its teardown may precede a restart: snapshots stay
                    self.request_stop(StopKind.WORKER_FAILED,
                                      f"local rank {lr} exited with {protocol.exit_code_from_returncode(rc)}")
            limit = self.stdin_timeout if self.got_stdin else max(self.stdin_timeout, FIRST_HEARTBEAT_S)
            if self.stdin_watch and self.stdin_timeout > 0 and time.monotonic() - self.last_stdin > limit:
                self.request_stop(StopKind.CONTROLLER_LOST,
                                  f"lost the controller (no heartbeat on stdin for {limit:g} s)")
            if self.stop is not None and not self.teardown_started:
                self.teardown_started = True
                if not all(reaped):
                    self.emit(None, "note", f"ending workers: {self.stop.message}")
                self._signal_all(self.stop_signal)
                if self.stop_signal != signal.SIGTERM:   # SIGINT or SIGHUP first: SIGTERM for what ignores it
                    term_at = time.monotonic() + self.grace
                    kill_at = term_at + protocol.TERM_TO_KILL_S
                else:
                    kill_at = time.monotonic() + self.grace
            if term_at is not None and time.monotonic() >= term_at:
                term_at = None
                self._signal_all(signal.SIGTERM)
            if kill_at is not None and time.monotonic() >= kill_at:
                self._signal_all(signal.SIGKILL)
                kill_at = time.monotonic() + 1.0
            if self.subreaper and time.monotonic() >= next_reap:
                next_reap = time.monotonic() + 1.0
                self._reap_orphans()
            time.sleep(0.02)
        self._signal_all(signal.SIGKILL)   # leftovers in the workers' process groups
        left = end_descendants(spare=self.own())   # then whatever escaped them (setsid daemons, orphans)
        if left:
            self.emit(None, "note", f"ended {len(left)} leftover process(es) the workers left behind: "
                                    + ", ".join(left))
        deadline = time.monotonic() + 5.0  # every writer is gone: the pipes end, the last lines get out
        for t in (t for ts in self.readers for t in ts):
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        if first_failure is not None:
            code = protocol.exit_code_from_returncode(first_failure)
        elif self.signalled is not None:
            code = 128 + self.signalled
        elif any(p is None for p in self.procs):
            code = 127
        elif any(p is not None and p.returncode != 0 for p in self.procs):
            code = 128 + int(self.stop_signal)   # workers ended by the teardown the controller asked for
        else:
            code = 0
        self.emit(None, "done", str(code))
        return code


_STAMP_ROOM = socket.CMSG_SPACE(16)      # one struct timespec
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)   # Linux's value; Python does not name it
# SO_SNDBUF asked for each of a worker's output streams: Linux's default net.core.wmem_max, which the kernel
# doubles; one write is one message of at most about that (~416 KiB), and at most that much waits unread, so a
# worker is held back by a slow reader as by a pipe, and what it wrote before it exited is relayed in moments
_WRITE_BUF = 212992


def _output_sockets() -> tuple[list[tuple[str, socket.socket]], tuple[socket.socket, socket.socket]]:
    """A worker's stdout and stderr: per stream a SOCK_SEQPACKET pair whose read end stamps each message
    (SO_TIMESTAMPNS), so that one reader can put both streams back in the order they were written.
    Returns ([("out", read end), ("err", read end)], (stdout's write end, stderr's write end))."""
    reads, writes = [], []
    for kind in ("out", "err"):
        r, w = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        r.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        w.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _WRITE_BUF)   # the largest single write it takes
        r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _WRITE_BUF)
        r.shutdown(socket.SHUT_WR)
        w.shutdown(socket.SHUT_RD)
        reads.append((kind, r))
        writes.append(w)
    return reads, (writes[0], writes[1])


def _stamp(anc) -> int:
    """The kernel's send time (ns) of a message, from its SCM_TIMESTAMPNS; now when it has none."""
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(data) >= 16:
            sec, nsec = struct.unpack("@ll", data[:16])
            return sec * 1_000_000_000 + nsec
    return time.time_ns()


def _launcher_fds(environ) -> tuple[int, ...]:
    """File descriptors the worker needs to join its launcher's world: MPICH's hydra hands each rank its
    PMI connection as PMI_FD (Open MPI's PMIx needs only variables)."""
    fd = environ.get("PMI_FD", "")
    if not fd.isdigit():
        return ()
    try:
        os.fstat(int(fd))
    except OSError:
        return ()
    return (int(fd),)


def _fresh_error_file(path: str | None) -> None:
    """Make the error file's directory and remove a file a previous attempt left there."""
    if not path:
        return
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)   # private, as the run dir (rundir.DIR_MODE)
        os.unlink(path)
    except OSError:
        pass


def instance_index_from_env(environ=os.environ, flag: str = "--index-from-env") -> int:
    """The launcher's rank of this process (Open MPI, PMIx, PMI, Slurm)."""
    for name in INDEX_ENV:
        if environ.get(name, "").isdigit():
            return int(environ[name])
    raise SystemExit(f"podrun agent: {flag} but none of {', '.join(INDEX_ENV)} is set")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m podrun.host.agent", description=__doc__.splitlines()[0])
    ap.add_argument("--plan", required=True)
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--master-addr", required=True)
    ap.add_argument("--master-port", type=int, required=True)
    ap.add_argument("--grace", type=float, default=5.0)
    ap.add_argument("--restart-count", type=int, default=0)
    ap.add_argument("--max-restarts", type=int, default=0)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--instance", type=int)
    g.add_argument("--index-from-env", action="store_true", help="the launcher's rank is the instance index")
    g.add_argument("--rank-from-env", action="store_true",
                   help="the launcher's rank is a worker's global rank: run that one worker (mpirun: each "
                        "worker is an MPI rank of one world)")
    ap.add_argument("--heartbeat", type=float, default=HEARTBEAT_S,
                    help="seconds between heartbeats to the controller")
    ap.add_argument("--stdin-timeout", type=float, default=HEARTBEAT_S * HEARTBEAT_MISSES,
                    help="seconds of silence on stdin (no controller heartbeat) after which the workers are ended")
    ap.add_argument("--no-stdin-watch", action="store_true")
    ap.add_argument("--agent-store", action="store_true",
                    help="if this instance runs global rank 0: hold --master-port from the start and serve the "
                         "run's TCPStore on it (podrun.host.store)")
    ap.add_argument("--listen-fd", type=int,
                    help="with --agent-store: the listening socket on --master-port, inherited from the controller")
    ap.add_argument("--hold", action="store_true",
                    help="report preflight facts (a probe line) and start workers only on a G on stdin")
    ap.add_argument("--needs", default="", metavar="MOD,...",
                    help="with --hold: report which of these modules this python cannot import")
    ap.add_argument("--warm", action="store_true",
                    help="fork workers from this host's zygote when it runs (podrun.host.zygote); start it when "
                         "it does not and --restart-count is below --max-restarts")
    ap.add_argument("--env-stdin", action="store_true",
                    help="read the run's --env first from stdin (podrun.wire.envchannel) and set it for the workers")
    ap.add_argument("--worker-stdin-fd", type=int, metavar="FD",
                    help="an inherited descriptor that local rank 0 reads as its stdin (the local transport's copy "
                         "of podrun's stdin); every other worker reads /dev/null")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    os.umask(0o077)                    # the workers' files are private, as the run directory's
    if args.env_stdin:
        from podrun.wire.envchannel import EnvMessageError, read as read_env

        try:
            os.environ.update(read_env(0, FIRST_HEARTBEAT_S))
        except (EnvMessageError, OSError) as exc:
            raise SystemExit(f"podrun agent: --env-stdin: {exc}") from None
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command given after --")
    from podrun.plan.worker_env import worker_of_rank
    from podrun.plan.model import Plan

    with open(args.plan) as f:
        plan = Plan.from_dict(json.load(f))
    local_ranks = agent_rank = None
    if args.rank_from_env:
        rank = instance_index_from_env(flag="--rank-from-env")
        try:
            index, agent_rank = worker_of_rank(plan, rank)
        except ValueError as exc:
            raise SystemExit(f"podrun agent: --rank-from-env: {exc}") from None
        local_ranks = [agent_rank]
    else:
        index = instance_index_from_env() if args.index_from_env else args.instance
    envs = worker_envs(plan, index, run_id=args.run_id, run_dir=args.run_dir, plan_path=args.plan,
                       master_addr=args.master_addr, master_port=args.master_port,
                       restart_count=args.restart_count, max_restarts=args.max_restarts,
                       agent_store=args.agent_store)
    if local_ranks is not None:
        envs = [envs[lr] for lr in local_ranks]
    rank0 = any(e["RANK"] == "0" for e in envs)
    store = None
    if args.agent_store and rank0:
        from podrun.host.store import AgentStore

        store = AgentStore.open(args.master_port, args.listen_fd)    # reserve the port now, before any report
    probe = None
    if args.hold:
        from podrun.wire.probe import facts

        ports = [args.master_port] if rank0 else []
        # the agent store's port is busy when it could not be bound; else (no agent store) facts() tries it
        probe = facts(ports, None if store is None else ports if store.error is not None else [],
                      needs=[m for m in args.needs.split(",") if m],
                      master_addr=args.master_addr, master_port=None if rank0 else args.master_port)
    agent = Agent(index, command, envs, grace=args.grace, stdin_watch=not args.no_stdin_watch,
                  stdin_timeout=args.stdin_timeout, heartbeat=args.heartbeat, probe=probe, local_ranks=local_ranks,
                  agent_rank=agent_rank, run_dir=args.run_dir, worker_stdin=args.worker_stdin_fd,
                  warm=(args.run_dir, socket.gethostname(), args.restart_count < args.max_restarts)
                  if args.warm else None)
    if store is not None and not (probe and probe["ports_busy"]):    # busy: the controller will not say go
        store.start(agent.envs, lambda text: agent.emit(None, "note", text),
                    warm=agent.warm[:2] if agent.warm is not None else None)
        agent.helpers.append(store.pid)
    try:
        return agent.run()
    finally:
        if store is not None:
            store.close()


if __name__ == "__main__":
    sys.exit(main())
