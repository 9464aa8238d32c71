"""One writer per directory: the directory checked as this user's (safefs), an advisory lock (fcntl.flock) on a file
inside it, released by the kernel when its holder dies; the file names the run, host and pid that hold it.
torch-free (the CLI checks a run's locks)."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import stat
import time
from pathlib import Path

from podrun import safefs
from podrun.errors import PodrunError
from podrun.rundir.layout import LAUNCH_LOCK, WRITER_LOCK


class LockError(PodrunError):
    """Another live process holds the directory (exit 2); or the directory cannot hold a lock file."""


def writer_alive(host: str | None, pid: int) -> bool:
    """Whether the process ``pid`` on ``host`` (None: this host) may still run; another host's is assumed alive."""
    if host is not None and host != socket.gethostname():
        return True
    from podrun.proctl import pid_alive

    return pid_alive(pid)


def holder(directory: str | os.PathLike, name: str = WRITER_LOCK) -> dict | None:
    """Who holds ``directory``'s lock ({"run", "host", "pid", "since"}; {} when it wrote nothing yet), or None
    when no live process holds it (or there is no lock file)."""
    path = Path(directory) / name
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _who(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _who(fd: int):
    """What the lock file's holder wrote of itself ({} when nothing readable)."""
    try:
        return json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        return {}


def describe(who: dict | None) -> str:
    if not who or not isinstance(who, dict):
        return "another process"
    return f"run {who.get('run', '?')} on host {who.get('host', '?')} (pid {who.get('pid', '?')})"


class DirLock:
    """An exclusive lock on ``directory`` (the file ``name`` inside it) for as long as the process holds this
    object (or until ``release``)."""

    def __init__(self, directory: str | os.PathLike, run: str, what: str, name: str = WRITER_LOCK):
        self.dir, self.run, self.what, self.name = Path(directory), run, what, name
        self.fd: int | None = None

    def acquire(self, same_run_wait: float = 0.0) -> "DirLock":
        """Take the lock; LockError (exit 2) naming the run and host that hold it, or why the directory cannot
        hold a lock file (missing, read-only). ``same_run_wait``: seconds to wait while the holder is this same
        run (an earlier attempt of it still ending, e.g. on a host just lost) before refusing."""
        path = self.dir / self.name
        try:       # never a link; an existing file must be this user's private regular file (else UnsafePath)
            fd = safefs.open_private(path, append=False, read=True)
        except OSError as exc:
            raise LockError(f"{self.what} {self.dir} cannot be written: {exc.strerror or exc} (creating {path})",
                            hint="pass a directory that exists and is writable (a read-only mount or a full "
                                 "disk is found here, before any training)") from None
        deadline = time.monotonic() + same_run_wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                who = _who(fd)
                if isinstance(who, dict) and who.get("run") == self.run and time.monotonic() < deadline:
                    time.sleep(0.1)
                    continue
                os.close(fd)
                raise LockError(f"{self.what} {self.dir} is in use by {describe(who)}: one writer at a time",
                                hint="wait for that run to end (or end it), or use another directory") from None
        mine = json.dumps({"run": self.run, "host": socket.gethostname(), "pid": os.getpid(),
                           "since": round(time.time(), 3)}).encode()
        with contextlib.suppress(OSError):   # the lock holds; only its description may be missing
            os.ftruncate(fd, 0)
            os.pwrite(fd, mine, 0)
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, 0)
            os.close(self.fd)            # closing the last descriptor drops the lock
            self.fd = None


def check_free(run_dir: str | os.PathLike, launch: bool = True) -> None:
    """LockError (exit 2) when a live process holds the run directory: a launch (``launch``: looked at too) or a
    train.py writing it."""
    for name, what in ((LAUNCH_LOCK, "a launch"), (WRITER_LOCK, "a training process"))[0 if launch else 1:]:
        who = holder(run_dir, name)
        if who is not None:
            raise LockError(f"run directory {run_dir} is held by {what}: {describe(who)}; it cannot be resumed "
                            "while that runs", hint="wait for it to end (or end it), then resume")


def hold_run(run_dir: str | os.PathLike, run_id: str, resuming: bool = False) -> DirLock:
    """A launch's hold on its run directory for the whole run (the launch lock); a resume also finds no train.py
    of the run still writing it (LockError, exit 2)."""
    held = DirLock(run_dir, run_id, "run directory", LAUNCH_LOCK).acquire()
    if resuming:
        try:
            check_free(run_dir, launch=False)
        except LockError:
            held.release()
            raise
    return held
