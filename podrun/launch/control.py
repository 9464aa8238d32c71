"""The run's control socket: how ``podrun stack`` reaches a running controller. A unix socket ``control.sock`` in the
run directory, one request and one reply per connection (podrun.wire.control), bound private and reached as podrun.wire.unixsock
says (long paths, 0600 from the start, lstat checks); ``control.pid`` beside it names the controller
(podrun.wire.owner), so that a dead run's socket is removed, never trusted, and a dead controller's record is
replaced by the next controller of the run."""
from __future__ import annotations

import contextlib
import os
import socket
import threading

from podrun.launch.stacks import DUMP_WAIT_S
from podrun.wire.control import MAX_REPLY_BYTES, Ask, read_reply, reply_line
from podrun.rundir.layout import CONTROL_PID, CONTROL_SOCKET
from podrun.wire.owner import clear_dead, record_text


def claim(run_dir: str) -> None:
    """Record this process as the run's controller in <run_dir>/control.pid (new, 0600), for the run's life; a dead
    controller's record is replaced, a live one's refused (podrun.wire.owner.clear_dead)."""
    from podrun.safefs import create_new

    clear_dead(run_dir)
    with os.fdopen(create_new(os.path.join(run_dir, CONTROL_PID)), "w", encoding="ascii") as f:
        f.write(record_text())


def release(run_dir: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(run_dir, CONTROL_PID))


def serve(run_dir: str, handle) -> socket.socket:
    """Listen on <run_dir>/control.sock (0600); each connection's request goes to ``handle(ask)`` (an Ask, podrun.wire.
    control), whose dict is the reply. Returns the listening socket; close it with ``stop``."""
    from podrun.wire import unixsock

    s = unixsock.bind(os.path.join(run_dir, CONTROL_SOCKET), 8)

    def one(conn):
        with conn:
            try:
                conn.settimeout(DUMP_WAIT_S * 4)
                data = b""
                while not data.endswith(b"\n") and len(data) < 4096 and (chunk := conn.recv(4096)):
                    data += chunk
                reply = handle(Ask.parse(data))
            except (OSError, ValueError) as exc:
                reply = {"error": f"bad request: {exc}"}
            with contextlib.suppress(OSError):
                conn.sendall(reply_line(reply))

    def accept():
        while True:
            try:
                conn, _ = s.accept()
            except OSError:
                return
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return s


def stop(run_dir: str, server: socket.socket | None) -> None:
    if server is None:
        return
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(run_dir, CONTROL_SOCKET))
    server.close()


def ask(run_dir: str, request: Ask, timeout: float = DUMP_WAIT_S * 4):
    """Send ``request`` to the controller of the run in ``run_dir``; its reply, parsed (any shape: the caller
    checks it). OSError when none listens or the whole reply takes longer than ``timeout``; ValueError for a
    reply larger than MAX_REPLY_BYTES, nested deeper than MAX_REPLY_DEPTH, or not JSON."""
    import time

    from podrun.wire import unixsock

    deadline = time.monotonic() + timeout
    data = bytearray()
    with unixsock.connect(os.path.join(run_dir, CONTROL_SOCKET), timeout) as s:
        s.sendall(request.to_line())
        while chunk := s.recv(1 << 16):
            data += chunk
            if len(data) > MAX_REPLY_BYTES:
                raise ValueError(f"a reply larger than {MAX_REPLY_BYTES >> 20} MiB")
            s.settimeout(max(deadline - time.monotonic(), 0.001))
    return read_reply(bytes(data))
