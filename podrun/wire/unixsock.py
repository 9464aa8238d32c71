"""Private unix sockets in a run directory (the control socket, the zygotes'): long paths, private binding, staleness.

A socket address holds at most 108 bytes, so a socket is bound and reached through ``/proc/self/fd/<fd>/NAME``
with ``fd`` an O_PATH descriptor of its directory (opened with O_NOFOLLOW: the directory itself, never a link
in its place). ``bind`` makes the socket under umask 0177 (0600 from the start) in a directory that must be a
real directory of this user that no one else may write, removes a socket left by a dead process first, and
checks the result with lstat. A socket that refuses connections is stale: no process listens on it.
"""
from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat

from podrun.safefs import dir_problem


@contextlib.contextmanager
def address(path: str):
    """``path`` as a short socket address (through an O_PATH descriptor of its directory, closed after)."""
    fd = os.open(os.path.dirname(path) or ".", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{os.path.basename(path)}"
    finally:
        os.close(fd)


def dir_ok(path: str) -> str | None:
    """Why the directory ``path`` may not hold a private socket (None: it may): lstat says a real directory of
    this user that group and others may not write (podrun.safefs.dir_problem)."""
    return dir_problem(path, shared_read=True)


def socket_ok(path: str) -> bool:
    """Whether ``path`` is a socket of this user that only this user may use (lstat: 0600, no link)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISSOCK(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def stale(path: str) -> bool:
    """Whether ``path`` is a socket file no process listens on (connect refused), or no socket at all."""
    try:
        connect(path, 1.0).close()
    except OSError as exc:
        return exc.errno in (errno.ECONNREFUSED, errno.ENOTSOCK, errno.ENOENT)
    return False


def remove_stale(path: str) -> bool:
    """Remove ``path`` when it is a stale socket of this user (a dead run's); True when it was removed."""
    try:
        st = os.lstat(path)
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid() or not stale(path):
            return False
        os.unlink(path)
    except OSError:
        return False
    return True


def bind(path: str, backlog: int = 64) -> socket.socket:
    """A listening socket at ``path`` (0600), in a directory dir_ok accepts; what was at ``path`` is removed
    first when it is a stale socket; OSError when the directory is not private or something else is there."""
    problem = dir_ok(os.path.dirname(path) or ".")
    if problem is not None:
        raise PermissionError(errno.EPERM, f"not a private directory: {problem}")
    remove_stale(path)
    old = os.umask(0o177)
    try:
        s = _open(path, listen=True)
    finally:
        os.umask(old)
    if not socket_ok(path):
        s.close()
        raise PermissionError(errno.EPERM, f"{path}: the socket is not private after binding")
    s.listen(backlog)
    return s


def connect(path: str, timeout: float) -> socket.socket:
    """A connection to the socket at ``path``; OSError when no one listens there."""
    return _open(path, listen=False, timeout=timeout)


def _open(path: str, listen: bool, timeout: float | None = None) -> socket.socket:
    """A unix stream socket bound (``listen``) or connected at ``path``, closed again when that fails."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        with address(path) as addr:
            (s.bind if listen else s.connect)(addr)
    except OSError:
        s.close()
        raise
    return s
