"""File-system trust, the one home: every file and directory podrun creates, writes or trusts is made here, exclusively
and privately, never through a symbolic link, and checked for owner and mode before use (OpenSSH's StrictModes rule).
Stdlib only (a worker's sitecustomize imports it)."""
from __future__ import annotations

import contextlib
import errno
import itertools
import os
import stat
from pathlib import Path

from podrun.errors import PodrunError

DIR_MODE = 0o700
FILE_MODE = 0o600
RECORD_LIMIT = 64 << 20        # the largest record podrun reads back (a plan of thousands of hosts is a few MB)
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePath(PodrunError):
    """A path podrun may not create, write or trust: named with its owner and mode, and what to do (exit 2)."""


def owner_name(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def _mode(st: os.stat_result) -> str:
    return f"{stat.S_IMODE(st.st_mode):04o}"


# -- checks: why a path may not be used (None: it may) --------------------------------------------------------

def dir_problem(path, *, shared_read: bool = False, root_ok: bool = False, sticky_ok: bool = False) -> str | None:
    """Why ``path`` may not hold podrun's files (None: it may): a real directory (lstat: not a symbolic link),
    owned by this user (or by root with ``root_ok``), that neither group nor others may write (nor, without
    ``shared_read``, read or enter: 0700); with ``sticky_ok`` any directory with the sticky bit (/tmp: there no
    one renames or removes what is not theirs)."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot check {path}: {exc.strerror or exc}"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link (owner {owner_name(st.st_uid)}), not a directory"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory (owner {owner_name(st.st_uid)})"
    if sticky_ok and st.st_mode & stat.S_ISVTX:
        return None
    return _owner_mode_problem(st, path, root_ok, shared_read, "write into it")


def _owner_mode_problem(st: os.stat_result, path, root_ok: bool, shared_read: bool, written: str) -> str | None:
    """Why ``path`` (its stat) is not this user's (nor, with ``root_ok``, root's) with no group or other write (nor,
    without ``shared_read``, read); ``written``: what others may do to it when they may write it."""
    me = os.geteuid()
    if st.st_uid != me and not (root_ok and st.st_uid == 0):
        return f"{path} belongs to {owner_name(st.st_uid)}, not to you ({owner_name(me)})"
    if st.st_mode & (0o022 if shared_read else 0o077):
        return (f"{path} (owner {owner_name(st.st_uid)}) is mode {_mode(st)}: "
                + (f"others may {written}" if st.st_mode & 0o022 else "others may read it"))
    return None


def ancestor_problem(path) -> str | None:
    """Why another user could swap a directory on the way to ``path`` (None: no one but this user and root can): a
    symbolic link of another user, a directory of another user, or one that others may write without the sticky
    bit (/tmp has it: there no one renames what is not theirs)."""
    me = os.geteuid()
    cur = "/"
    for part in Path(os.path.abspath(path)).parts[1:]:
        cur = os.path.join(cur, part)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return f"cannot check {cur}: {exc.strerror or exc}"
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in (0, me):
                return f"{cur} is a symbolic link of {owner_name(st.st_uid)}"
            problem = ancestor_problem(os.path.realpath(cur))
            if problem is not None:
                return problem
            continue
        if not stat.S_ISDIR(st.st_mode):
            return None                  # not a directory: what is made below it fails, and says so
        if st.st_uid not in (0, me):
            return f"{cur} belongs to {owner_name(st.st_uid)} (mode {_mode(st)})"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return f"{cur} (owner {owner_name(st.st_uid)}) may be written by others (mode {_mode(st)})"
    return None


def file_problem(st: os.stat_result, path, *, shared_read: bool = True) -> str | None:
    """Why the file ``path`` (its fstat) may not be trusted: not a regular file, another user's (root's is
    trusted), or writable by group or others (without ``shared_read``: readable by them)."""
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    return _owner_mode_problem(st, path, True, shared_read, "change it")


def _refuse(problem: str, what: str, error: type[PodrunError], hint: str | None) -> PodrunError:
    return error(f"refusing the {what}: {problem}",
                 hint=hint or "podrun uses only files and directories of your own that no one else may change "
                              "(like OpenSSH's StrictModes): `chmod go-w` it, or name a private directory")


def _check(problem: str | None, what: str, error: type[PodrunError], hint: str | None = None) -> None:
    """Nothing when there is no ``problem``; else the refusal that names it (_refuse), raised."""
    if problem is not None:
        raise _refuse(problem, what, error, hint)


def check_dir(path, what: str, *, shared_read: bool = False, root_ok: bool = False,
              error: type[PodrunError] = UnsafePath, hint: str | None = None) -> Path:
    """``path`` when dir_problem finds nothing; else ``error`` (exit 2) naming it, its owner and mode, and the fix."""
    _check(dir_problem(path, shared_read=shared_read, root_ok=root_ok), what, error, hint)
    return Path(path)


# -- directories ------------------------------------------------------------------------------------------------

def make_dir(path, what: str, *, shared_read: bool = False, mode: int | None = None,
             error: type[PodrunError] = UnsafePath, hint: str | None = None) -> Path:
    """``path`` as a directory of this user: made exclusively (``mode``: 0700, or 0755 with ``shared_read``) when
    missing, or an existing one accepted only after check_dir (``shared_read``: others may read it). Its parent
    must exist."""
    try:
        os.mkdir(path, mode if mode is not None else 0o755 if shared_read else DIR_MODE)
    except FileExistsError:
        pass
    except OSError as exc:
        raise error(f"cannot create the {what} {path}: {exc.strerror or exc}",
                    hint="name a directory whose parent exists and is yours to write (is the disk full or "
                         "read-only?)") from None
    return check_dir(path, what, shared_read=shared_read, error=error, hint=hint)


def make_dirs(path, what: str, *, shared_read: bool = False, mode: int | None = None,
              error: type[PodrunError] = UnsafePath, hint: str | None = None) -> Path:
    """``path`` and the missing directories on the way: no other user can swap a directory on the way
    (ancestor_problem); each directory made here is this user's, checked right after (shared_read: 0755)."""
    d = Path(os.path.abspath(path))
    _check(ancestor_problem(d.parent), f"{what} {d}", error, "put it where only you (and root) can change the path: "
                                                            "your home, or a directory of yours in /tmp")
    missing = list(itertools.takewhile(lambda p: not os.path.lexists(p), [d, *d.parents]))    # d first
    for p in reversed(missing[1:]):
        make_dir(p, what, shared_read=True, error=error, hint=hint)
    return make_dir(d, what, shared_read=shared_read, mode=mode, error=error, hint=hint)


