"""The run's control socket: how ``podrun stack`` reaches a running controller. A unix socket ``control.sock`` in the
run directory, one JSON request and one JSON reply per connection, bound private and reached as podrun.wire.unixsock
says (long paths, 0600 from the start, lstat checks); ``control.pid`` beside it names the controller
(podrun.wire.owner), so that a dead run's socket is removed, never trusted."""
from __future__ import annotations

import json
import os
import socket
import threading

from podrun.launch.stacks import DUMP_WAIT_S
from podrun.wire.owner import OWNER_NAME, SOCKET_NAME, boot_id

def claim(run_dir: str) -> None:
    """Record this process as the run's controller in <run_dir>/control.pid (new, 0600), for the run's life."""
    from podrun.launch.rundir import new_private_open

    with open(os.path.join(run_dir, OWNER_NAME), "w", encoding="ascii", opener=new_private_open) as f:
        f.write(f"{boot_id()} {os.getpid()}\n")


def release(run_dir: str) -> None:
    try:
        os.unlink(os.path.join(run_dir, OWNER_NAME))
    except OSError:
        pass


def serve(run_dir: str, handle) -> socket.socket:
    """Listen on <run_dir>/control.sock (0600); each connection's JSON request goes to ``handle(request)``,
    whose dict is the reply. Returns the listening socket; close it with ``stop``."""
    from podrun.wire import unixsock

    s = unixsock.bind(os.path.join(run_dir, SOCKET_NAME), 8)

    def one(conn):
        with conn:
            try:
                conn.settimeout(DUMP_WAIT_S * 4)
                data = b""
                while not data.endswith(b"\n") and len(data) < 4096:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                reply = handle(json.loads(data or b"{}"))
            except (OSError, ValueError) as exc:
                reply = {"error": f"bad request: {exc}"}
            try:
                conn.sendall(json.dumps(reply, default=str).encode() + b"\n")
            except OSError:
                pass

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
    try:
        os.unlink(os.path.join(run_dir, SOCKET_NAME))
    except OSError:
        pass
    server.close()


MAX_REPLY = 64 * 1024 * 1024     # bytes of a control-socket reply read at most


def ask(run_dir: str, request: dict, timeout: float = DUMP_WAIT_S * 4):
    """Send ``request`` to the controller of the run in ``run_dir``; its reply (parsed JSON, any shape: the
    caller checks it). OSError when none listens, ValueError for a reply that is not JSON."""
    from podrun.wire import unixsock

    with unixsock.connect(os.path.join(run_dir, SOCKET_NAME), timeout) as s:
        s.sendall(json.dumps(request).encode() + b"\n")
        data = b""
        while len(data) <= MAX_REPLY:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    if len(data) > MAX_REPLY:
        raise ValueError(f"a reply longer than {MAX_REPLY} bytes")
    return json.loads(data)
