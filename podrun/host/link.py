"""The agent's link to its controller: protocol lines out, heartbeats both ways, the stdin tokens and request files."""
from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time

from podrun.host.stop import StopKind
from podrun.wire import protocol
from podrun.wire.liveness import FIRST_HEARTBEAT_S


class ControllerLink:
    """The Agent's part that talks with its controller. Besides its own state (made by ``link_init``) it reads the
    Agent's ``index``, ``local_ranks``, ``agent_rank``, ``run_dir``, ``probe`` and ``stop``, and asks the Agent to
    stop through its ``request_stop``."""

    def link_init(self, out, heartbeat: float, stdin_watch: bool, stdin_timeout: float) -> None:
        """``out``: where the lines go (None: stdout). ``inbox`` is the descriptor the controller's tokens come on:
        stdin, or a joined agent's connection (``join_controller``)."""
        self.stdin_watch = stdin_watch
        self.inbox = 0
        self.stdin_timeout = stdin_timeout
        self.heartbeat = heartbeat   # seconds between this agent's heartbeats to the controller
        self.out = out if out is not None else sys.stdout.buffer
        self.lock = threading.Lock()
        self.controller_lost = False
        self.link_closed = False     # ``link_close``: the agent is ending, nothing more is written
        self.last_stdin = time.monotonic()
        self.got_stdin = False       # before the first heartbeat: the controller may still be starting others
        self.go = threading.Event()
        self.dumps = threading.Semaphore(0)  # one release per ``S`` on stdin
        from podrun.wire.plan_token import PlanFrames

        self.plan_frames = PlanFrames()      # the controller's new plans (in-place recovery), to ``tell_plan``

    def emit(self, local_rank: int | None, kind: str, text: str = "") -> None:
        """One protocol line; ``local_rank`` is the worker's position in ``envs`` (None: the agent's own)."""
        local_rank = self.agent_rank if local_rank is None else self.local_ranks[local_rank]
        line = (protocol.encode(self.index, local_rank, kind, text) + "\n").encode("utf-8", "replace")
        with self.lock:
            if self.controller_lost or self.link_closed:
                return
            try:
                view = memoryview(line)
                while view:      # a raw stdout (PYTHONUNBUFFERED) takes part of a line whose wait a signal cut short
                    view = view[self.out.write(view):]
                self.out.flush()
                if kind == protocol.Done.KIND:      # the agent's last line: no heartbeat follows it
                    self.link_closed = True
            except (BrokenPipeError, OSError, ValueError):
                self.controller_lost = True
                self.request_stop(StopKind.CONTROLLER_LOST, "lost the controller (stdout closed)")

    def send(self, local_rank: int | None, message: protocol.Message) -> None:
        """One protocol line of a structured message (podrun.wire.protocol)."""
        self.emit(local_rank, message.KIND, message.encode())

    def link_close(self, timeout: float) -> bool:
        """The agent's last act: wait up to ``timeout`` s for a line being written (a heartbeat or output thread may
        be blocked on a full pipe to a slow controller), then write no more: the line reaches the controller whole
        instead of being cut off by the exit. False when that line is still blocked: the agent must then leave
        without the interpreter's exit, which can find that daemon thread holding stdout's lock and abort ("Fatal
        Python error: _enter_buffered_busy", its message mixed into the run's output)."""
        delivered = self.lock.acquire(timeout=timeout)
        self.link_closed = True
        if delivered:
            try:
                with contextlib.suppress(OSError, ValueError):
                    self.out.flush()
            finally:
                self.lock.release()
        return delivered

    def join_controller(self, address: str | None, fd: int | None, run_id: str, key: str | None,
                        bound_s: float) -> None:
        """--join: connect to the controller at ``address`` (podrun.wire.join), or --join-fd: the connection a copy
        of `podrun launch` made (podrun.launch.copies), and speak over it from now on; SystemExit 2 with one line
        naming the address when there is no key, or no join within ``bound_s``."""
        import socket

        from podrun.wire import join

        if fd is not None:
            conn = socket.socket(fileno=fd)
        else:
            problem = join.key_problem(key)
            if problem is not None:
                sys.exit(f"podrun agent: cannot join the controller at {address}: {problem} (the launcher passes "
                         f"the run's key in the environment)")
            try:
                conn, _ = join.join(address, key, run_id, self.index, bound_s)
            except (join.JoinError, ValueError) as exc:
                sys.exit(f"podrun agent: {exc}")
        self.conn = conn                          # held for the agent's life
        self.out = conn.makefile("wb")
        self.inbox = conn.fileno()

    def _heartbeat(self) -> None:
        watch_file = not self.stdin_watch and self.run_dir is not None
        token = protocol.read_request(self.run_dir) if watch_file else ""
        stop_token = protocol.read_stop(self.run_dir)[0] if watch_file else ""
        while True:
            self.send(None, protocol.Heartbeat(time.time()))
            if watch_file:
                now = protocol.read_request(self.run_dir)
                if now != token:
                    token = now
                    self.dumps.release()
                now, sig = protocol.read_stop(self.run_dir)
                if now != stop_token and sig is not None:
                    stop_token = now
                    self.request_stop(StopKind.CONTROLLER_ASKED, f"the controller relayed {signal.Signals(sig).name}",
                                      sig)
            time.sleep(self.heartbeat)

    def _watch_stdin(self) -> None:
        while True:
            try:
                data = os.read(self.inbox, 256)
            except OSError:
                data = b""
            if not data:
                self._controller_lost("lost the controller (stdin closed)" if self.inbox == 0
                                      else "lost the controller (its connection closed)")
                return
            self.last_stdin = time.monotonic()
            self.got_stdin = True
            if protocol.Token.GO.value in data:
                self.go.set()
            stops = [(data.index(tok), tok) for tok in protocol.STOP_TOKENS if tok in data]
            if stops:                                        # the first in the stream wins
                name = protocol.STOP_TOKENS[min(stops)[1]]
                self.request_stop(StopKind.CONTROLLER_ASKED, "the controller asked to stop" if name == "SIGTERM"
                                  else f"the controller relayed {name}", getattr(signal, name))
            for _ in range(data.count(protocol.Token.STACKS.value)):
                self.dumps.release()
            for token in self.plan_frames.feed(data):
                self.tell_plan(token)

    def _check_stdin_silence(self) -> None:
        """Stop when the controller's heartbeats on stdin stopped coming (a longer bound before the first): none
        read for the bound, and none waiting to be read (a loaded host's reader thread may not have run)."""
        limit = self.stdin_timeout if self.got_stdin else max(self.stdin_timeout, FIRST_HEARTBEAT_S)
        if self.stdin_watch and self.stdin_timeout > 0 and time.monotonic() - self.last_stdin > limit:
            if select.select([self.inbox], [], [], 0)[0]:
                return       # bytes (or the end) wait in the inbox: its reader has not run, the controller spoke
            where = "stdin" if self.inbox == 0 else "its connection"
            self._controller_lost(f"lost the controller (no heartbeat on {where} for {limit:g} s)", limit)

    def _controller_lost(self, message: str, silent_s: float = 0.0) -> None:
        """Stop for want of the controller; a joined agent also says so on its own stderr, where its launcher (srun,
        the node's log) shows it, since the controller hears nothing more from it."""
        if self.inbox != 0 and self.stop is None:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(f"podrun agent: instance {self.index}: {message}: ending its workers\n")
                sys.stderr.flush()
        self.request_stop(StopKind.CONTROLLER_LOST, message, silent_s=silent_s)

    def _held_until_go(self) -> bool:
        """Report the preflight facts and wait for ``G`` on stdin; False when told to stop (``T``, stdin
        closed: another host failed its preflight), when signalled, or with no go within FIRST_HEARTBEAT_S."""
        self.send(None, self.probe)
        deadline = time.monotonic() + FIRST_HEARTBEAT_S
        while not self.go.wait(0.005):
            if self.stop is not None or time.monotonic() > deadline:
                return False
        return True
