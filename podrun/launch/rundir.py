"""The run directory runs/<run-id>/ (plan.json, command, env.json, instance-<i>.log, summary.json): its
name, its creation (private: 0700, files 0600, each directory checked with lstat: a real directory of this
user that no one else may write) and what is written into it (records redacted by podrun.redaction)."""
from __future__ import annotations

import json
import os
import re
import secrets
import stat
import time
from pathlib import Path

from podrun.errors import LaunchError
from podrun.launch.request import LaunchRequest
from podrun.redaction import redact, redact_record

DEFAULT_RUNS_DIR = "runs"      # where run directories go without --runs-dir
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# files a launch writes: finding one means the run id was used by an earlier launch
LAUNCH_FILES = ("command", "env.json", "summary.json", "instance-0.log")
# directories the run's processes write into (stacks, torch's error files, the zygotes' sockets): when a
# prepared run directory has one already, it must be private as the run directory is
RUN_SUBDIRS = ("stacks", "errors", "zygote")
DIR_MODE = 0o700
FILE_MODE = 0o600


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def check_run_id(run_id: str, what: str = "--run-id") -> str:
    """``run_id`` if it is a plain directory name (no path, no ``..``); else a LaunchError naming ``what``."""
    if not RUN_ID_RE.fullmatch(run_id) or run_id in (".", ".."):
        shown = repr(run_id) if len(run_id) <= 60 else repr(run_id[:57]) + f"... ({len(run_id)} characters)"
        raise LaunchError(f"{what} {shown} is not a plain name: it must stay a directory inside --runs-dir",
                          hint="use letters, digits, '.', '_' and '-' (starting with a letter or digit), "
                               "at most 128 characters")
    return run_id


def private_open(path, flags):
    """An ``opener`` for open(): files of the run directory are readable by their owner only, and a symbolic
    link put in a file's place is not followed (O_NOFOLLOW: the open fails)."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)


def new_private_open(path, flags):
    """An ``opener`` for a file that must be new (O_EXCL): nothing, not even a link, may stand in its place."""
    return os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)


def _owner(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def dir_problem(path, *, shared_read: bool = False) -> str | None:
    """Why ``path`` may not hold podrun's files (None: it may): it must be a real directory (lstat: not a
    symbolic link), owned by this user, that neither group nor others may write (``shared_read`` False: nor
    read or enter, 0700)."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot check {path}: {exc.strerror or exc}"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link (owner {_owner(st.st_uid)}), not a directory"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory (owner {_owner(st.st_uid)})"
    if st.st_uid != os.geteuid():
        return f"{path} belongs to {_owner(st.st_uid)}, not to you ({_owner(os.geteuid())})"
    bad = 0o022 if shared_read else 0o077
    if st.st_mode & bad:
        return (f"{path} (owner {_owner(st.st_uid)}) is mode {stat.S_IMODE(st.st_mode):04o}: "
                + ("others may write into it" if st.st_mode & 0o022 else "others may read it"))
    return None


def check_dir(path, what: str, *, shared_read: bool = False) -> None:
    """A LaunchError (exit 2) naming ``path`` and its owner when dir_problem finds one."""
    problem = dir_problem(path, shared_read=shared_read)
    if problem is not None:
        raise LaunchError(f"refusing the {what}: {problem}",
                          hint="podrun writes a run only into directories of your own that no one else may write; "
                               "pass another --runs-dir or --run-id, or remove that one")


def private_subdir(parent, name: str, what: str) -> Path:
    """``parent/name`` as a private directory of this user (made 0700 when missing, checked with lstat)."""
    d = Path(parent) / name
    try:
        os.mkdir(d, DIR_MODE)
    except FileExistsError:
        pass
    check_dir(d, what)
    return d


