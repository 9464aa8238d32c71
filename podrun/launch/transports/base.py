"""The transport interface: start one instance agent per host (or one merged stream), made by name.

A transport turns a LaunchRequest (podrun.launch.request) into running instance agents and gives the
supervisor one InstanceHandle per stream of agent output. The supervisor (podrun.launch.supervisor)
parses the agent line protocol (podrun.wire.protocol) from every handle, whatever the transport:

- ``local`` / ``ssh``: one handle per instance, each carrying exactly one agent, spoken to over its stdin.
- ``srun``, ``mpirun`` and the copies' ``join`` (``joined``): the agents join the controller over TCP
  (podrun.launch.transports.join): one handle per instance, its connection; a launcher's own process is a handle
  that carries no instance.
- ``poprun`` and ``mpirun --mpi-ranks`` (``merged``): one handle whose output carries every instance; the
  agents learn their index (or rank) from the launcher's environment and watch the run directory, not a stdin
  (podrun.launch.transports.launcher).

Which a transport does for a request is its registry entry's (``TransportKind.for_request``), never its own code's.

The interface every transport implements:

    make = get_transport("ssh"); t = make(request)   # a class, or a factory that picks one (ssh: the client)
    problems = t.preflight()          # list[Problem]; nothing is started when any
    handles = t.start()               # list[InstanceHandle]; agents held by the preflight wait for:
    t.release(handles)                # once the controller reads every handle and beats: they start their workers
    for stream, line in handle.lines(): ...   # ("out"|"err", text without newline) until EOF
    handle.push(callback)             # or: each line to callback(stream, line) from one thread for all handles
    handle.heartbeat(); handle.request_stacks(); handle.poll(); handle.wait(t); handle.terminate(sig); handle.kill(); handle.close()
    t.describe(redact=False)      # [(host, exact command line)] for --dry-run / runs/<id>/command
    t.close()
"""
from __future__ import annotations

import contextlib
import functools
import queue
import signal
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO, Callable, Iterator

from podrun.launch.transports import TransportKind, transport_of
from podrun.proctl import signal_led_group
from podrun.wire.protocol import READ_LIMIT, Token, bounded_lines, stop_token

if TYPE_CHECKING:  # pragma: no cover
    from podrun.launch.request import LaunchRequest

@dataclass(frozen=True)
class Problem:
    """One preflight failure: the host it concerns, what is wrong, and what to do about it."""

    host: str
    message: str
    hint: str = ""

    def __str__(self) -> str:
        return f"{self.host}: {self.message}" + (f" ({self.hint})" if self.hint else "")


def busy_port_problem(host: str, req: "LaunchRequest", port: int) -> Problem:
    """A preflight problem for the run's rendezvous port, taken on the master host."""
    return Problem(host, f"rendezvous port {port} is in use on the master host",
                   "pass --master-port with a free port"
                   + ("" if req.kind.remote else " (0: podrun picks one)"))


class InstanceHandle(ABC):
    """One stream of agent output (one agent, or every agent for merged transports) and its control."""

    #: a label for messages: the host name, or e.g. "mpirun"
    label: str = "?"
    #: the instance indices whose protocol lines this handle carries
    instances: tuple[int, ...] = ()
    #: why it ended before its agent reported, when the handle knows (an agent that never joined)
    lost_why: str | None = None

    @abstractmethod
    def lines(self) -> Iterator[tuple[str, str]]:
        """Yield (stream, line) with stream "out" or "err", newline stripped, until both streams end."""

    def push(self, callback: Callable[[str | None, str | None], None]) -> bool:
        """Instead of ``lines()``: call ``callback(stream, line)`` for each line from the process's line hub
        (podrun.launch.transports.linehub), and ``callback(None, None)`` at the end; False where the handle
        cannot (its output is no pipe the hub reads): iterate ``lines()`` in a thread then."""
        return False

    @abstractmethod
    def poll(self) -> int | None:
        """The exit status of the agent (or mpirun/srun) process once it has ended, else None."""

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            rc = self.poll()
            if rc is not None or (deadline is not None and time.monotonic() >= deadline):
                return rc
            time.sleep(0.02)

    def _write(self, data: bytes) -> None:
        """Bytes to the agent's stdin (podrun.wire.protocol); nothing where there is none (a merged launcher's)."""

    def heartbeat(self) -> None:
        """Tell the agent its controller is alive (a byte on its stdin); no-op where there is no stdin."""
        self._write(Token.HEARTBEAT.value)

    def request_stacks(self) -> None:
        """Ask the agent for its workers' stacks (an ``S`` on its stdin; they come back as ``stack`` lines);
        no-op where there is no stdin (a merged launcher's)."""
        self._write(Token.STACKS.value)

    def send_plan(self, frame: bytes) -> None:
        """A new plan for the agent's workers (podrun.wire.plan_token: in-place recovery) on its stdin; no-op where
        there is no stdin (mpirun, srun)."""
        self._write(frame)

    def terminate(self, sig: int = signal.SIGTERM) -> None:
        """Ask the agent(s) to end their workers with ``sig`` first (SIGTERM, or the SIGINT/SIGHUP podrun
        received, which the agents follow with SIGTERM after the request's grace), then SIGKILL."""
        self._write(stop_token(sig))

    @abstractmethod
    def kill(self) -> None:
        """End the agent process (or the connection to it) now; the agent's own watchdog does the rest."""

    def close(self) -> None:
        """Release pipes / channels. Safe to call more than once."""

    def busy_here(self) -> bool:
        """Whether the agent is a process of this machine with a thread the kernel shows running or waiting to run:
        its silence is this machine's load, not a lost host (False where the agent is elsewhere)."""
        return False


