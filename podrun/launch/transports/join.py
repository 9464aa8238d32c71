"""The controller's join listener: agents started by a launcher (srun) connect, prove the run's key, and become handles.

``JoinServer`` listens on a TCP port (all interfaces; the address the agents are given is ``address``), and runs
every connection's hand-shake (podrun.wire.join) on one thread, a bounded number at a time: it refuses, in one line
each (escaped: the peer chose parts of it) and counted by reason, an agent that fails the key, names another run, an
instance this run does not have, or one that has joined already, and proves the key in turn to one that passes. An agent
it accepts becomes its instance's ``JoinedHandle``: the connection carries the agent's protocol lines (read by the
line hub, as a pipe is) and the controller's tokens (heartbeats, ``S``, the stops), so that supervision is what it is
for an agent the controller started. An instance that has not joined within the join window ends as a lost host,
named, and so do the instances still missing when the launcher that should start them has ended.
"""
from __future__ import annotations

import contextlib
import io
import os
import secrets
import signal
import socket
import sys
import threading
import time
from collections import Counter
from dataclasses import replace

from podrun.launch.transports.base import InstanceHandle, Problem, StreamMerger, Transport
from podrun.launch.transports.launcher import start_launcher
from podrun.redaction import escape_controls
from podrun.wire import join as wire_join, protocol

#: summary.json's ``joins.refused`` keys: why a connection was refused
REFUSALS = ("wrong-key", "other-run", "no-such-instance", "joined-already", "malformed")


class JoinedHandle(InstanceHandle):
    """One instance whose agent joins over TCP: no lines until it joins; then its connection's lines; its end is
    the connection's (an agent that ends writes ``done`` first: ``poll`` is its code, else None, a lost host)."""

    def __init__(self, index: int, host: str):
        self.label = host
        self.instances = (index,)
        self.sock: socket.socket | None = None
        self.joined_from: str | None = None        # the agent's own "host pid", once joined
        self.lost_why: str | None = None           # why it ended before it joined (the window, the launcher)
        self._lock = threading.Lock()
        self._merger: StreamMerger | None = None
        self._callback = None
        self._code: int | None = None
        self._ended = threading.Event()
        self._claimed = False                      # an agent passed the hand-shake for it: no other may

    # -- the join ---------------------------------------------------------------------------------
    def attach(self, sock: socket.socket, joined_from: str) -> None:
        """The agent joined on ``sock``: its lines are read from now on."""
        with self._lock:
            self.sock, self.joined_from = sock, joined_from
            self._merger = StreamMerger(io.FileIO(os.dup(sock.fileno()), "r"), None)
            if self._callback is not None:
                self._merger.push(self._callback)

    def claim(self) -> bool:
        """Take this instance for an agent that passed the hand-shake; False when one took it before, or it was
        given up (a second join for it is refused from now on)."""
        with self._lock:
            taken = self._claimed or self.lost_why is not None
            self._claimed = True
        return not taken

    def unreadable(self, why: str) -> None:
        """The agent that claimed it joined, but its connection cannot be read: lost, with ``why``."""
        with self._lock:
            self._claimed = False
        self.give_up(why)

    def give_up(self, why: str) -> bool:
        """End this instance's stream now, unjoined, with ``why`` as its one line; False when it had joined."""
        with self._lock:
            if self._claimed or self._ended.is_set():
                return False
            self.lost_why = why
            self._ended.set()
            callback = self._callback
        if callback is not None:
            callback("err", f"podrun: {why}")
            callback(None, None)
        return True

    # -- InstanceHandle --------------------------------------------------------------------------
    def _watch(self, callback):
        def take(stream, line):
            if line is not None and (done := protocol.read_done(line)) is not None:
                self._code = None if done[2] is None else done[2].code
            if stream is None:
                self._ended.set()
            callback(stream, line)
        return take

    def push(self, callback) -> bool:
        with self._lock:
            self._callback = self._watch(callback)
            if self._merger is not None:
                self._merger.push(self._callback)
                return True
            gone = self.lost_why
        if gone is not None:             # given up before the supervisor listened
            self._callback("err", f"podrun: {gone}")
            self._callback(None, None)
        return True

    def lines(self):                     # push always takes the lines: nothing comes this way
        return iter(())

    def poll(self) -> int | None:
        return self._code if self._ended.is_set() else None

    def wait(self, timeout: float | None = None) -> int | None:
        self._ended.wait(timeout)
        return self.poll()

    def _write(self, data: bytes) -> None:
        sock = self.sock
        if sock is not None:
            with contextlib.suppress(OSError):       # a full buffer (an agent that reads no more) drops the token
                sock.send(data, socket.MSG_DONTWAIT)

    def terminate(self, sig: int = signal.SIGTERM) -> None:
        super().terminate(sig)
        self.give_up("ended before its agent joined")

    def kill(self) -> None:
        """Close the connection: the agent sees its controller gone and ends its workers."""
        self.give_up("ended before its agent joined")
        sock = self.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.kill()
        if self._merger is not None:
            self._merger.close()
        if self.sock is not None:
            self.sock.close()


