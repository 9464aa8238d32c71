"""The agent's side of a host's zygote (podrun.host.zygote): starting it, a lease on it, the processes it forks."""
from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import NamedTuple

from podrun import pystart, safefs
from podrun.errors import PodrunError
from podrun.proctl import signal_group
from podrun.rundir.layout import ZYGOTE

IDLE_S = 60.0           # seconds with no agent connected and no worker alive before the zygote ends
CONNECT_S = 2.0         # an agent's bound on reaching the zygote and hearing the forked pid
NOT_PYTHON = "not a Python script, module or -c of this interpreter"   # spawn's answer: no zygote can run it
LEASE = struct.pack("!I", 0)    # a request of length 0: hold this connection while the agent lives
QUIT = struct.pack("!I", 0xFFFFFFFF)   # end now: the agent's controller is gone, no attempt will follow


# how long a first attempt's agent waits for the zygote it started before starting cold: while the zygote lives (it
# holds its lock), importing, up to FIRST_WAIT_S (many zygotes sharing a machine's cores take long); one not seen
# alive ALIVE_GRACE_S after its start has ended
FIRST_WAIT_S = 600.0
ALIVE_GRACE_S = 30.0
TORCH_IMPORT = re.compile(r"^[ \t]*(?:import[ \t]+(?:[\w.]+(?:[ \t]+as[ \t]+\w+)?[ \t]*,[ \t]*)*torch\b"
                          r"|from[ \t]+torch\b)", re.MULTILINE)


class WarmHost(NamedTuple):
    """An agent's warm starts: its run directory and host name (where the zygote's socket is), whether it
    starts a zygote for the next attempt, whether this is a later attempt (a zygote may be there), and whether
    this first attempt's workers are forked too (several workers on this host: torch imported once here)."""
    run_dir: str
    host: str
    start_next: bool
    later: bool
    first: bool = False


def imports_torch(command) -> bool:
    """Whether the workers' program imports torch, which makes a zygote worth waiting for at the first attempt:
    podrun's recipe runner or torch's own modules, a script (its first MiB) or -c code with an import of torch."""
    target = warm_target(command)
    if target is None:
        return False
    kind, what = target[0], target[1]
    if kind == "module":
        return f"{what}.".startswith(("podrun.", "torch."))
    if kind == "code":
        return TORCH_IMPORT.search(what) is not None
    try:
        with open(what, "rb") as f:
            return TORCH_IMPORT.search(f.read(1 << 20).decode("utf-8", "replace")) is not None
    except OSError:
        return False


def zygote_dir(run_dir: str) -> str:
    return os.path.join(run_dir, ZYGOTE)


def socket_path(run_dir: str, host: str) -> str:
    return os.path.join(zygote_dir(run_dir), re.sub(r"[^A-Za-z0-9._-]", "_", host) + ".sock")


def warm_target(command, python: str = sys.executable) -> tuple[str, str, list[str], bool] | None:
    """("script"|"module"|"code", path, module or code, args, unbuffered) when ``command`` runs ``python``
    (this interpreter, the same path) on a script, a module or ``-c`` code; None when a zygote cannot run it."""
    import shutil

    if len(command) < 2:
        return None
    exe = shutil.which(command[0]) if os.sep not in command[0] else command[0]
    if exe is None or os.path.dirname(os.path.abspath(exe)) != os.path.dirname(os.path.abspath(python)):
        return None
    try:
        if os.path.realpath(exe) != os.path.realpath(python):
            return None
    except OSError:
        return None
    rest, unbuffered = list(command[1:]), False
    while rest and rest[0] == "-u":
        rest, unbuffered = rest[1:], True
    if len(rest) >= 2 and rest[0] in ("-m", "-c"):
        return "module" if rest[0] == "-m" else "code", rest[1], rest[2:], unbuffered
    if rest and not rest[0].startswith("-"):
        return "script", rest[0], rest[1:], unbuffered
    return None


def _connect(path: str) -> socket.socket | None:
    """A connection to the zygote at ``path``; None when none listens or the socket is not this user's own."""
    from podrun.wire import unixsock

    if unixsock.dir_ok(os.path.dirname(path)) is not None or not unixsock.socket_ok(path):
        return None
    try:
        return unixsock.connect(path, CONNECT_S)
    except OSError:
        return None


def quit_host(run_dir: str, host: str) -> None:
    """Tell this host's zygote to end now (its forked processes die with it)."""
    conn = _connect(socket_path(run_dir, host))
    if conn is not None:
        with contextlib.suppress(OSError):
            conn.sendall(QUIT)
        conn.close()