class PipedAgentHandle(InstanceHandle):
    """One process on this machine that is one agent (local) or carries one (the ssh client), spoken to through its
    stdin: a heartbeat, a stack request and a stop are bytes there (podrun.wire.protocol)."""

    def __init__(self, index: int, host: str, proc):
        self.label = host
        self.instances = (index,)
        self.proc = proc
        self._merger = StreamMerger(proc.stdout, proc.stderr)
        self._wlock = threading.Lock()

    def lines(self):
        return iter(self._merger)

    def push(self, callback) -> bool:
        return self._merger.push(callback)

    def poll(self):
        return self.proc.poll()

    def _write(self, data: bytes) -> None:
        with self._wlock:
            with contextlib.suppress(OSError, ValueError):    # BrokenPipeError is an OSError
                self.proc.stdin.write(data)
                self.proc.stdin.flush()

    def kill(self) -> None:
        """SIGKILL the process's session: the local agent (its workers die by PDEATHSIG; what they left behind
        reparents to init once the agent is gone, so kill is the last resort after terminate and the grace
        period), or the ssh client (the connection closes, the agent sees EOF, or silence, and ends its workers)."""
        signal_led_group(self.proc, signal.SIGKILL)

    def close(self) -> None:
        """Close the process's stdin (its output pipes belong to the stream readers until they end)."""
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()


class Transport(ABC):
    """Starts the request's instance agents on their hosts."""

    name: str = "?"

    def __init__(self, request: "LaunchRequest"):
        self.request = request
        # its capabilities for this request (podrun.launch.transports)
        self.kind: TransportKind = transport_of(self.name).for_request(request.mpi_ranks)

    @property
    def merged(self) -> bool:
        """True when start() returns one handle carrying every instance (poprun, mpirun --mpi-ranks)."""
        return self.kind.merged

    def describe(self, redact: bool = False) -> list[tuple[str, str]]:
        """(host, exact command line) per started process, for --dry-run and runs/<id>/command.

        ``redact``: hide secret-looking words of the worker command (for files written to the run dir).
        No --env value is ever part of a command line (see ``env_route``).
        """
        return [(inst.host, self.request.shell_command(inst.index, redact=redact, hold=self.holds(),
                                                       env_stdin=self.kind.env_stdin))
                for inst in self.request.instances]

    def env_route(self) -> str:
        """How the agents get the run's --env, in words (for --dry-run and runs/<id>/command)."""
        if self.kind.env_stdin:
            return "the first message on each agent's stdin (--env-stdin), never on a command line"
        if self.merged or self.kind.joined:        # a launcher's
            return (f"{self.name}'s own environment, passed on to every agent; its command line carries the "
                    "names at most")
        return "the agent's environment, set by the controller that starts it; never on a command line"

    def holds(self) -> bool:
        """Whether this run's agents start held (--hold): they are the preflight probes (ssh)."""
        return self.kind.ssh_per_host and self.request.checks_hosts()

    def preflight(self) -> list[Problem]:
        """Check every host in parallel before anything starts; an empty list means go."""
        return []

    @abstractmethod
    def start(self) -> list[InstanceHandle]:
        """Start the agents; raise LaunchError (naming the host) if one cannot be started. Agents held by the
        preflight stay held until ``release``."""

    def release(self, handles: list[InstanceHandle]) -> None:
        """Let agents held by the preflight start their workers: called once the controller reads every handle
        and sends heartbeats. Nothing is held by default."""

    def joins(self) -> dict | None:
        """summary.json's ``joins`` for a transport whose agents join (podrun.launch.transports.join), else None."""
        return None

    def host_named(self, index: int, hostname: str) -> str | None:
        """The host name instance ``index``'s agent gave when it was ready, where the plan could not name its host
        (a copy of one podrun per node, known by its node rank only); None: the plan's name stands."""
        return None

    def close(self) -> None:
        """Release connections. Safe to call more than once."""


TransportFactory = Callable[["LaunchRequest"], "Transport"]   # a Transport class, or a function choosing one


def get_transport(name: str) -> TransportFactory:
    """What makes the transport registered under ``name`` from a request (podrun.launch.transports.TransportKind.load)."""
    return transport_of(name).load()


