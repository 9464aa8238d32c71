"""The agent store: rank 0's agent holds MASTER_PORT from its first moment and serves torch's TCPStore on it.

torch's ``env://`` and ``tcp://`` rendezvous connect every worker to a TCPStore on MASTER_ADDR:MASTER_PORT.
Without podrun, rank 0 creates that store once its ``import torch`` is done, and a worker that gets there
first is refused and retries with exponential backoff and jitter (a few ms early can cost a second). Under
torchrun the agent hosts the store and every worker, rank 0 included, is a client
(``TORCHELASTIC_USE_AGENT_STORE=True``, read by ``torch.distributed.rendezvous._create_c10d_store``).

podrun does the same, without importing torch in the agent:

- The agent of global rank 0 binds and listens on MASTER_PORT at once, before any worker exists (with the
  ssh preflight: while it is held; on this machine the controller binds it and hands the socket over), so
  the port is reserved from the moment it is checked, and a connect to it always succeeds: early clients
  wait in the kernel's accept queue, their bytes unread, instead of being refused.
- A child of the agent (``StoreHost``, the agent's python) imports torch and creates the TCPStore on that
  very socket (``master_listen_fd``). Workers talk to the store directly: nothing relays their bytes.
- Every worker sees the same MASTER_PORT and TORCHELASTIC_USE_AGENT_STORE=True, as under torchrun.

When the master host's python (--python) has no torch (a run of plain commands), nothing hosts a store:
on this machine the controller does not hold the port, elsewhere the agent lets it go before its workers
start, and rank 0 gets no TORCHELASTIC_USE_AGENT_STORE, so a rank 0 that does use torch (from another
python) hosts the store itself, as without podrun. Where that python has torch but the workers' program shows
no import of it (podrun.host.zygote_client.imports_torch), the store host starts at the first connection to the
port instead of at once: the client waits in the accept queue while it starts, and a program that never asks for
the store (a plain command, a launch benchmark's worker) costs no torch import on the first host.
"""
from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import threading

from podrun import pystart
from podrun.host import zygote_client
from podrun.wire.probe import listen, torch_available
from podrun.proctl import die_with_parent
from podrun.wire.worker_env import AGENT_STORE_NAME as ENV    # the name podrun.wire.worker_env sets for every worker

FD_ENV = "PODRUN_STORE_FD"   # in a store host a zygote forked: the number its listening socket has there
# The store host: argv = listening fd, its port. Prints "up" once the store serves, else "failed: ...".
_HOST = r"""
import datetime, os, sys
fd, port = int(os.environ.get("FD_ENV") or sys.argv[1]), int(sys.argv[2])
try:
    from torch.distributed import TCPStore
    kw = dict(world_size=None, is_master=True, timeout=datetime.timedelta(seconds=300), wait_for_workers=False,
              master_listen_fd=fd)
    try:
        store = TCPStore("127.0.0.1", port, use_libuv=True, **kw)
    except Exception:                 # a torch whose libuv server cannot adopt a socket: the classic one can
        store = TCPStore("127.0.0.1", port, use_libuv=False, **kw)
except BaseException as exc:
    print(f"failed: {type(exc).__name__}: {exc}".splitlines()[0], flush=True)
    sys.exit(3)
print("up", flush=True)
sys.stdin.read()                      # serve until the agent closes our stdin (or dies: PDEATHSIG)
""".replace("FD_ENV", FD_ENV)


