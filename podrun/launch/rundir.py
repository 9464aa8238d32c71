"""The run directory runs/<run-id>/ (plan.json, command, env.json, instance-<i>.log, summary.json): its
name, its creation (private: 0700, files 0600) and what is written into it."""
from __future__ import annotations

import json
import os
import re
import secrets
import time
from pathlib import Path

from podrun.errors import LaunchError
from podrun.launch.request import LaunchRequest, redact

RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# files a launch writes: finding one means the run id was used by an earlier launch
LAUNCH_FILES = ("command", "env.json", "summary.json", "instance-0.log")
DIR_MODE = 0o700
FILE_MODE = 0o600


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def check_run_id(run_id: str) -> str:
    """``run_id`` if it is a plain directory name (no path, no ``..``); else a LaunchError."""
    if not RUN_ID_RE.match(run_id) or run_id in (".", ".."):
        raise LaunchError(f"--run-id {run_id!r} is not a plain name: it must stay a directory inside --runs-dir",
                          hint="use letters, digits, '.', '_' and '-' (starting with a letter or digit), "
                               "at most 128 characters")
    return run_id


def private_open(path, flags):
    """An ``opener`` for open(): files of the run directory are readable by their owner only."""
    return os.open(path, flags, FILE_MODE)


def _cannot(what: str, path, exc: OSError) -> LaunchError:
    return LaunchError(f"cannot {what} {path}: {exc.strerror or exc}",
                       hint="pass --runs-dir with a writable directory (is the disk full or read-only?)")


def create_run_dir(run_dir: str | Path, reuse: bool = False) -> Path:
    """Make the run directory (0700), refusing one an earlier launch wrote: a reused run id would append to
    its logs and overwrite its summary. A directory `podrun submit` prepared (job.sh, plan.json) is fine, and
    so is an earlier launch's under ``reuse`` (`podrun resume`)."""
    d = Path(run_dir)
    used = [f for f in LAUNCH_FILES if (d / f).exists()]
    if used and not reuse:
        raise LaunchError(f"run id {d.name!r} is taken: {d} holds an earlier run ({', '.join(used)})",
                          hint="pass another --run-id, or leave it out for a fresh one")
    try:
        d.parent.mkdir(parents=True, exist_ok=True)
        d.mkdir(mode=DIR_MODE, exist_ok=True)
        os.chmod(d, DIR_MODE)
    except OSError as exc:
        raise _cannot("create the run directory", d, exc) from None
    return d


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        with open(tmp, "w", opener=private_open) as f:
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
    d.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
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


def write_launch_files(request: LaunchRequest, described: list[tuple[str, str]]) -> None:
    """command and env.json for this attempt (rewritten on each restart)."""
    d = Path(request.run_dir)
    lines = [f"# podrun run {request.run_id} (transport {request.transport}, restart {request.restart_count})"]
    lines += [f"# {host}\n{cmd}" for host, cmd in described]
    _write_text(d / "command", "\n".join(lines) + "\n")
    _write_json(d / "env.json", env_record(request))


def write_summary(run_dir: str | Path, summary: dict) -> Path:
    p = Path(run_dir) / "summary.json"
    _write_json(p, summary)
    return p