class _Pending:
    """A hand-shake in flight: the connection, where from, the nonce it was sent, what came of its line so far, when
    it is given up, and the listener's CPU spent on it."""

    __slots__ = ("conn", "peer", "nonce", "got", "deadline", "cpu")

    def __init__(self, conn: socket.socket, peer: str, nonce: str, deadline: float):
        self.conn, self.peer, self.nonce, self.deadline = conn, peer, nonce, deadline
        self.got, self.cpu = b"", 0.0


class JoinServer:
    """The listening socket and the one thread that serves it (accepts, and every hand-shake in flight, through a
    selector: no thread per connection, no polling); ``handles`` has one JoinedHandle per expected instance.

    It cannot be starved: at most PENDING hand-shakes are in flight, each given up LISTEN_HANDSHAKE_S after its
    connection came (a newer connection closes the oldest one when all are taken: an agent answers its challenge at
    once, and one closed before its verdict tries again), and an accept that fails for want of descriptors or
    buffers (EMFILE, ENFILE, ENOBUFS, ENOMEM) frees the oldest and pauses accepting for ACCEPT_PAUSE_S, then goes
    on."""

    PENDING = 128
    LISTEN_HANDSHAKE_S = 5.0
    ACCEPT_PAUSE_S = 0.05
    SHOWN_REFUSALS = 20             # refusal lines on the console and in summary.json; the rest are counted

    def __init__(self, run_id: str, key: str, instances: dict[int, str], *, advertise: str, port: int = 0,
                 window: float = 60.0, args_for=None):
        """``args_for(instance)``: the JoinArgs a copy of `podrun launch` that joins as ``instance`` becomes
        (podrun.launch.copies); None: this run takes no copies, only agents started with their arguments."""
        self.run_id, self.key, self.window, self.args_for = run_id, key, window, args_for
        self.handles = {i: JoinedHandle(i, host) for i, host in instances.items()}
        self.refused: Counter = Counter()
        self.refusal_lines: list[str] = []          # the first SHOWN_REFUSALS, one line each (escaped)
        self.joined = 0
        self.serial_cpu_s = 0.0                      # the hand-shakes' CPU, of those that succeeded
        self.accept_pauses = 0                       # accepts that failed for want of descriptors or buffers
        self._count = threading.Lock()
        self._closed = threading.Event()
        self.sock = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=1024) \
            if socket.has_dualstack_ipv6() else socket.create_server(("", port), backlog=1024)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.address = wire_join.format_address(advertise, self.port)
        self.started = time.monotonic()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._serving = threading.Thread(target=self._serve, daemon=True)
        self._serving.start()
        threading.Thread(target=self._window, daemon=True).start()

    # -- the one thread: accepts and hand-shakes --------------------------------------------------------------
    def _serve(self) -> None:
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ, None)
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        pending: dict[int, _Pending] = {}            # by descriptor, the oldest first
        paused_until: float | None = None
        try:
            while not self._closed.is_set():
                now = time.monotonic()
                due = [t for t in (paused_until, next(iter(pending.values())).deadline if pending else None)
                       if t is not None]
                for key, _ in sel.select(max(0.0, min(due) - now) if due else None):
                    if key.data == "wake":
                        return
                    if key.data is None:
                        if not self._accept_some(sel, pending):
                            self.accept_pauses += 1
                            sel.unregister(self.sock)
                            paused_until = time.monotonic() + self.ACCEPT_PAUSE_S
                            self._drop_oldest(sel, pending)
                    elif key.fd in pending:
                        try:
                            self._read(sel, pending, key.fd)
                        except OSError:           # out of descriptors for its line hub (os.dup): lost, as any
                            pending.pop(key.fd, None)
                            with contextlib.suppress(KeyError, ValueError):
                                sel.unregister(key.fileobj)
                            key.fileobj.close()
                now = time.monotonic()
                while pending and next(iter(pending.values())).deadline <= now:
                    p = self._forget(sel, pending, next(iter(pending)))
                    self._refuse(p.conn, p.peer, "malformed", "no join line within the hand-shake's "
                                 f"{self.LISTEN_HANDSHAKE_S:g} s")
                if paused_until is not None and paused_until <= now:
                    paused_until = None
                    sel.register(self.sock, selectors.EVENT_READ, None)
        finally:
            for p in pending.values():
                p.conn.close()
            sel.close()
            with contextlib.suppress(OSError):
                self.sock.close()
            os.close(self._wake_r)

    def _accept_some(self, sel, pending: dict) -> bool:
        """Accept what waits (a bounded number at a time); False when the system is out of descriptors or buffers."""
        import errno
        import selectors

        for _ in range(64):
            cpu0 = time.thread_time()
            try:
                conn, peer = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return True
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    return False
                continue                         # ECONNABORTED, EPROTO, a peer's reset: the next one
            if len(pending) >= self.PENDING:
                self._drop_oldest(sel, pending)
            nonce = secrets.token_hex(16)
            try:
                conn.setblocking(False)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.send(protocol.join_line(protocol.JoinChallenge(protocol.JOIN_VERSION, nonce)))
            except OSError:
                conn.close()
                continue
            p = _Pending(conn, peer[0], nonce, time.monotonic() + self.LISTEN_HANDSHAKE_S)
            p.cpu = time.thread_time() - cpu0
            pending[conn.fileno()] = p
            sel.register(conn, selectors.EVENT_READ, "conn")
        return True

    def _forget(self, sel, pending: dict, fd: int) -> _Pending:
        p = pending.pop(fd)
        sel.unregister(p.conn)
        return p

    def _drop_oldest(self, sel, pending: dict) -> None:
        """Close the oldest hand-shake in flight (an agent's tries again), uncounted: a crowd of them is no one's."""
        if pending:
            self._forget(sel, pending, next(iter(pending))).conn.close()

    def _read(self, sel, pending: dict, fd: int) -> None:
        """What came on a hand-shake's connection: taken up to its line's end, nothing after it (the protocol's
        lines follow, read by the line hub); the whole line is judged at once."""
        p = pending[fd]
        cpu0 = time.thread_time()
        try:
            data = p.conn.recv(wire_join.LINE_LIMIT - len(p.got), socket.MSG_PEEK)
            end = data.find(b"\n")
            if data:
                p.got += p.conn.recv(end + 1 if end >= 0 else len(data))
        except BlockingIOError:
            return
        except OSError:
            data, end = b"", -1
        if end < 0 and data and len(p.got) < wire_join.LINE_LIMIT:
            p.cpu += time.thread_time() - cpu0
            return
        self._forget(sel, pending, fd)
        p.cpu += time.thread_time() - cpu0
        if end >= 0:
            self._judge(p, p.got)
        else:
            self._refuse(p.conn, p.peer, "malformed", "the connection closed before a join line" if not data
                         else f"a join line longer than {wire_join.LINE_LIMIT} bytes")

    def _refuse(self, conn: socket.socket, peer: str, reason: str, why: str) -> None:
        """Refuse a join: counted by ``reason``; ``why`` (escaped: another party chose parts of it) on the console and
        in summary.json, for the first SHOWN_REFUSALS; sent to the peer; the connection closed."""
        line = escape_controls(f"refused a join from {peer}: {why}")
        with self._count:
            self.refused[reason] += 1
            shown = len(self.refusal_lines) < self.SHOWN_REFUSALS
            if shown:
                self.refusal_lines.append(line)
            last = sum(self.refused.values()) == self.SHOWN_REFUSALS + 1
        with contextlib.suppress(OSError, ValueError):     # the console's, as the supervisor's notices
            if shown:
                sys.stderr.write(f"podrun: {line}\n")
            elif last:
                sys.stderr.write("podrun: more joins refused: counted by reason in summary.json (joins.refused)\n")
        with contextlib.suppress(OSError):
            conn.send(protocol.join_line(protocol.JoinReply(False, escape_controls(why))), socket.MSG_DONTWAIT)
        conn.close()

    def _judge(self, p: _Pending, line: bytes) -> None:
        """The verdict on a hand-shake's join line."""
        cpu0 = time.thread_time()
        conn, peer, nonce = p.conn, p.peer, p.nonce
        msg = protocol.read_join_line(line, protocol.Join)
        if msg is None:
            return self._refuse(conn, peer, "malformed", "a line that is no join message: "
                                + line[:160].decode("utf-8", "replace").rstrip("\r\n"))
        who = f"{msg.hostname} (pid {msg.pid}, {peer})"
        if not wire_join.proof_ok(self.key, nonce, msg):
            return self._refuse(conn, peer, "wrong-key", f"{who}: the proof does not match this run's key "
                                f"({wire_join.KEY_ENV})")
        if msg.run_id != self.run_id:
            return self._refuse(conn, peer, "other-run", f"{who} joins run {msg.run_id}, this is run {self.run_id}")
        handle = self.handles.get(msg.instance)
        if handle is None:
            return self._refuse(conn, peer, "no-such-instance", f"{who} joins as instance {msg.instance}; this run "
                                f"has instances 0-{len(self.handles) - 1}")
        if msg.copy and self.args_for is None:
            return self._refuse(conn, peer, "malformed", f"{who} is a copy of podrun launch, and this run starts "
                                "its agents itself")
        if not handle.claim():
            first = handle.joined_from or "none: its join window had ended"
            return self._refuse(conn, peer, "joined-already", f"{who} joins as instance {msg.instance}, which "
                                f"has joined already (from {first})")
        reply = protocol.join_line(protocol.JoinReply(True, proof=wire_join.controller_proof(
            self.key, nonce, msg.nonce, self.run_id, msg.instance)))
        if msg.copy:
            reply += protocol.join_line(wire_join.with_mac(self.key, nonce, msg.nonce, self.run_id, msg.instance,
                                                           self.args_for(msg.instance)))
        with contextlib.suppress(OSError):  # its stream ends at once: the instance is lost, as any
            conn.setblocking(True)
            conn.settimeout(self.LISTEN_HANDSHAKE_S)     # a few kB into a new connection's buffer
            conn.sendall(reply)
        conn.settimeout(None)
        try:
            handle.attach(conn, escape_controls(f"{msg.hostname} pid {msg.pid}"))
        except OSError as exc:                    # no descriptor for its line hub: lost, named
            conn.close()
            handle.unreadable(f"instance {msg.instance} (host {handle.label}) joined, but the controller could not "
                           f"read its connection: {exc.strerror or exc}")
            return
        with self._count:
            self.joined += 1
            self.serial_cpu_s += p.cpu + time.thread_time() - cpu0

    def _window(self) -> None:
        """After the join window, every instance not joined ends, named."""
        if self._closed.wait(self.window):
            return
        for h in self.handles.values():
            h.give_up(f"instance {h.instances[0]} (host {h.label}) did not join within the join window of "
                      f"{self.window:g} s (--join-window)")

    def launcher_ended(self, name: str, code: int | None) -> None:
        """The launcher that starts the agents has ended: the instances that have not joined never will."""
        for h in self.handles.values():
            h.give_up(f"instance {h.instances[0]} (host {h.label}) did not join: {name} ended "
                      f"(exit code {code}) before its agent joined")

    def record(self) -> dict:
        """summary.json's ``joins``: how many joined, the refusals by reason, the listener's CPU per join."""
        return {"address": self.address, "joined": self.joined, "expected": len(self.handles),
                "refused": {r: self.refused[r] for r in REFUSALS if self.refused[r] > 0},
                "refusals": list(self.refusal_lines[:20]),
                "cpu_ms_per_join": round(1000 * self.serial_cpu_s / self.joined, 3) if self.joined > 0 else None}

    def close(self) -> None:
        """Stop listening: the serving thread closes the socket and every hand-shake in flight."""
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        self._serving.join(5.0)
        with contextlib.suppress(OSError):
            os.close(self._wake_w)


