"""The store relay: the master agent listens on the rendezvous port from its first moment and pipes
every connection to rank 0's TCPStore (on the port after it) once that store is up.

Why: torch's TCPStore clients that reach the rendezvous port before rank 0 has created its store get
"connection refused" and retry with exponential backoff and jitter; a client that arrives a few
milliseconds early can wait up to a second. With the relay listening before any worker starts, every
connect succeeds at once; the relay holds early connections (their bytes wait in the kernel) and
joins them to the store within a few milliseconds of it listening. Torchrun reaches the same end by
hosting the store in its agent, which imports torch first; this agent does not import torch.

One thread, one selector, non-blocking sockets with a buffer per direction: thousands of workers
cost no threads. Bytes are passed through unchanged, so it relays any TCP protocol.
"""
from __future__ import annotations

import errno
import selectors
import socket
import struct
import threading

RETRY_S = 0.005           # how often pending connections try the store while it is not yet up
CHUNK = 1 << 16


def store_port(master_port: int) -> int:
    """Where rank 0's own store listens behind the relay (rank 0's MASTER_PORT)."""
    return master_port + 1


def rendezvous_ports(master_port: int, store_relay: bool) -> tuple[int, ...]:
    """The ports a run listens on at the master host: the rendezvous port, and with the relay the store's."""
    return (master_port, store_port(master_port)) if store_relay else (master_port,)


def listen(port: int) -> socket.socket:
    """A listening socket on every address (IPv4 and IPv6 where the host has it), SO_REUSEADDR set."""
    if socket.has_dualstack_ipv6():
        try:
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=4096)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:     # no point trying IPv4 alone
                raise
    return socket.create_server(("", port), backlog=4096)


def connect(addr: tuple[str, int], timeout: float = 1.0) -> socket.socket:
    """Connect to ``addr``; a connection that the kernel made to itself counts as refused.

    While nothing listens on a port inside the ephemeral range (net.ipv4.ip_local_port_range), a connect
    to it from this host can be given that very port as its source, and TCP's simultaneous open then
    joins the socket to itself: it "connects", its own bytes come back, and it holds the port so the
    store cannot bind it. Such a socket is reset (no TIME_WAIT left on the port) and the attempt refused.
    """
    s = socket.create_connection(addr, timeout=timeout)
    try:
        itself = s.getsockname()[:2] == s.getpeername()[:2]
    except OSError:
        itself = False
    if itself:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
        raise ConnectionRefusedError(errno.ECONNREFUSED, f"connected to itself on port {addr[1]}")
    return s


class _Pipe:
    """One relayed connection: the worker's socket and the store's, each with its pending output."""

    def __init__(self, client: socket.socket):
        self.client = client
        self.store: socket.socket | None = None
        self.out = {}              # socket -> bytearray waiting to be written to it
        self.writing = set()       # sockets registered for EVENT_WRITE too (their output is backed up)

    def peer(self, s: socket.socket) -> socket.socket:
        return self.store if s is self.client else self.client


class StoreRelay:
    """Listen on ``port``; pipe each accepted connection to ``(target_host, target_port)``."""

    def __init__(self, port: int, target_host: str, target_port: int):
        self.port = port
        self.target = (target_host, target_port)
        self.sock = listen(port)
        self.sock.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.sock, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()      # close() wakes the loop at once
        self.sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self.pending: list[_Pipe] = []
        self.pipes: set[_Pipe] = set()
        self.relayed = 0           # connections joined to the store
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="podrun-store-relay", daemon=True)

    def start(self) -> "StoreRelay":
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(timeout=1.0)
        self._wake_w.close()

    # -- the loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while not self._closed:
                events = self.sel.select(timeout=RETRY_S if self.pending else 0.2)
                for key, mask in events:
                    if key.data == "wake":
                        break
                    if key.data is None:
                        self._accept()
                    else:
                        self._io(key.fileobj, key.data, mask)
                if self.pending:
                    self._join_pending()
        finally:
            for p in list(self.pipes) + self.pending:
                self._drop(p)
            self.sel.close()
            self.sock.close()
            self._wake_r.close()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            c.setblocking(False)
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # nothing is read from it until the store is up: its first bytes wait in the kernel
            self.pending.append(_Pipe(c))

    def _join_pending(self) -> None:
        try:
            s = connect(self.target)
        except OSError:
            return                 # not listening yet; try again in RETRY_S
        conns = [s]
        for _ in range(len(self.pending) - 1):
            try:
                conns.append(connect(self.target))
            except OSError:
                break
        for s in conns:
            p = self.pending.pop(0)
            s.setblocking(False)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            p.store = s
            p.out = {p.client: bytearray(), s: bytearray()}
            self.pipes.add(p)
            self.relayed += 1
            self.sel.register(p.client, selectors.EVENT_READ, p)
            self.sel.register(s, selectors.EVENT_READ, p)

    def _io(self, s: socket.socket, p: _Pipe, mask: int) -> None:
        if p not in self.pipes:
            return
        if mask & selectors.EVENT_WRITE:
            if not self._flush(p, s):
                return
        if mask & selectors.EVENT_READ:
            try:
                data = s.recv(CHUNK)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self._drop(p)
                return
            other = p.peer(s)
            p.out[other] += data
            self._flush(p, other)

    def _flush(self, p: _Pipe, s: socket.socket) -> bool:
        buf = p.out[s]
        while buf:
            try:
                n = s.send(buf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._drop(p)
                return False
            del buf[:n]
        # what could not be written now waits for the socket to be writable (store messages are small);
        # the selector is touched only when that changes, not once per message
        if bool(buf) != (s in p.writing):
            p.writing.symmetric_difference_update({s})
            self.sel.modify(s, selectors.EVENT_READ | (selectors.EVENT_WRITE if buf else 0), p)
        return True

    def _drop(self, p: _Pipe) -> None:
        self.pipes.discard(p)
        for s in (p.client, p.store):
            if s is None:
                continue
            try:
                self.sel.unregister(s)
            except (KeyError, ValueError):
                pass
            try:
                s.close()
            except OSError:
                pass