class WarmProc:
    """A process the zygote forked, as its agent sees it: what the agent uses of Popen (pid, stdin, stdout,
    stderr, poll, wait, kill, returncode). Its exit code comes from the zygote; a zygote that died took the
    process with it (SIGKILL)."""

    def __init__(self, conn: socket.socket, pid: int, zygote_pid: int, rest: bytes = b""):
        self.conn, self.pid, self.zygote_pid = conn, pid, zygote_pid
        self.stdin = self.stdout = self.stderr = None
        self.returncode: int | None = None
        self.ended_at: float | None = None     # when the zygote reaped it (wall clock), where it said
        self._buf = rest
        self._lock = threading.Lock()
        conn.setblocking(False)

    def poll(self) -> int | None:
        with self._lock:
            return self._poll()

    def _poll(self) -> int | None:
        while self.returncode is None:
            m = re.search(rb"exit (-?\d+)(?: (\d+\.\d+))?\n", self._buf)
            if m is not None:
                self._ended(int(m[1]), float(m[2]) if m[2] else None)
                break
            try:
                data = self.conn.recv(256)
            except BlockingIOError:
                return None
            except OSError:
                data = b""
            if not data:
                self._ended(-int(signal.SIGKILL))
            self._buf += data
        return self.returncode

    def _ended(self, code: int, at: float | None = None) -> None:
        self.returncode, self.ended_at = code, at
        self.conn.close()

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"zygote worker {self.pid}", timeout)
            select.select([self.conn], [], [], 0.1)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            signal_group(self.pid, signal.SIGKILL)


def spawn(run_dir: str, host: str, command, env: dict[str, str], cwd: str, fds: dict) -> WarmProc | str:
    """Ask this host's zygote to fork a process running ``command``; when it cannot, why (NOT_PYTHON: another
    interpreter, a command that is not a Python script, module or ``-c``; or no zygote answered): the caller
    then starts it as usual.

    ``fds``: what the process gets of the caller's file descriptors, {target: fd}; a target is 0, 1 or 2, or
    the name of a variable that tells the process the number it has there (stdin is /dev/null unless given).
    """
    target = warm_target(command)
    if target is None:
        return NOT_PYTHON
    conn = _connect(socket_path(run_dir, host))
    if conn is None:
        return "no zygote listens on this host (it ended, or is still importing)"
    body = json.dumps({"target": target, "env": env, "cwd": cwd, "fds": list(fds)}).encode()
    try:
        socket.send_fds(conn, [struct.pack("!I", len(body)) + body], list(fds.values()))
        reply = b""
        while b"\n" not in reply:
            data = conn.recv(256)
            if not data:
                break
            reply += data
        m = re.match(rb"pid (\d+) (\d+)\n", reply)
        if m is None:
            raise OSError(f"it answered {reply[:200]!r}")
    except OSError as exc:
        conn.close()                                 # the zygote kills a process it forked for this request
        if isinstance(exc, TimeoutError):
            return f"this host's zygote did not answer within {CONNECT_S:g} s"
        return f"this host's zygote failed the request: {exc}"
    return WarmProc(conn, int(m[1]), int(m[2]), reply[m.end():])


def start(run_dir: str, host: str, idle: float = IDLE_S, now: bool = False) -> bool:
    """Start this host's zygote, detached (it forks away and the first process exits): the caller must not
    be a child subreaper while this runs, or the zygote would stay its descendant; ``now``: its imports at the
    usual priority (workers wait for them). False when it did not start (its first process failed: no podrun for
    this interpreter as started usually, say), with why in its log."""
    path = socket_path(run_dir, host)
    try:                                             # not a private directory of this user: no zygote
        safefs.make_dir(os.path.dirname(path), "zygote directory")
        log = os.fdopen(safefs.open_private(path[:-5] + ".log"), "ab")
    except (OSError, PodrunError):
        return False
    with log:
        try:
            return pystart.run(pystart.safe(sys.executable, "--socket", path, "--idle", str(idle),
                                            *(["--now"] if now else []), module="podrun.host.zygote"),
                               stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                  timeout=30, check=False).returncode == 0
        except (OSError, subprocess.SubprocessError):
            return False


def alive(run_dir: str, host: str) -> bool:
    """Whether this host's zygote lives, listening or still importing: a process holds its lock (the kernel's list
    of file locks, /proc/locks, read without taking the lock)."""
    try:
        st = os.stat(socket_path(run_dir, host)[:-5] + ".lock")
        with open("/proc/locks", encoding="ascii") as f:
            text = f.read()
    except OSError:
        return False
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    return any(" FLOCK " in line and where in line.split() for line in text.splitlines())


def wait_first(run_dir: str, host: str) -> tuple[socket.socket | None, str]:
    """A lease on the zygote the caller has just started, once it listens: waiting while it lives (FIRST_WAIT_S at
    most); else None and why (it ended first, or it is still importing)."""
    start = time.monotonic()
    while True:
        conn = hold(run_dir, host, 1.0)
        if conn is not None:
            return conn, ""
        waited = time.monotonic() - start
        if waited > ALIVE_GRACE_S and not alive(run_dir, host):
            return None, f"this host's zygote ended before it listened (its log: {socket_path(run_dir, host)[:-5]}.log)"
        if waited > FIRST_WAIT_S:
            return None, f"this host's zygote did not listen within {FIRST_WAIT_S:.0f} s"


def hold(run_dir: str, host: str, wait: float) -> socket.socket | None:
    """A lease on this host's zygote (kept while the agent lives), trying for ``wait`` seconds (inf: as long as
    the caller lives) while it starts."""
    deadline = time.monotonic() + wait
    while True:
        conn = _connect(socket_path(run_dir, host))
        if conn is not None:
            try:
                conn.sendall(LEASE)
                return conn
            except OSError:
                conn.close()
        if time.monotonic() > deadline:
            return None
        time.sleep(0.25)