def own_dir(path, what: str, *, error: type[PodrunError] = UnsafePath, hint: str | None = None) -> Path:
    """``path`` as a directory only this user may write: a missing one made 0700 (and its missing parents, 0755),
    an existing one accepted only when it is a real directory of this user that neither group nor others may write
    (reading is theirs to allow), with no directory on the way that another user could swap."""
    return make_dirs(path, what, shared_read=True, mode=DIR_MODE, error=error, hint=hint)


def make_temp_dir(prefix: str, parent: str | None = None) -> str:
    """A new private directory (0700) with a random name under ``parent`` (the temp dir by default)."""
    import tempfile

    parent = parent or tempfile.gettempdir()
    for _ in range(100):
        path = os.path.join(parent, prefix + os.urandom(6).hex())
        try:
            os.mkdir(path, DIR_MODE)
        except FileExistsError:
            continue
        check_dir(path, "temporary directory")
        return path
    raise UnsafePath(f"cannot make a temporary directory in {parent}: every name tried was taken")


# -- writing ----------------------------------------------------------------------------------------------------

def _target_problem(path) -> str | None:
    """Why a file may not be put at ``path``: a symbolic link, not a regular file, or another user's file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot check {path}: {exc.strerror or exc}"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link (owner {owner_name(st.st_uid)}); podrun writes through none"
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    if st.st_uid != os.geteuid():
        return f"{path} belongs to {owner_name(st.st_uid)}, not to you ({owner_name(os.geteuid())})"
    return None


@contextlib.contextmanager
def replacing(path, what: str, *, mode: int = FILE_MODE, error: type[PodrunError] = UnsafePath, durable: bool = True):
    """A binary file object whose bytes become ``path`` whole when the block ends: written into a new file with a
    random name beside it (O_CREAT|O_EXCL|O_NOFOLLOW, ``mode`` from the start), flushed to disk, then renamed over
    ``path``. Refused (``error``, nothing written): a directory others may write (without the sticky bit), or a
    symbolic link, a non-regular file or another user's file at ``path``. On an exception the new file is removed."""
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    _check(dir_problem(d, shared_read=True, root_ok=True, sticky_ok=True) or _target_problem(path), what, error)
    tmp = os.path.join(d, f".{os.path.basename(path)}.tmp-{os.urandom(6).hex()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, mode)
    except OSError as exc:
        raise error(f"cannot write the {what} {path}: {exc.strerror or exc}",
                    hint="is the disk full or read-only?") from None
    try:
        with os.fdopen(fd, "wb") as f:
            if stat.S_IMODE(os.fstat(f.fileno()).st_mode) != mode:     # a umask took bits away
                os.fchmod(f.fileno(), mode)
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        with contextlib.suppress(OSError):
            dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)


