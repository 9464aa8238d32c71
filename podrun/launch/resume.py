"""`podrun resume RUN`: the launch record a run keeps (launch.json: its own podrun launch arguments and working
directory, secrets redacted) and the arguments that launch it again into the same run directory: a record is run
only when it is this user's own (podrun.safefs.read_trusted), and always into RUN's own directory."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping

from podrun.errors import LaunchError
from podrun.redaction import REDACTED, redact_argv
from podrun.rundir.layout import DEFAULT_RUNS_DIR, LAUNCH as LAUNCH_RECORD, check_run_id
from podrun.rundir.lock import check_free
from podrun.safefs import check_dir, read_trusted


def record(argv: list[str], cwd: str) -> dict:
    """What launch.json holds: the arguments as given to `podrun launch` (secrets redacted), where it ran."""
    shown = redact_argv(argv)
    return {"argv": shown, "cwd": cwd, "redacted": [i for i, (a, b) in enumerate(zip(argv, shown)) if a != b]}


RECORD_LIMIT = 1 << 20                      # bytes of launch.json read at most


def find_run(run: str, runs_dir: str | None) -> Path:
    """The run directory of RUN: a run id, looked up under ``runs_dir`` (default: runs) and nowhere else; or a path
    to one (it holds a /), which must be a directory of this user that no one else may write."""
    if os.sep in run:
        return check_dir(os.path.abspath(run), "run directory", shared_read=True, error=LaunchError,
                         hint="resume a run directory of your own, or pass its run id with --runs-dir")
    return Path(runs_dir if runs_dir is not None else DEFAULT_RUNS_DIR) / check_run_id(run, "RUN")


def _earlier(run_dir: Path) -> dict:
    """launch.json, read only when this user (or root) alone can have written it (podrun.safefs.read_trusted)."""
    path = run_dir / LAUNCH_RECORD
    try:
        data = json.loads(read_trusted(path, "launch record", limit=RECORD_LIMIT, error=LaunchError))
    except FileNotFoundError:
        raise LaunchError(f"{run_dir}: no {LAUNCH_RECORD}: not a run `podrun launch` started (or started before "
                          "launches were recorded), so there is no command to run again",
                          hint="pass the run id or directory of a run podrun launch started") from None
    except (OSError, ValueError) as exc:
        raise LaunchError(f"{path}: unreadable ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("argv"), list) or not isinstance(data.get("cwd"), str):
        raise LaunchError(f"{path}: not a launch record (argv, cwd)")
    return data


def without_run_dir(argv: list[str], takes: Mapping[str, tuple[bool, bool]]) -> list[str]:
    """``argv`` (podrun launch's arguments) without the options that name a run directory (--run-id, --runs-dir,
    --resume, --log-dir, in every spelling: ``--runs-dir X``, ``--runs-dir=X``, ``--log_dir X``), looked for only
    where podrun's own options are: up to the target (the first argument that is no option, or --). ``takes``:
    each spelling of podrun launch's options -> (it names the run directory, it takes a value), from the CLI."""
    out, i = [], 0
    while i < len(argv) and argv[i] != "--" and argv[i].startswith("-"):
        name, eq, _ = argv[i].partition("=")
        drop, value = takes.get(name, (False, False))
        n = 2 if value and not eq else 1
        if not drop:
            out += argv[i:i + n]
        i += n
    return out + argv[i:]


def relaunch(run: str, runs_dir: str | None,
             takes: Mapping[str, tuple[bool, bool]]) -> tuple[list[str], str, Path]:
    """(the `podrun launch` arguments that run RUN again into its own directory, the directory to run them in,
    the run directory); ``takes`` as for ``without_run_dir``. Refused (exit 2) while another process holds the run, when it has no launch record,
    or when a redacted secret of its arguments cannot be filled in from this environment."""
    run_dir = find_run(run, runs_dir)
    if not run_dir.is_dir():
        raise LaunchError(f"{run_dir}: no such run directory", hint="pass a run id (under --runs-dir) or a run directory")
    check_free(run_dir)
    data = _earlier(run_dir)
    argv = [str(a) for a in data["argv"]]
    missing = []
    for i in data.get("redacted") or []:
        if not isinstance(i, int) or not 0 <= i < len(argv):
            continue
        name, sep, value = argv[i].partition("=")
        if sep and value == REDACTED and name.isidentifier() and name in os.environ:
            argv[i] = f"{name}={os.environ[name]}"
        else:
            missing.append(argv[i])
    if missing:
        raise LaunchError(f"{run_dir / LAUNCH_RECORD}: the run's arguments held secrets that were not recorded "
                          f"({', '.join(missing)})",
                          hint="export each NAME=<redacted> variable's value in this shell, then resume")
    argv = [a for a in without_run_dir(argv, takes) if a != "--no-resume"]    # it continues from the newest good state
    runs = str(run_dir.resolve().parent)
    return ["--run-id", run_dir.name, "--runs-dir", runs, *argv], data["cwd"], run_dir
