"""The warm process (zygote): one per host of a run that can restart; it imports torch and podrun's runner once and forks later attempts' workers.

The first attempt's agent on a host starts it detached (podrun.pystart's safe start of this module), after its own
workers. It takes a lock (one per host), imports PRELOAD and warms up what torch imports on first use, with
no thread of its own started (at SCHED_IDLE when it may switch back afterwards), and then listens on a unix
socket (0600) in the run directory, ``<run_dir>/zygote/<hostname>.sock`` (directory 0700). A later
attempt's agent sends it one request per process to fork (each worker, and rank 0's store host): the argv
(``PY SCRIPT ...``, ``PY -m MODULE ...`` or ``PY -c CODE ...`` of the zygote's own interpreter), the env,
the working directory, and file descriptors as SCM_RIGHTS (the worker's stdout, stderr and progress pipe),
each for fd 0, 1 or 2 or for a variable that names its number. The child starts a session, gets SIGKILL
when the zygote dies, takes the descriptors, the env, the cwd, the PYTHONPATH and the stack-dump handler
(podrun/runtime/site), sets torch's threads from OMP_NUM_THREADS and runs the script as ``__main__``.
The zygote answers ``pid N Z`` and, when the child ends, ``exit RC`` (Popen's code: negative for a
signal); when the agent's connection closes first it kills the child's process group. Each agent holds
a lease connection for its life. The zygote ends when its socket file is removed or replaced (the
controller removes the directory when the run ends), when an agent that lost its controller says QUIT, or
after --idle seconds with no connection and no child. Before its imports it forks a watcher (no torch, no
thread) that gets SIGKILL with it and, when the run's controller dies on this machine (its control.pid names a
dead process: podrun.wire.owner.owner_alive), kills the zygote (whose forked processes die with it) within
WATCH_S and removes the run's zygote directory and stale control socket. The directory and the socket are
private (podrun.wire.unixsock: 0700 and 0600, checked with lstat). An agent that cannot reach it starts its
processes as usual. The agent's side is podrun.host.zygote_client; what a forked process does to become the
worker is podrun.host.zygote_child.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import io
import json
import os
import select
import shutil
import signal
import socket
import struct
import sys
import time
import traceback

from podrun import safefs
from podrun.errors import PodrunError
from podrun.host.zygote_child import become_worker
from podrun.host.zygote_client import CONNECT_S, IDLE_S, QUIT
from podrun.wire import unixsock
from podrun.wire.owner import owner_alive, remove_if_stale
from podrun.proctl import PR_SET_PDEATHSIG, die_with_parent, exit_now, prctl, signal_group

PRELOAD = ("torch", "torch.distributed", "torch.nn", "torch.optim", "numpy", "podrun.runtime.distributed",
           "podrun.train.runner", "podrun.train.loop", "podrun.train.data", "podrun.train.recipe_main",
           "podrun.models")
WATCH_S = 0.2           # how often the watcher checks the controller and the zygote
QUIT_SETTLE_S = 0.5     # after a QUIT, how long the zygote waits to see its controller dead before cleaning up
MAX_REQUEST = 16 * 1024 * 1024
MAX_FDS = 8


def _recv_request(conn: socket.socket) -> tuple[dict | None, list[int]]:
    """One request: (None, []) for a lease; raises OSError/ValueError on a malformed one. The descriptors a
    request brings are closed here unless a fork request keeps them (a lease, a QUIT or a malformed one brings
    none that is used)."""
    data, fds, _flags, _addr = socket.recv_fds(conn, 65536, MAX_FDS)
    kept: list[int] = []
    try:
        if len(data) < 4:
            raise ValueError("short request")
        (n,) = struct.unpack("!I", data[:4])
        if n == 0:
            return None, kept
        if data[:4] == QUIT:
            return {"quit": True}, kept
        if n > MAX_REQUEST:
            raise ValueError("request too large")
        body = data[4:]
        while len(body) < n:
            more = conn.recv(min(1 << 20, n - len(body)))
            if not more:
                raise ValueError("request cut short")
            body += more
        req = json.loads(body)
        if len(req.get("fds", ())) != len(fds):
            raise ValueError("file descriptors missing")
        kept = fds
        return req, kept
    finally:
        for fd in set(fds) - set(kept):
            os.close(fd)


def _idle_class() -> bool:
    """Import at SCHED_IDLE (CPU only when the first attempt's workers leave some) when this process may
    switch back to SCHED_OTHER afterwards (root, CAP_SYS_NICE, RLIMIT_NICE), as tried in a throwaway child;
    True when it switched."""
    pid = os.fork()
    if pid == 0:
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            os._exit(0)
        except BaseException:  # noqa: BLE001 - not allowed here
            os._exit(1)
    if os.waitpid(pid, 0)[1] != 0:
        return False
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    return True


def _warm_up() -> None:
    """What torch imports on first use rather than at import: an optimizer's first construction (torch._dynamo,
    sympy: seconds) and a checkpoint's save and load. Starts no thread."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    try:
        p = torch.zeros(1, requires_grad=True)
        for opt in (torch.optim.SGD, torch.optim.AdamW):
            opt([p], lr=0.1)
        buf = io.BytesIO()
        torch.save({"p": p.detach()}, buf)
        buf.seek(0)
        torch.load(buf)
    except Exception as exc:  # noqa: BLE001 - the worker does it itself then
        print(f"podrun zygote: warm-up: {exc}", file=sys.stderr, flush=True)


