"""The run directory runs/<run-id>/ (plan.json, command, env.json, instance-<i>.log, summary.json): its
name, its creation (private: 0700, files 0600, each directory checked with lstat: a real directory of this
user that no one else may write) and what is written into it (records redacted by podrun.redaction)."""
from __future__ import annotations

import json
import os
import re
import secrets
import time
from pathlib import Path

from podrun import safefs
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
_HINT = ("podrun writes a run only into directories of your own that no one else may write; pass another "
         "--runs-dir or --run-id, or remove that one")


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


def check_dir(path, what: str, *, shared_read: bool = False) -> None:
    """A LaunchError (exit 2) naming ``path``, its owner and mode when safefs.dir_problem finds one."""
    safefs.check_dir(path, what, shared_read=shared_read, error=LaunchError, hint=_HINT)


def private_subdir(parent, name: str, what: str) -> Path:
    """``parent/name`` as a private directory of this user (made 0700 when missing, checked with lstat)."""
    return safefs.make_dir(Path(parent) / name, what, error=LaunchError, hint=_HINT)


def make_runs_dir(runs_dir) -> Path:
    """--runs-dir: no other user can swap a directory on the way; each directory podrun makes on the way is this
    user's, checked right after; the runs dir itself (made or found) must be this user's, a real directory no one
    else may write (others may read it)."""
    return safefs.make_dirs(runs_dir, "--runs-dir", shared_read=True, error=LaunchError, hint=_HINT)


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
        safefs.make_dir(d, "run directory", shared_read=True, mode=safefs.DIR_MODE, error=LaunchError,
                        hint=_HINT)             # or one `podrun submit` prepared
        used = [f for f in LAUNCH_FILES if os.path.lexists(d / f)]
        if used and not reuse:
            raise LaunchError(f"run id {d.name!r} is taken: {d} holds an earlier run ({', '.join(used)})",
                              hint="pass another --run-id, or leave it out for a fresh one")
        safefs.set_mode(d, safefs.DIR_MODE)
        check_dir(d, "run directory")
        for name in RUN_SUBDIRS:
            if os.path.lexists(d / name):
                check_dir(d / name, f"{name} directory of the run")
    except OSError as exc:
        raise _cannot("create the run directory", d, exc) from None
    return d


def _write_text(path: Path, text: str) -> None:
    """A record of the run directory, written whole and private (safefs.write_file)."""
    safefs.write_file(path, text, "run record", error=LaunchError, durable=False)


def _write_json(path: Path, obj) -> None:
    _write_text(path, json.dumps(obj, indent=2, default=str) + "\n")


def write_plan(run_dir: str | Path, plan, name: str = "plan.json") -> Path:
    d = safefs.make_dirs(run_dir, "run directory", error=LaunchError, hint=_HINT)   # a launch made it already
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