def write_file(path, data: bytes | str, what: str, *, mode: int = FILE_MODE, error: type[PodrunError] = UnsafePath,
               durable: bool = True) -> Path:
    """``data`` as the file ``path``, written whole (see replacing)."""
    with replacing(path, what, mode=mode, error=error, durable=durable) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


def create_whole(path, data: bytes, what: str, *, error: type[PodrunError] = UnsafePath) -> bool:
    """``data`` as the new file ``path`` (FILE_MODE) in a directory the caller checked, whole or not at all: written
    into a new file with a random name beside it, then linked to ``path``, which must not exist (nothing, not even a
    link, is replaced); True when made, False when ``path`` was there already (another process made it first)."""
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(d, f".{os.path.basename(path)}.tmp-{os.urandom(6).hex()}")
    try:
        with os.fdopen(create_new(tmp), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path, follow_symlinks=False)
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        raise error(f"cannot write the {what} {path}: {exc.strerror or exc}",
                    hint="is the disk full or read-only?") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def create_new(path, *, mode: int = FILE_MODE, append: bool = False) -> int:
    """A descriptor of a new file ``path`` (O_CREAT|O_EXCL|O_NOFOLLOW, ``mode``): nothing, not even a link, may
    stand in its place (FileExistsError). For files whose directory the caller made private."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | (os.O_APPEND if append else 0), mode)


def open_private(path, *, append: bool = True, read: bool = False) -> int:
    """A descriptor to write (append, or read and write) the file ``path`` of this user, made 0600 when missing: never
    a link (O_NOFOLLOW), and an existing file is refused (UnsafePath) unless it is a regular file of this user that
    no one else may read or write. For logs, locks and slots in a private directory."""
    flags = (os.O_RDWR if read else os.O_WRONLY) | os.O_CREAT | (os.O_APPEND if append else 0)
    return _open_checked(path, flags, "file", UnsafePath, shared_read=False)[0]   # root's 0600 file: only root's


def _open_checked(path, flags: int, what: str, error: type[PodrunError], *, shared_read: bool):
    """(a descriptor of ``path`` opened with ``flags`` and O_NOFOLLOW, its fstat) when file_problem finds nothing
    in the file opened; else ``error`` naming it (a symbolic link at ``path`` included), nothing left open."""
    try:
        fd = os.open(path, flags | _NOFOLLOW, FILE_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(f"{path} is a symbolic link", what, error, None) from None
        raise
    try:
        st = os.fstat(fd)
        _check(file_problem(st, path, shared_read=shared_read), what, error)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def open_log(path, *, buffering: int = 1):
    """A text file appending to the private log ``path`` (open_private)."""
    return os.fdopen(open_private(path), "a", buffering=buffering, encoding="utf-8", errors="replace")


def rename(src, dst) -> None:
    """Rename ``src`` to ``dst`` within a directory of this user (a link at ``dst`` is replaced, never followed)."""
    os.replace(src, dst)


def set_mode(path, mode: int) -> None:
    """chmod ``path`` itself; a link there is refused (UnsafePath), never followed."""
    if stat.S_ISLNK(os.lstat(path).st_mode):
        raise _refuse(f"{path} is a symbolic link", "path", UnsafePath, None)
    os.chmod(path, mode, follow_symlinks=False)


def write_kernel(path: str, text: str) -> None:
    """Write ``text`` into a kernel interface file (/proc, /sys): nothing is created there."""
    if not (path.startswith("/proc/") or path.startswith("/sys/")):
        raise ValueError(f"{path} is not a kernel interface file")
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


# -- reading ----------------------------------------------------------------------------------------------------

def _read_fd(fd: int, label: str, limit: int, error: type[PodrunError]) -> bytes:
    """At most ``limit`` bytes of ``fd``; ``error`` (the caller's too-large error) when it holds more."""
    chunks, size = [], 0
    while True:
        b = os.read(fd, min(1 << 20, limit + 1 - size))
        if not b:
            return b"".join(chunks)
        chunks.append(b)
        size += len(b)
        if size > limit:
            raise error(f"{label}: larger than {limit} bytes; not the kind of file asked for")


def read_user_file(path, what: str, *, limit: int, error: type[PodrunError] = UnsafePath,
                   too_large: type[PodrunError] | None = None, label: str | None = None) -> bytes:
    """The bytes of a file the user named (hostfile, ssh config, calibration, recipe, cluster spec): a regular file
    only (a FIFO or a device is refused, never waited on), at most ``limit`` bytes; links are followed (the user
    named the path). Errors start with ``label`` (default: ``what`` and the path); a file over ``limit`` is
    ``too_large`` (default ``error``), so a caller can say it in its own words."""
    label = f"{what} {path}" if label is None else label
    too_large = error if too_large is None else too_large
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError) as exc:
        raise error(f"{label}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode)
                    or stat.S_ISBLK(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) else "not a file")
            raise error(f"{label}: is {kind}, not a regular file")
        if st.st_size > limit:
            raise too_large(f"{label}: larger than {limit} bytes ({st.st_size}); not the kind of file asked for")
        try:
            return _read_fd(fd, label, limit, too_large)
        except OSError as exc:
            raise error(f"{label}: cannot read it ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def _trusted_dir_problem(path, shared_dir: bool) -> str | None:
    """Why the directory of ``path`` cannot vouch for a file in it: one on the way another user could swap, or its own
    not a real directory of this user or root that only they may write (nor, without ``shared_dir``, read)."""
    d = os.path.dirname(os.path.abspath(os.fspath(path)))
    return ancestor_problem(d) or dir_problem(d, shared_read=shared_dir, root_ok=True)


def read_trusted(path, what: str, *, limit: int, error: type[PodrunError] = UnsafePath,
                 shared_dir: bool = True, private: bool = False) -> bytes:
    """The bytes of a file that decides what podrun does (launch.json, plan.json, a checkpoint, a calibration, a
    snapshot, control.pid), read only when no one but this user (and root) can have written it: its directory and
    every one on the way pass the checks (its own directory a real one of this user or root, no group/other write;
    with ``shared_dir`` False not readable by others either), and the file is a regular file of this user or root,
    not a link (O_NOFOLLOW), writable by no one else (with ``private``: readable by no one else either, as a
    key), at most ``limit`` bytes."""
    path = os.fspath(path)
    _check(_trusted_dir_problem(path, shared_dir), what, error)
    fd, st = _open_checked(path, os.O_RDONLY | os.O_NONBLOCK, what, error, shared_read=not private)
    try:
        if st.st_size > limit:
            raise error(f"{what} {path}: larger than {limit} bytes ({st.st_size})")
        return _read_fd(fd, f"{what} {path}", limit, error)
    finally:
        os.close(fd)


def input_problem(path) -> str | None:
    """Why a folder or file that decides what runs (a recipe's folder, its recipe.yaml and train script, a cluster
    spec) may not be trusted (None: it may), reading nothing: one on the way another user could swap
    (ancestor_problem), or the path itself a symbolic link, another user's (root's is trusted), or one that group or
    others may write: git's safe.directory rule, with OpenSSH's StrictModes on the mode. Named with its owner and
    mode."""
    path = os.path.abspath(os.fspath(path))
    problem = ancestor_problem(os.path.dirname(path))
    if problem is not None:
        return problem
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot check {path}: {exc.strerror or exc}"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link (owner {owner_name(st.st_uid)})"
    foreign = st.st_uid not in (0, os.geteuid())
    if foreign or st.st_mode & 0o022:
        return (f"{path} belongs to {owner_name(st.st_uid)}{', not to you' if foreign else ''}, mode {_mode(st)}"
                + (": others may change it" if st.st_mode & 0o022 else ""))
    return None


def check_input(path, what: str, *, error: type[PodrunError] = UnsafePath, hint: str | None = None) -> Path:
    """``path`` when input_problem finds nothing; else ``error`` (exit 2) naming it, its owner and mode."""
    _check(input_problem(path), what, error, hint)
    return Path(path)


def trusted_problem(path) -> str | None:
    """Why read_trusted would refuse ``path`` (None: it would read it), reading nothing."""
    problem = _trusted_dir_problem(path, True)
    if problem is not None:
        return problem
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot check {path}: {exc.strerror or exc}"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    return file_problem(st, path)

