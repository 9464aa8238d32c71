"""Submissions: a job's run directory and record, and its scheduler commands, run through a CommandRunner."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from podrun.errors import HostError, LaunchError, PodrunError
from podrun.jobscript.job import SCHEDULER_HELP, JobRequest, check_scheduler

if TYPE_CHECKING:  # pragma: no cover
    from podrun.jobscript.build import JobOptions

# final states: the job will not run again; everything else is pending/running/ending
FINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                   "PREEMPTED", "BOOT_FAIL", "DEADLINE", "GONE"})
# how long wait() keeps asking about a job that left the queue with no final record yet
GONE_GRACE_S = 30.0


class SchedulerError(PodrunError):
    """A scheduler command failed or answered something podrun cannot read."""


class Refused(SchedulerError):
    """A scheduler command that did nothing: its client is not on PATH, or it exited non-zero (sbatch/qsub queued
    no job)."""


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class CommandRunner(Protocol):
    """Runs one scheduler command; the only side effect of this module."""

    def run(self, argv: list[str], *, cwd: str | None = None, timeout: float = 60.0) -> Completed: ...


class SubprocessRunner:
    """The real runner: subprocess, no shell, text output, a timeout."""

    def __init__(self, env: dict[str, str] | None = None):
        self.env = env

    def run(self, argv: list[str], *, cwd: str | None = None, timeout: float = 60.0) -> Completed:
        exe = shutil.which(argv[0], path=(self.env or os.environ).get("PATH"))
        if exe is None:
            raise Refused(
                f"'{argv[0]}' is not on PATH: this host has no {argv[0]} client",
                hint="run podrun submit on a login node of the cluster, or pick the right --scheduler",
            )
        try:
            p = subprocess.run([exe, *argv[1:]], cwd=cwd, env=self.env, capture_output=True,
                               text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise SchedulerError(f"'{' '.join(argv)}' did not answer within {timeout:.0f} s") from exc
        return Completed(tuple(argv), p.returncode, p.stdout, p.stderr)


@dataclass(frozen=True)
class JobState:
    """What the scheduler says about one job."""

    job_id: str
    scheduler: str
    state: str                    # PENDING, RUNNING, COMPLETING, COMPLETED, FAILED, CANCELLED, ..., GONE
    exit_code: int | None = None  # shell-style (128+signal for a signal); None while running
    nodes: str | None = None
    reason: str | None = None

    @property
    def final(self) -> bool:
        return self.state in FINAL

    def to_dict(self) -> dict:
        return {**asdict(self), "final": self.final}


def _check(c: Completed, what: str) -> str:
    if c.returncode != 0:
        msg = (c.stderr or c.stdout).strip().splitlines()
        raise Refused(
            f"{what} failed ('{' '.join(c.argv)}' exited {c.returncode}): "
            + (msg[-1] if msg else "no output"),
        )
    return c.stdout


class _Client:
    """A scheduler's client over a CommandRunner: submit, state and cancel (``CANCEL``: its cancel command)."""

    name = CANCEL = ""

    def __init__(self, runner: CommandRunner):
        self.runner = runner

    def cancel(self, job_id: str) -> None:
        _check(self.runner.run([self.CANCEL, job_id]), self.CANCEL)

    def gone(self, job_id: str) -> JobState:
        return JobState(job_id, self.name, "GONE", None, None, "the scheduler no longer knows this job")


class Slurm(_Client):
    name, CANCEL = "slurm", "scancel"

    def submit(self, argv: list[str], *, cwd: str | None = None) -> str:
        """Run the submit command (writers.submit_argv: sbatch --parsable ...); the job id."""
        out = _check(self.runner.run(argv, cwd=cwd), "sbatch")
        job = out.strip().splitlines()[-1].split(";")[0].strip() if out.strip() else ""
        if not job.isdigit():
            raise SchedulerError(f"sbatch --parsable printed no job id: {out.strip()[:200]!r}")
        return job

    def state(self, job_id: str) -> JobState:
        c = self.runner.run(["scontrol", "show", "job", "-o", job_id])
        if c.returncode != 0 or not c.stdout.strip():
            # purged after MinJobAge (no slurmdbd here): ask squeue, else it is gone
            q = self.runner.run(["squeue", "-h", "-j", job_id, "-o", "%T %N"])
            if q.returncode == 0 and q.stdout.strip():
                st, *rest = q.stdout.split()
                return JobState(job_id, "slurm", st, None, rest[0] if rest else None)
            if "invalid job id" in (c.stderr + c.stdout).lower() or c.returncode != 0:
                return self.gone(job_id)
        return parse_scontrol(job_id, c.stdout)