class StoreHost:
    """The child process that serves the TCPStore on ``sock``; ``state`` is "starting", "up" or "failed: ..."."""

    def __init__(self, sock: socket.socket, on_failure=None, python: str = sys.executable,
                 warm: zygote_client.WarmHost | None = None):
        self.sock = sock
        self.state = "starting"
        self.closing = False          # the agent ends it: its exit is no failure to report
        self.up = threading.Event()
        self._on_failure = on_failure
        fd = sock.fileno()
        argv = pystart.safe(python, str(fd), str(sock.getsockname()[1]), code=_HOST)
        self.proc = self._forked(warm, argv, fd) if warm is not None else None
        if self.proc is None:
            self.proc = pystart.popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, pass_fds=(fd,), start_new_session=True,
                                      preexec_fn=die_with_parent())
        threading.Thread(target=self._watch, name="podrun-store-host", daemon=True).start()

    @staticmethod
    def _forked(warm: zygote_client.WarmHost, argv: list[str], fd: int):
        """The store host forked by this host's zygote (torch already imported; podrun.host.zygote), with
        the same pipes as a started one; None when there is no zygote."""
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        proc = zygote_client.spawn(warm.run_dir, warm.host, argv, dict(os.environ), os.getcwd(),
                                   {0: in_r, 1: out_w, 2: out_w, FD_ENV: fd})
        os.close(in_r)
        os.close(out_w)
        if not isinstance(proc, zygote_client.WarmProc):
            os.close(in_w)
            os.close(out_r)
            return None
        proc.stdin, proc.stdout = os.fdopen(in_w, "wb"), os.fdopen(out_r, "rb")
        return proc

    def _watch(self) -> None:
        lines = []
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace").strip()
            if line == "up":
                self.state = "up"
                self.up.set()
            elif line:
                lines.append(line)
        if self.state != "up":
            failed = [l for l in lines if l.startswith("failed: ")]
            self.state = failed[-1] if failed else f"failed: exit {self.proc.wait()} ({(lines or ['no output'])[-1]})"
            self.up.set()
            if self._on_failure is not None and not self.closing:
                self._on_failure(self.state)

    def close(self) -> None:
        self.closing = True
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                f.close()


class AgentStore:
    """What the agent of global rank 0 holds: the listening socket on MASTER_PORT and the store host.

    ``open`` binds at once (or adopts the controller's socket, ``listen_fd``); ``error`` says why it could
    not. ``start`` then starts the store host, or, without torch or without the port, takes
    TORCHELASTIC_USE_AGENT_STORE off the agent's workers so that rank 0 hosts the store itself.
    """

    def __init__(self, port: int, sock: socket.socket | None, error: str | None):
        self.port = port
        self.sock = sock
        self.error = error
        self.host: StoreHost | None = None
        self.lock = threading.Lock()     # a store host started at the first connection vs the agent's close
        self.done = threading.Event()    # set at close (under the lock)

    @classmethod
    def open(cls, port: int, listen_fd: int | None = None) -> "AgentStore":
        if listen_fd is not None:
            sock = socket.socket(fileno=listen_fd)
            return cls(sock.getsockname()[1], sock, None)
        try:
            sock = listen(port)
        except OSError as exc:
            return cls(port, None, os.strerror(exc.errno) if exc.errno else str(exc))
        return cls(sock.getsockname()[1], sock, None)

    def start(self, envs: list[dict[str, str]], note, warm: zygote_client.WarmHost | None = None,
              now: bool = True) -> None:
        """Serve the store, or fall back to rank 0 hosting it (``note``: the agent's message line); ``warm``
        (the agent's warm starts): fork the store host from this host's zygote when it runs. ``now``: the store
        host starts at once (the workers' program imports torch); else at the first connection to the port (held
        in the accept queue meanwhile), so that a program that never uses torch's store costs no torch import."""
        if self.sock is not None and torch_available():
            if now:
                self._host(note, warm)
            else:
                threading.Thread(target=self._host_when_asked, args=(note, warm), name="podrun-store-wait",
                                 daemon=True).start()
            return
        if self.sock is None:
            note(f"cannot listen on port {self.port} ({self.error}): rank 0 hosts its store there itself")
        self.release()
        for e in envs:
            e.pop(ENV, None)

    def _host(self, note, warm) -> None:
        self.host = StoreHost(self.sock, on_failure=lambda why: note(
            f"cannot host the store on port {self.port}: {why[len('failed: '):]}"), warm=warm)
        zygote_pid = getattr(self.host.proc, "zygote_pid", None)
        if zygote_pid is not None:
            note(f"warm start: the store host forked by the zygote (pid {zygote_pid}) as pid {self.host.proc.pid}")

    def _host_when_asked(self, note, warm) -> None:
        """Start the store host once a client connects (the socket is readable), unless it was closed first."""
        with self.lock:
            sock = self.sock
        if sock is None:
            return
        try:
            select.select([sock], [], [])
        except (OSError, ValueError):            # closed meanwhile: the agent ended
            return
        with self.lock:
            if self.sock is None or self.done.is_set():
                return
            self._host(note, warm)
        self.done.wait()            # a started store host ends with the thread that started it (die_with_parent)

    def pid(self) -> int | None:
        """The store host's pid while it is the agent's child (a zygote's fork is not), else None."""
        if self.host is None or getattr(self.host.proc, "zygote_pid", None) is not None:
            return None
        return self.host.proc.pid

    def release(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def close(self) -> None:
        with self.lock:
            self.done.set()
        if self.host is not None:
            self.host.close()
        self.release()