def ancestor_problem(path) -> str | None:
    """Why another user could swap a directory on the way to ``path`` (None: no one but this user and root can):
    a symbolic link of another user, or a directory of another user, or one that others may write without the
    sticky bit (/tmp has it: there others cannot rename what is not theirs)."""
    me = os.geteuid()
    cur = "/"
    for part in Path(path).parts[1:]:
        cur = os.path.join(cur, part)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return f"cannot check {cur}: {exc.strerror or exc}"
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in (0, me):
                return f"{cur} is a symbolic link of {_owner(st.st_uid)}"
            problem = ancestor_problem(os.path.realpath(cur))
            if problem is not None:
                return problem
            continue
        if not stat.S_ISDIR(st.st_mode):
            return None                  # not a directory: making the runs dir below it fails, and says so
        if st.st_uid not in (0, me):
            return f"{cur} belongs to {_owner(st.st_uid)}"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return f"{cur} (owner {_owner(st.st_uid)}) may be written by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def make_runs_dir(runs_dir) -> Path:
    """--runs-dir: no other user can swap a directory on the way (ancestor_problem); each directory podrun makes
    on the way is made by this user and checked (lstat) right after; the runs dir itself (made or found) must be
    this user's, a real directory no one else may write (others may read it)."""
    d = Path(os.path.abspath(runs_dir))
    problem = ancestor_problem(d.parent)
    if problem is not None:
        raise LaunchError(f"refusing the --runs-dir {d}: {problem}",
                          hint="put the runs where only you (and root) can change the path: your home, or a "
                               "directory of yours in /tmp")
    missing = []
    p = d
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    for p in reversed(missing):
        try:
            os.mkdir(p, 0o755)
        except FileExistsError:
            pass
        check_dir(p, "--runs-dir", shared_read=True)
    check_dir(d, "--runs-dir", shared_read=True)
    return d


def _cannot(what: str, path, exc: OSError) -> LaunchError:
    return LaunchError(f"cannot {what} {path}: {exc.strerror or exc}",
                       hint="pass --runs-dir with a writable directory (is the disk full or read-only?)")


def create_run_dir(run_dir: str | Path, reuse: bool = False) -> Path:
    """Make the run directory (0700), refusing one an earlier launch wrote: a reused run id would append to
    its logs and overwrite its summary. A directory `podrun submit` prepared (job.sh, plan.json) is fine, and
    so is an earlier launch's under ``reuse`` (`podrun resume`)."""
    d = Path(run_dir)
    try:
        make_runs_dir(d.parent)
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            check_dir(d, "run directory", shared_read=True)     # a directory `podrun submit` prepared
        used = [f for f in LAUNCH_FILES if os.path.lexists(d / f)]
        if used and not reuse:
            raise LaunchError(f"run id {d.name!r} is taken: {d} holds an earlier run ({', '.join(used)})",
                              hint="pass another --run-id, or leave it out for a fresh one")
        os.chmod(d, DIR_MODE, follow_symlinks=False)
        check_dir(d, "run directory")
        for name in RUN_SUBDIRS:
            if os.path.lexists(d / name):
                check_dir(d / name, f"{name} directory of the run")
    except OSError as exc:
        raise _cannot("create the run directory", d, exc) from None
    return d


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        os.unlink(tmp)                       # a write cut short earlier (the directory is this user's own)
    except FileNotFoundError:
        pass
    try:
        with open(tmp, "w", opener=new_private_open) as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _write_json(path: Path, obj) -> None:
    _write_text(path, json.dumps(obj, indent=2, default=str) + "\n")


def write_plan(run_dir: str | Path, plan, name: str = "plan.json") -> Path:
    d = Path(run_dir)
    d.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)     # a launch made and checked it already
    p = d / name
    _write_json(p, plan.to_dict())
    return p


def env_record(request: LaunchRequest) -> dict:
    """What env.json holds: per instance, the --env given to the agent and each worker's variables."""
    return {
        "note": "set on top of each host's environment; secrets redacted by name and by value shape "
                "(see docs/launch.md)",
        "restart_count": request.restart_count,
        "instances": [
            {"index": inst.index, "host": inst.host, "agent_env": redact(dict(request.env)),
             "workers": [redact(e) for e in request.worker_envs(inst.index)]}
            for inst in request.instances
        ],
    }


def write_launch_files(request: LaunchRequest, described: list[tuple[str, str]], env_route: str = "") -> None:
    """command and env.json for this attempt (rewritten on each restart). The command lines hold no --env
    value; ``command`` names the --env and how it reaches the agents (``env_route``), env.json holds it redacted."""
    d = Path(request.run_dir)
    lines = [f"# podrun run {request.run_id} (transport {request.transport}, restart {request.restart_count})"]
    if request.env:
        lines.append(f"# --env {' '.join(request.env_names())}: through {env_route} (redacted in env.json)")
    lines += [f"# {host}\n{cmd}" for host, cmd in described]
    _write_text(d / "command", "\n".join(lines) + "\n")
    _write_json(d / "env.json", env_record(request))


def write_summary(run_dir: str | Path, summary: dict) -> Path:
    """summary.json, redacted (podrun.redaction.redact_record: a worker's error or last lines may hold a secret)."""
    p = Path(run_dir) / "summary.json"
    _write_json(p, redact_record(summary))
    return p