def parse_scontrol(job_id: str, text: str) -> JobState:
    """One `scontrol show job -o` line -> JobState (ExitCode=code:signal)."""
    fields = dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", text))
    state = fields.get("JobState", "UNKNOWN").upper()
    exit_code = None
    if state in FINAL:
        code, _, sig = fields.get("ExitCode", "0:0").partition(":")
        code_i, sig_i = int(code or 0), int(sig or 0)
        exit_code = 128 + sig_i if sig_i else code_i
        if exit_code == 0 and state != "COMPLETED":
            exit_code = 1
    nodes = fields.get("NodeList")
    return JobState(job_id, "slurm", state, exit_code, None if nodes in (None, "(null)") else nodes,
                    fields.get("Reason") if fields.get("Reason") not in (None, "None") else None)


class Pbs(_Client):
    name, CANCEL = "pbs", "qdel"
    _STATES = {"Q": "PENDING", "H": "PENDING", "W": "PENDING", "T": "PENDING", "R": "RUNNING",
               "B": "RUNNING", "E": "COMPLETING", "X": "COMPLETED", "F": "COMPLETED", "S": "SUSPENDED"}

    def submit(self, argv: list[str], *, cwd: str | None = None) -> str:
        """Run the submit command (writers.submit_argv: qsub ...); the job id qsub prints."""
        out = _check(self.runner.run(argv, cwd=cwd), "qsub").strip()
        if not out:
            raise SchedulerError("qsub printed no job id")
        return out.splitlines()[-1].strip()

    def state(self, job_id: str) -> JobState:
        c = self.runner.run(["qstat", "-x", "-f", job_id])
        if c.returncode != 0 or not c.stdout.strip():
            return self.gone(job_id)
        f = dict(m.groups() for m in re.finditer(r"^\s*([\w.]+) = (.*)$", c.stdout, re.M))
        state = self._STATES.get(f.get("job_state", "").strip(), "UNKNOWN")
        code = f.get("Exit_status")
        exit_code = None
        if state == "COMPLETED" and code is not None:
            n = int(code)
            exit_code = n if n >= 0 else 1          # negative: PBS could not run the job
            exit_code = exit_code - 128 if exit_code > 256 else exit_code  # 256+sig: killed by a signal
            state = "COMPLETED" if exit_code == 0 else "FAILED"
        return JobState(job_id, "pbs", state, exit_code, f.get("exec_host"))


class Uge(_Client):
    """Grid Engine (Univa/Altair as on ABCI, Son of Grid Engine): qsub -terse, qstat, qacct -j, qdel."""

    name, CANCEL = "uge", "qdel"

    def submit(self, argv: list[str], *, cwd: str | None = None) -> str:
        """Run the submit command (writers.submit_argv: qsub -terse [-g GROUP] ...); the job id."""
        out = _check(self.runner.run(argv, cwd=cwd), "qsub").strip()
        job = out.splitlines()[-1].split(".")[0].strip() if out else ""
        if not job.isdigit():
            raise SchedulerError(f"qsub -terse printed no job id: {out[:200]!r}")
        return job

    def state(self, job_id: str) -> JobState:
        """A job the qmaster holds: its `qstat` line (state letters, queue@host); an ended one: its
        `qacct -j` record (exit_status, failed); neither: GONE."""
        c = self.runner.run(["qstat"])
        if c.returncode == 0:
            found = parse_qstat(job_id, c.stdout)
            if found is not None:
                return found
        a = self.runner.run(["qacct", "-j", job_id])
        if a.returncode == 0 and a.stdout.strip():
            return parse_qacct(job_id, a.stdout)
        return self.gone(job_id)


# qstat's state letters (parse_qstat) -> the state: the first row with a letter in the job's wins, else PENDING
_QSTAT_STATES = (("d", "COMPLETING"), ("rt", "RUNNING"), ("sST", "SUSPENDED"))