class StreamMerger:
    """Reads two binary streams and yields ("out"|"err", line) from both, in arrival order.

    Reusable by any handle over pipes or channel files (local, ssh, mpirun, srun). Pipes are read by the
    process's one line hub (podrun.launch.transports.linehub), other files (a paramiko channel's) by a thread
    each. Memory is bounded: lines are cut at protocol.READ_LIMIT bytes and about QUEUED lines wait to be
    consumed (then the pipes are left unread or the reader threads block, and so, through the pipe or the
    channel's window, does the agent). ``push`` hands every line from then on to a callback instead.
    """

    _END = object()
    QUEUED = 64

    def __init__(self, out: BinaryIO | None, err: BinaryIO | None):
        from podrun.launch.transports import linehub

        self._cond = threading.Condition()
        self._items: deque = deque()
        self._push: Callable[[str | None, str | None], None] | None = None
        self._sources: list = []     # the hub's, for pausing; empty when a thread reads
        self._files = (out, err)     # the hub reads their descriptors: they stay open while this merger lives
        streams = [(name, f) for name, f in (("out", out), ("err", err)) if f is not None]
        fds = [linehub.pipe_fd(f) for _, f in streams]
        self._open = len(streams)    # streams whose end was not taken yet
        if streams and None not in fds:
            hub = linehub.hub()
            self._sources = [hub.add(fd, lambda line, name=name: self._put((name, line)),
                                     functools.partial(self._put, self._END))
                             for (name, _), fd in zip(streams, fds)]
        else:
            for name, f in streams:
                threading.Thread(target=self._pump, args=(name, f), daemon=True).start()

    # -- producers: the hub's thread, or one thread per stream --------------------------------
    def _put(self, item) -> None:
        if self._push is not None:        # set and read on the hub's thread only (push needs the hub)
            self._deliver(item)
            return
        with self._cond:
            if not self._sources:                     # a reader thread: wait for room
                while len(self._items) >= self.QUEUED:
                    self._cond.wait()
            self._items.append(item)
            if self._sources and len(self._items) >= self.QUEUED:
                for src in self._sources:             # the hub: leave the pipes unread until next() takes some
                    src.pause()
            self._cond.notify_all()

    def _deliver(self, item) -> None:
        """Push mode (the hub's thread): one item to the callback; its streams' last end as (None, None)."""
        if item is self._END:
            self._open -= 1
            if self._open == 0:
                self._push(None, None)
        else:
            self._push(*item)

    def _pump(self, stream: str, f: BinaryIO) -> None:
        try:
            with contextlib.suppress(Exception):    # a broken channel (or a closed file) ends the stream, nothing more
                for raw in bounded_lines(f, READ_LIMIT):
                    self._put((stream, raw.decode("utf-8", "replace")))
        finally:
            self._put(self._END)

    # -- the consumer --------------------------------------------------------------------------
    def next(self, timeout: float | None = None) -> tuple[str, str] | None:
        """The next line, or None once both streams have ended; queue.Empty after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._open:
                if not self._items:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise queue.Empty
                    self._cond.wait(left)
                    continue
                item = self._items.popleft()
                if len(self._items) == self.QUEUED // 2:
                    for src in self._sources:
                        src.resume()
                self._cond.notify_all()
                if item is self._END:
                    self._open -= 1
                    continue
                return item
            return None

    def __iter__(self) -> Iterator[tuple[str, str]]:
        while (item := self.next()) is not None:
            yield item

    def close(self) -> None:
        """Close both streams (a handle's ``close``). The hub closes them once it reads them no more: a descriptor
        closed under its selector could come back as another pipe's number while still registered."""
        def close_files() -> None:
            for f in self._files:
                if f is not None:
                    with contextlib.suppress(OSError, ValueError):
                        f.close()

        if not self._sources:
            close_files()
            return
        for src in self._sources[:-1]:
            src.close()
        self._sources[-1].close(then=close_files)    # the hub closes them in this order: the last one's is last

    def push(self, callback: Callable[[str | None, str | None], None],
             first: list[tuple[str, str]] | tuple = ()) -> bool:
        """From now on call ``callback(stream, line)`` for each line, on the hub's thread, and
        ``callback(None, None)`` once both streams have ended: ``first``, then what waits queued, then the rest
        as it is read. Only where the hub reads the streams (False otherwise: iterate instead); the caller
        takes no line with ``next`` any more."""
        if not self._sources:
            return False
        hub = self._sources[0].hub

        def switch() -> None:
            with self._cond:
                waiting = list(self._items)
                self._items.clear()
                self._push = callback
            for item in first:
                callback(*item)
            for item in waiting:
                self._deliver(item)
            if self._open == 0 and not waiting:       # both had ended and been taken by next() already
                callback(None, None)
            for src in self._sources:
                src.resume()

        hub.call(switch)
        return True