def _watch(zygote: int, path: str) -> None:
    """The watcher (a child forked before the imports): SIGKILL with the zygote; when the run's controller is
    dead on this machine, kill the zygote and remove the run's zygote directory and stale control socket (no
    longer dying with the zygote then, which would cut that short)."""
    die_with_parent(signal.SIGKILL, zygote)()
    run_dir = os.path.dirname(os.path.dirname(path))
    while os.getppid() == zygote:
        if owner_alive(run_dir) is False:
            prctl(PR_SET_PDEATHSIG, 0)       # the zygote's death, which follows, must not end the clean-up
            with contextlib.suppress(OSError):
                os.kill(zygote, signal.SIGKILL)
            _remove_run_zygotes(path)
            return
        time.sleep(WATCH_S)


def _clean_up(path: str, inode: int, settle: float = 0.0) -> None:
    """A zygote's end: its socket and lock go; when the run's controller is dead on this machine, the run's
    zygote directory and its stale control socket go too (no attempt will follow). ``settle``: seconds to wait
    for a controller said to be dead to be seen dead (an agent's QUIT can come while it is still exiting)."""
    run_dir = os.path.dirname(os.path.dirname(path))
    deadline = time.monotonic() + settle
    while owner_alive(run_dir) and time.monotonic() < deadline:
        time.sleep(0.01)
    with contextlib.suppress(OSError):
        if os.lstat(path).st_ino == inode:
            os.unlink(path)
            os.unlink(path[:-5] + ".lock")
    if owner_alive(run_dir) is False:
        _remove_run_zygotes(path)


def _remove_run_zygotes(path: str) -> None:
    """The run's controller is dead: its zygote directory (``path``'s) and its stale control socket go."""
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    remove_if_stale(os.path.dirname(os.path.dirname(path)))


def _start_watcher(path: str, lock: int) -> None:
    me = os.getpid()
    if os.fork() == 0:
        try:
            os.close(lock)                   # the zygote's lock stays the zygote's alone
            os.setpgid(0, 0)
            _watch(me, path)
        finally:
            os._exit(0)


def serve(path: str, idle: float, now: bool = False) -> int:
    """Listen at ``path`` once the preload is done (at SCHED_IDLE unless ``now``) and serve until the end."""
    if (problem := unixsock.dir_ok(os.path.dirname(path))) is not None:
        print(f"podrun zygote: {problem}", file=sys.stderr, flush=True)
        return 1
    try:
        lock = safefs.open_private(path[:-5] + ".lock", append=False, read=True)
    except (OSError, PodrunError):
        return 1
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0                                     # this host has its zygote already
    _start_watcher(path, lock)
    _preload(idle_first=not now)
    try:                                             # under the lock: a socket here is a dead zygote's
        if os.path.lexists(path):
            os.unlink(path)
        listener = unixsock.bind(path)
    except OSError as exc:
        print(f"podrun zygote: cannot listen on {path}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        return 1
    return _Server(path, listener, lock, idle).run()


PRELOADED_ENV: dict[str, str] = {}   # what the preload set in os.environ (torch's first use: inductor's cache dir)


def _preload(idle_first: bool = True) -> None:
    """Import PRELOAD and warm up what torch imports on first use (at SCHED_IDLE where it may switch back, when
    ``idle_first``: the first attempt's workers run meanwhile). The variables the imports set in this process's
    environment are kept (PRELOADED_ENV): a forked worker gets them, as its own imports would have set them."""
    before = dict(os.environ)
    idle_class = idle_first and _idle_class()
    for name in PRELOAD:
        try:
            __import__(name)
        except Exception as exc:  # noqa: BLE001 - a module missing here is imported by the worker itself
            print(f"podrun zygote: cannot preload {name}: {exc}", file=sys.stderr, flush=True)
    _warm_up()
    PRELOADED_ENV.update({k: v for k, v in os.environ.items() if before.get(k) != v})
    if idle_class:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))   # what the forked workers inherit