def parse_qstat(job_id: str, text: str) -> JobState | None:
    """The job's line of Grid Engine's `qstat` table -> JobState; None when the job is not listed.
    State letters: qw/hqw pending, r/t running (t: being sent), d deleting, s/S/T suspended, E error."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 5 or parts[0] != job_id:
            continue
        letters = parts[4]
        queue = next((p for p in parts[5:] if "@" in p), None)
        host = queue.split("@", 1)[1] if queue else None
        if "E" in letters:
            return JobState(job_id, "uge", "PENDING", None, host,
                            f"Grid Engine error state {letters}: see qstat -j {job_id}")
        state = next((st for chars, st in _QSTAT_STATES if any(ch in letters for ch in chars)), "PENDING")
        return JobState(job_id, "uge", state, None, host)
    return None


def parse_qacct(job_id: str, text: str) -> JobState:
    """An ended job's `qacct -j` record -> JobState: exit_status is the job script's exit code
    (128+signal when killed, as after qdel); a nonzero ``failed`` (Grid Engine could not run the
    job, or ended it: "100 : assumedly after job" after qdel or a limit) makes it FAILED."""
    f = {}
    for line in text.splitlines():       # the last record wins (qacct lists every run of the id)
        key, _, value = line.partition(" ")
        if key and not key.startswith("="):
            f[key] = value.strip()
    code = int((f.get("exit_status") or "0").split()[0])
    failed = f.get("failed") or "0"
    bad = failed.split()[0] != "0"
    state = "COMPLETED" if code == 0 and not bad else "FAILED"
    exit_code = code if code != 0 or not bad else 1
    return JobState(job_id, "uge", state, exit_code, f.get("hostname"), f"failed {failed}" if bad else None)


def client(scheduler: str, runner: CommandRunner | None = None):
    """The client for ``scheduler`` (slurm | pbs | uge); JobScriptError (exit 2) for an unknown one."""
    return {"slurm": Slurm, "pbs": Pbs, "uge": Uge}[check_scheduler(scheduler).name](runner or SubprocessRunner())


def detect_scheduler(env=None) -> str | None:
    """The scheduler whose client is on PATH: sbatch -> slurm, qsub with qacct -> uge, qsub -> pbs."""
    path = (env or os.environ).get("PATH")
    if shutil.which("sbatch", path=path):
        return "slurm"
    if shutil.which("qsub", path=path):
        return "uge" if shutil.which("qacct", path=path) else "pbs"
    return None


def wait(cl, job_id: str, *, poll: float = 0.5, timeout: float | None = None,
         on_state=None, gone_grace: float = GONE_GRACE_S) -> JobState:
    """Poll until the job reaches a final state (like `sbatch --wait`); returns that state.

    A job seen alive that then is GONE (neither listed nor accounted) is polled ``gone_grace``
    seconds more before GONE is final: Grid Engine writes a job's accounting record up to its
    accounting_flush_time (15 s by default) after the job has left qstat."""
    deadline = None if timeout is None else time.monotonic() + timeout
    last = None
    seen_alive = False
    gone_since = None
    delay = min(0.2, poll)
    while True:
        st = cl.state(job_id)
        if on_state and (last is None or st.state != last.state):
            on_state(st)
        last = st
        if st.state == "GONE" and seen_alive:
            gone_since = time.monotonic() if gone_since is None else gone_since
            if time.monotonic() - gone_since >= gone_grace:
                return st
        elif st.final:
            return st
        else:
            seen_alive, gone_since = True, None
        if deadline is not None and time.monotonic() > deadline:
            raise LaunchError(f"job {job_id} did not end within {timeout:.0f} s (state {st.state})",
                              exit_code=1)
        time.sleep(delay)
        delay = min(poll, delay * 1.5)


# ---- the run directory record ------------------------------------------------------------------

JOB_FILE = "job.json"
RECORD_LIMIT = 1 << 20       # bytes of job.json read at most


@dataclass(frozen=True)
class JobRecord:
    """runs/<run-id>/job.json: what was submitted, where, and as which job."""

    run_id: str
    run_dir: str
    scheduler: str
    job_id: str
    script: str
    submit_argv: tuple[str, ...]
    submitted_at: float
    cluster: str | None = None
    nodes: int | None = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["submit_argv"] = list(self.submit_argv)
        return d

    def save(self) -> Path:
        from podrun.safefs import write_file

        return write_file(Path(self.run_dir) / JOB_FILE, json.dumps(self.to_dict(), indent=2) + "\n", "job record")

    @classmethod
    def load(cls, run_dir: str | os.PathLike) -> "JobRecord":
        """job.json, read only when this user (or root) alone can have written it (it names the job to cancel)."""
        from podrun.safefs import read_trusted

        p = Path(run_dir) / JOB_FILE
        try:
            d = json.loads(read_trusted(p, "job record", limit=RECORD_LIMIT, error=HostError))
            d["submit_argv"] = tuple(d.get("submit_argv", ()))
            return cls(**d)
        except FileNotFoundError:
            raise HostError(f"{p} does not exist: '{run_dir}' is not a submitted run",
                            hint="pass a run directory written by podrun submit, or a job id") from None
        except (OSError, ValueError, TypeError) as exc:
            raise HostError(f"{p} is not a job record podrun can read: {exc}") from None


def resolve_job(target: str, scheduler: str | None = None) -> tuple[str, str, JobRecord | None]:
    """RUN_DIR or JOB_ID -> (scheduler, job_id, record or None)."""
    p = Path(target)
    if p.is_dir() or (p / JOB_FILE).exists():
        rec = JobRecord.load(p)
        return rec.scheduler, rec.job_id, rec
    if re.fullmatch(r"[0-9]+(\.[\w.-]+)?", target):
        sched = scheduler or detect_scheduler()
        if sched is None:
            raise PodrunError(
                f"job {target}: no --scheduler given and no scheduler client (sbatch, qsub) on PATH",
                hint=f"pass --scheduler {SCHEDULER_HELP}",
            )
        return sched, target, None
    raise HostError(f"'{target}' is neither a run directory with {JOB_FILE} nor a job id",
                    hint="pass runs/<run-id> as written by podrun submit, or the scheduler's job id")


# ---- a submission: the run directory, its script, the scheduler call -----------------------------

@dataclass(frozen=True)
class PreparedJob:
    """A run directory holding job.sh and plan.json, and the command that submits job.sh."""

    run_id: str
    run_dir: Path
    script: Path
    submit_argv: tuple[str, ...]
    request: JobRequest         # what the script was rendered from

    def to_dict(self) -> dict:
        return {"run_id": self.run_id, "run_dir": str(self.run_dir), "scheduler": self.request.scheduler,
                "script": str(self.script), "submit_argv": list(self.submit_argv), "job_id": None}


def prepare_job(plan, job: JobOptions, runs_dir: str | os.PathLike) -> PreparedJob:
    """Make runs/<run-id>/ (0700; --runs-dir checked as launch checks it) with job.sh and plan.json (0600, written
    through podrun.safefs) for ``request_from_plan(plan, job)``: the scheduler's stdout/stderr go to the run
    directory and the job's `podrun launch` writes its run into the same directory (--runs-dir/--run-id). The
    request is built and checked before anything is written: a bad value leaves no directory behind."""
    from podrun.jobscript.build import request_from_plan
    from podrun.jobscript.writers import render, submit_argv
    from podrun.rundir.layout import JOB_SCRIPT, make_runs_dir, new_run_id, write_plan
    from podrun.safefs import make_dir, write_file

    run_id = new_run_id()
    run_dir = Path(os.path.abspath(runs_dir)) / run_id
    req = request_from_plan(plan, replace(job, log_dir=str(run_dir),
                                          launch_options=("--runs-dir", str(run_dir.parent), "--run-id", run_id)))
    text = render(req)
    make_runs_dir(runs_dir)
    make_dir(run_dir, "run directory", error=LaunchError)
    script = write_file(run_dir / JOB_SCRIPT, text, "job script")
    write_plan(run_dir, plan)
    return PreparedJob(run_id, run_dir, script, tuple(submit_argv(req, str(script))), req)


def submit_prepared(job: PreparedJob, cl, *, cwd: str, cluster: str | None = None) -> JobRecord:
    """Submit a prepared job with its client and record runs/<run-id>/job.json. A submission the scheduler refused
    leaves no run directory behind (one that timed out or answered no job id is kept: a job may have been queued)."""
    try:
        job_id = cl.submit(list(job.submit_argv), cwd=cwd)
    except Refused:
        shutil.rmtree(job.run_dir, ignore_errors=True)
        raise
    rec = JobRecord(run_id=job.run_id, run_dir=str(job.run_dir), scheduler=job.request.scheduler, job_id=job_id,
                    script=str(job.script), submit_argv=job.submit_argv, submitted_at=time.time(),
                    cluster=cluster, nodes=job.request.nodes)
    rec.save()
    return rec


def exit_code_of(st: JobState) -> int:
    """The exit code `submit --wait` ends with: the job's own, or 1 when there is none (GONE)."""
    return 1 if st.state == "GONE" or st.exit_code is None else st.exit_code