class JoiningLauncher:
    """For a transport whose agents join (its ``request`` and ``name``; a launcher's, podrun.launch.transports.launcher.
    LauncherTransport): the join server, started once, and the launch of the launcher with the run's key in its
    environment (never on its command line). The key is PODRUN_JOIN_KEY when the controller's environment has one
    (a job script's, from a private file; taken out of it), else a fresh one for this attempt."""

    _server: JoinServer | None = None

    def join_address(self) -> str:
        """What the agents are given: the server's address once it listens, else what --dry-run shows."""
        if self._server is not None:
            return self._server.address
        host, port = self._join_host_port()
        return wire_join.format_address(host, port if port is not None else 0)

    def _join_host_port(self) -> tuple[str, int | None]:
        """--join-address, else this machine's address on the route to the first host that is not this one (its
        host name when there is none, or no route)."""
        given = self.request.join_address
        if given:
            return wire_join.parse_address(given)
        from podrun.wire.probe import route_source

        here = socket.gethostname()
        other = next((i.host for i in self.request.instances if i.host not in (here, "localhost")), None)
        source = route_source(other) if other is not None else None
        return (source if source is not None else here), None

    def join_server(self, first: int = 0, args_for=None) -> JoinServer:
        """The server for the instances from ``first`` on (``args_for``: see JoinServer), started once."""
        if self._server is None:
            host, port = self._join_host_port()
            given = wire_join.take_key()     # out of this process's environment: no local worker inherits it
            key = given if wire_join.key_problem(given) is None else wire_join.new_key()
            try:
                self._server = JoinServer(self.request.run_id, key,
                                          {i.index: i.host for i in self.request.instances if i.index >= first},
                                          advertise=host, port=port or 0, window=self.request.join_window,
                                          args_for=args_for)
            except OSError as exc:
                from podrun.errors import LaunchError

                raise LaunchError(f"cannot listen for the agents that join on port {port or 0}: "
                                  f"{exc.strerror or exc}", hint="pass --join-address HOST:PORT with a free port "
                                                                  "(every copy the same)") from None
        return self._server

    def launch_joined(self, argv_of, drop: tuple[str, ...] = (), **kw) -> list[InstanceHandle]:
        """Start the launcher (``argv_of(address)``) with the key in its environment; its handle (its own output,
        no instance) and one JoinedHandle per instance."""
        server = self.join_server()
        launcher = start_launcher(self.request, self.name, argv_of(server.address), drop,
                                  {wire_join.KEY_ENV: server.key}, instances=(), **kw)
        threading.Thread(target=lambda: server.launcher_ended(self.name, launcher.proc.wait()), daemon=True).start()
        return [launcher, *server.handles.values()]

    def joins(self) -> dict | None:
        """summary.json's ``joins`` (None before any listened)."""
        return None if self._server is None else self._server.record()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