class _Server:
    """The zygote's loop on its listening socket: leases, fork requests, QUIT; each forked process's exit told to
    its agent, and killed when its agent's connection closes first; the end when the socket goes or at idle."""

    def __init__(self, path: str, listener: socket.socket, lock: int, idle: float):
        self.path, self.listener, self.lock, self.idle = path, listener, lock, idle
        self.inode = os.lstat(path).st_ino
        self.me = os.getpid()
        self.conns: dict[int, socket.socket] = {}       # fd -> connection (a lease, or a worker's)
        self.kids: dict[int, socket.socket | None] = {}  # pid -> its agent's connection
        self.of_conn: dict[int, int] = {}               # connection fd -> the pid forked for it

    def run(self) -> int:
        busy = time.monotonic()
        # each child's exit wakes the loop at once (SIGCHLD through a wakeup pipe), so that exits are reaped and
        # stamped in the order they happened: the first worker to fail is the run's root cause
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        print(f"podrun zygote {self.me}: ready on {self.path}", file=sys.stderr, flush=True)
        while True:
            ready, _, _ = select.select([self.listener, wake_r, *self.conns.values()], [], [], 0.25)
            for s in ready:
                if s == wake_r:
                    with contextlib.suppress(OSError):
                        os.read(wake_r, 4096)
                elif s is self.listener:
                    if self._accept():
                        return 0
                else:
                    self._readable(s)
            self._reap()
            if self.conns or self.kids:
                busy = time.monotonic()
            try:
                gone = os.lstat(self.path).st_ino != self.inode
            except OSError:
                gone = True
            if gone or time.monotonic() - busy > self.idle:
                self._kill_all()
                print(f"podrun zygote {self.me}: ending ({'socket removed' if gone else f'idle {self.idle:g} s'})",
                      file=sys.stderr, flush=True)
                if not gone:
                    _clean_up(self.path, self.inode)
                return 0

    def _accept(self) -> bool:
        """Take one connection: a lease is kept, a fork request forked; True on QUIT (the zygote has ended)."""
        try:
            c, _ = self.listener.accept()
        except OSError:
            return False
        c.settimeout(CONNECT_S)
        try:
            req, fds = _recv_request(c)
        except (OSError, ValueError):
            c.close()
            return False
        if req is None:
            self.conns[c.fileno()] = c
            return False
        if req.get("quit"):
            c.close()
            self._kill_all()
            print(f"podrun zygote {self.me}: ending (an agent lost its controller)", file=sys.stderr, flush=True)
            self.listener.close()
            _clean_up(self.path, self.inode, settle=QUIT_SETTLE_S)
            return True
        self._fork(c, req, fds)
        return False

    def _fork(self, c: socket.socket, req: dict, fds: list[int]) -> None:
        """Fork the requested process; its pid (and the zygote's) to the agent on ``c``."""
        pid = os.fork()
        if pid == 0:
            self.listener.close()
            for o in self.conns.values():
                o.close()
            c.close()
            os.close(self.lock)
            code = 1
            try:
                code = become_worker(req, fds, self.me, PRELOADED_ENV)
            except BaseException:  # noqa: BLE001 - becoming the worker failed (a missing cwd): say why
                traceback.print_exc()
            finally:
                exit_now(code, join_threads=True)   # its threads joined, atexit run, output flushed
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            c.sendall(f"pid {pid} {self.me}\n".encode())
        self.conns[c.fileno()] = c
        self.kids[pid] = c
        self.of_conn[c.fileno()] = pid

    def _readable(self, s: socket.socket) -> None:
        """A connection readable: its agent closed it (its forked process is killed) or wrote (ignored)."""
        try:
            data = s.recv(256)
        except OSError:
            data = b""
        if data:
            return
        fd = s.fileno()
        del self.conns[fd]
        pid = self.of_conn.pop(fd, None)
        if pid is not None and self.kids.get(pid) is s:
            self.kids[pid] = None
            signal_group(pid, signal.SIGKILL)
        s.close()

    def _reap(self) -> None:
        """Collect the forked processes that ended; each one's exit (Popen's code) to its agent."""
        while self.kids:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            c = self.kids.pop(pid, None)
            if c is not None:
                with contextlib.suppress(OSError):     # Popen's code; when it was reaped: exits in order
                    c.sendall(f"exit {os.waitstatus_to_exitcode(status)} {time.time():.6f}\n".encode())

    def _kill_all(self) -> None:
        for pid in self.kids:
            signal_group(pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m podrun.host.zygote", description=__doc__.splitlines()[0])
    ap.add_argument("--socket", required=True, help="the unix socket to listen on: <run_dir>/zygote/<host>.sock")
    ap.add_argument("--idle", type=float, default=IDLE_S, help="end after this many seconds with no agent")
    ap.add_argument("--now", action="store_true",
                    help="import at the usual priority: the first attempt's workers wait for this zygote")
    args = ap.parse_args(argv)
    if os.fork() != 0:                                # detach: the starting agent waits only for this exit
        os._exit(0)
    code = serve(args.socket, args.idle, now=args.now)
    sys.stderr.flush()
    os._exit(code)                    # at once: no interpreter teardown of the preloaded modules (seconds)


if __name__ == "__main__":
    sys.exit(main())
