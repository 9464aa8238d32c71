"""The run directory runs/<run-id>/: the one place its file names and the snapshot places are defined, its
creation (private: 0700, files 0600, each directory checked with lstat: a real directory of this user that no one
else may write) and the records written into it whole (redacted by podrun.redaction). Stdlib and safefs only: the
controller (launch/), the agent (host/), the workers (runtime/, train/) and wire/ all take the names from here."""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from podrun import safefs
from podrun.errors import LaunchError
from podrun.redaction import redact_record

# the files of runs/<id>/ and who writes them
PLAN = "plan.json"                 # the run's plan (launch, submit); an elastic run's n-th as plan-<n>.json
LAUNCH = "launch.json"             # podrun launch's own arguments, for podrun resume
COMMAND = "command"                # each host's command line of the attempt
ENV = "env.json"                   # the --env and the workers' variables, redacted
SUMMARY = "summary.json"           # the outcome: attempts, exit codes, root cause (podrun.launch.outcome)
METRICS = "metrics.jsonl"          # the training's records (podrun.rundir.metrics)
CONFIG = "config.json"             # the training's configuration (podrun.train.config)
TRAIN_SUMMARY = "train_summary.json"   # the training's end: steps, accuracy, seconds (rank 0)
REPORT = "report.png"              # podrun report's curves
PROMETHEUS_TARGETS = "prometheus-targets.json"   # --metrics-port's file_sd target file (podrun.live.prom)
TENSORBOARD = "tensorboard"        # --tensorboard's event files (podrun.live.tensorboard)
JOB_SCRIPT = "job.sh"              # podrun submit's job script
MPIRUN_TMP = "mpirun-tmp"          # the base of Open MPI 5's session directory for the controller's mpirun
CHECKPOINTS = "checkpoints"        # the training's checkpoints, without --checkpoint-dir
STACKS = "stacks"                  # every thread's stack, per rank (podrun stack, a hang)
ERRORS = "errors"                  # torch's error files, per worker
ZYGOTE = "zygote"                  # the zygotes' sockets; removing it ends every zygote of the run
STACKS_REQUEST = "stacks-request"  # a new token in it: agents without a stdin watch dump their workers' stacks
STOP_REQUEST = "stop-request"      # a new token and a signal name: such agents end their workers with it
CONTROL_SOCKET = "control.sock"    # the controller's control socket (podrun stack)
CONTROL_PID = "control.pid"        # "<boot id> <pid> <start>" of the controller listening on CONTROL_SOCKET
WRITER_LOCK = ".podrun-writer.lock"     # held by the process writing a run dir's metrics or a checkpoint dir
LAUNCH_LOCK = ".podrun-launch.lock"     # held by the controller of a launch (and of a resume) of a run


def instance_log(index: int) -> str:
    """Instance ``index``'s output, as it comes."""
    return f"instance-{index}.log"


def rank_log(restart: int, rank: int, stream: str) -> str:
    """A worker's stream (``out`` or ``err``) under torchrun's --redirects/--tee: attempt_<N>/<rank>/stdout.log, as
    torchrun lays out its log dir (its <rank> is the local rank of one node's agent; here the global rank)."""
    return f"attempt_{restart}/{rank}/{'stdout' if stream == 'out' else 'stderr'}.log"


def plan_of(restart: int) -> str:
    """The plan an elastic run's attempt ``restart`` ran (plan.json is always the newest)."""
    return f"plan-{restart}.json"


# Where a host's in-memory snapshots of the training state live (podrun.runtime.snapshot): shared memory,
# one directory per run and host, so that hosts sharing one file system (namespaces, one machine) keep apart
SNAPSHOT_ROOT = "/dev/shm"


def snapshot_dir(run_id: str, host: str, key: str) -> str:
    """PODRUN_SNAPSHOT_DIR of the workers on ``host``: keyed by the host, not the instance index (an index moves
    to another host after a re-plan; the snapshots stay where they were written). The run's directory carries a
    tag derived from the run's key, so another user cannot name it in advance."""
    import hashlib   # here, as secrets below: an agent imports this module for its names alone
    import hmac

    tag = hmac.new(key.encode(), b"podrun snapshot directory\0" + run_id.encode(), hashlib.sha256).hexdigest()[:32]
    return os.path.join(SNAPSHOT_ROOT, f"podrun-{run_id}-{tag}", host)


DEFAULT_RUNS_DIR = "runs"      # where run directories go without --runs-dir
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# files a launch writes: finding one means the run id was used by an earlier launch
LAUNCH_FILES = (COMMAND, ENV, SUMMARY, instance_log(0))
# directories the run's processes write into (stacks, torch's error files, the zygotes' sockets): when a
# prepared run directory has one already, it must be private as the run directory is
RUN_SUBDIRS = (STACKS, ERRORS, ZYGOTE)
# the parts of a step split, as a rank's progress line and summary.json's step_split carry them
SPLIT_PARTS = ("input", "compute", "comm", "optim")
_HINT = ("podrun writes a run only into directories of your own that no one else may write; pass another "
         "--runs-dir or --run-id, or remove that one")


def new_run_id() -> str:
    import secrets

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
        raise LaunchError(f"cannot create the run directory {d}: {exc.strerror or exc}",
                          hint="pass --runs-dir with a writable directory (is the disk full or read-only?)") from None
    return d


def write_record(path: Path, text: str) -> None:
    """A record of the run directory, written whole and private (safefs.write_file)."""
    safefs.write_file(path, text, "run record", error=LaunchError, durable=False)


def write_json(path: Path, obj) -> None:
    write_record(path, json.dumps(obj, indent=2, default=str) + "\n")


def write_plan(run_dir: str | Path, plan, *names: str) -> Path:
    """The plan into each of ``names`` in the run directory (default plan.json): an attempt's plan-<n>.json and
    the run's current plan.json, written whole; returns the first."""
    text = json.dumps(plan.to_dict(), indent=2, default=str) + "\n"
    d = safefs.make_dirs(run_dir, "run directory", error=LaunchError, hint=_HINT)   # a launch made it already
    for name in names or (PLAN,):
        safefs.write_file(d / name, text, "run record", error=LaunchError, durable=False)   # as write_record
    return d / (names or (PLAN,))[0]


def write_start(run_dir: str | Path, plan, launch_record: dict | None = None, elastic: bool = False) -> None:
    """What a launch writes before anything starts: launch.json (``launch_record``), plan.json and, for an elastic
    run, plan-0.json (each attempt's plan is kept)."""
    if launch_record is not None:
        write_json(Path(run_dir) / LAUNCH, launch_record)
    write_plan(run_dir, plan, PLAN, *([plan_of(0)] if elastic else []))


def write_summary(run_dir: str | Path, summary: dict) -> Path:
    """summary.json, redacted (podrun.redaction.redact_record: a worker's error or last lines may hold a secret)."""
    p = Path(run_dir) / SUMMARY
    write_json(p, redact_record(summary))
    return p