class ListenTransport(JoiningLauncher, Transport):
    """One podrun per node (podrun.launch.copies), as copy 0: instance 0's agent runs here as the local transport's
    does; the other copies join at the copies' address as the agents of their instances, sent their arguments."""

    name = "join"

    def _here(self):
        """The request of instance 0 alone, on this machine."""
        return replace(self.request, transport="local", instances=self.request.instances[:1])

    def _args_for(self, index: int) -> protocol.JoinArgs:
        return protocol.JoinArgs(tuple(self.request.agent_argv(index, lean=True)), self.request.workdir)

    def env_route(self) -> str:
        return "each copy's own environment (every copy has the same command line); no value travels"

    def describe(self, redact: bool = False) -> list[tuple[str, str]]:
        req = self.request
        return [(req.instances[0].host, req.shell_command(0, redact=redact)),
                *((i.host, f"(copy {i.index} of podrun launch joins {self.join_address()} as instance {i.index})")
                  for i in req.instances[1:])]

    def host_named(self, index: int, hostname: str) -> str | None:
        from podrun.launch.copies import unnamed_host

        return hostname if index > 0 and self.request.instances[index].host == unnamed_host(index) else None

    def preflight(self) -> list[Problem]:
        from podrun.launch.transports.local import LocalTransport

        problem = wire_join.key_problem(os.environ.get(wire_join.KEY_ENV))
        here = [Problem(self.request.instances[0].host, problem)] if problem is not None else []
        return here + LocalTransport(self._here()).preflight()

    def start(self) -> list[InstanceHandle]:
        from podrun.launch.transports.local import LocalTransport

        server = self.join_server(first=1, args_for=self._args_for)
        return [*LocalTransport(self._here()).start(), *server.handles.values()]
