"""Submissions: a job's run directory and record, and its scheduler commands, run through a CommandRunner."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, Protocol

from podrun.errors import HostError, LaunchError, PodrunError
from podrun.jobscript.job import SCHEDULER_HELP, JobRequest, check_scheduler
from podrun.rundir.job import JOB_FILE, JobRecord

if TYPE_CHECKING:  # pragma: no cover
    from podrun.jobscript.build import JobOptions

# final states: the job will not run again; everything else is pending/running/ending (Slurm's JobState names,
# which are podrun's; the Grid Engine and PBS tables below map onto them)
FINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                   "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REVOKED", "GONE"})
# how long wait() keeps asking about a job that left the queue with no final record yet
GONE_GRACE_S = 30.0
# each status or cancel query's bound: a Slurm client whose slurm.conf is missing retries reading it for 60 s
QUERY_TIMEOUT_S = 15.0


class SchedulerError(PodrunError):
    """A scheduler command failed or answered something podrun cannot read."""


class Refused(SchedulerError):
    """A scheduler command that did nothing: its client is not on PATH, or it exited non-zero (sbatch/qsub queued
    no job)."""


class ClientFailed(SchedulerError):
    """A status or cancel query whose client failed (not on PATH, no answer in time, an error of its own): podrun
    does not know the job's state, exit 1."""

    exit_code = 1


class UnknownJob(SchedulerError):
    """A job id the scheduler has neither queued nor accounted (a typo, or a job purged long ago): exit 2."""


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class CommandRunner(Protocol):
    """Runs one scheduler command; the only side effect of this module."""

    def run(self, argv: list[str], *, cwd: str | None = None, timeout: float = 60.0) -> Completed: ...


def _last_line(*texts) -> str:
    """The last non-empty line of a client's output (its own error line), '' for none."""
    for text in texts:
        text = text.decode(errors="replace") if isinstance(text, bytes) else (text or "")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if lines:
            return lines[-1]
    return ""


class SubprocessRunner:
    """The real runner: subprocess, no shell, text output, a timeout."""

    def __init__(self, env: dict[str, str] | None = None):
        self.env = env

    def run(self, argv: list[str], *, cwd: str | None = None, timeout: float = 60.0) -> Completed:
        exe = shutil.which(argv[0], path=(self.env or os.environ).get("PATH"))
        if exe is None:
            raise Refused(
                f"'{argv[0]}' is not on PATH: this host has no {argv[0]} client",
                hint="run podrun on a login node of the cluster, or pick the right --scheduler",
            )
        try:
            p = subprocess.run([exe, *argv[1:]], cwd=cwd, env=self.env, capture_output=True,
                               text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            said = _last_line(exc.stderr, exc.stdout)
            raise SchedulerError(f"'{' '.join(argv)}' did not answer within {timeout:.0f} s"
                                 + (f"; it said: {said}" if said else "")) from exc
        return Completed(tuple(argv), p.returncode, p.stdout, p.stderr)


@dataclass(frozen=True)
class JobState:
    """What the scheduler says about one job: ``state`` in podrun's names (Slurm's), ``native`` in its own."""

    job_id: str
    scheduler: str
    state: str                    # PENDING, RUNNING, COMPLETING, COMPLETED, FAILED, CANCELLED, ..., GONE
    exit_code: int | None = None  # shell-style (128+signal for a signal); None while running
    nodes: str | None = None
    reason: str | None = None
    native: str | None = None     # the scheduler's own: JobState, qstat's letters, job_state, qacct's failed

    @property
    def final(self) -> bool:
        return self.state in FINAL

    def to_dict(self) -> dict:
        return {**asdict(self), "final": self.final}


def _says(c: Completed, text: str) -> bool:
    return text.lower() in (c.stderr + c.stdout).lower()


class _Client:
    """A scheduler's client over a CommandRunner: submit, state and cancel (``SUBMIT``: its submit command as
    messages name it; ``ID_SEP``: what ends the job id it prints, all digits (none: the whole line is the id);
    ``CANCEL``: its cancel command; ``HINT``: what to check when a query fails; ``UNKNOWN``: what its cancel says
    of a job id it does not know; ``ENDED``: what it says when the job ended meanwhile)."""

    name = SUBMIT = CANCEL = HINT = UNKNOWN = ENDED = ""
    ID_SEP: str | None = None

    def __init__(self, runner: CommandRunner):
        self.runner = runner

    def submit(self, argv: list[str], *, cwd: str | None = None) -> str:
        """Run the submit command (writers.submit_argv: SUBMIT ...); the job id on the last line it printed."""
        c = self.runner.run(argv, cwd=cwd)
        if c.returncode != 0:
            raise Refused(f"{self.SUBMIT.split()[0]} failed ('{' '.join(c.argv)}' exited {c.returncode}): "
                          + (_last_line(c.stderr, c.stdout) or "no output"))
        out = c.stdout.strip()
        line = out.splitlines()[-1] if out else ""
        job = line.split(self.ID_SEP)[0].strip() if self.ID_SEP else line.strip()
        if not (job.isdigit() if self.ID_SEP else job):
            raise SchedulerError(f"{self.SUBMIT} printed no job id" + (f": {out[:200]!r}" if self.ID_SEP else ""))
        return job

    def query(self, argv: list[str]) -> Completed:
        """Run a status or cancel query within QUERY_TIMEOUT_S; a client that cannot run is ClientFailed."""
        try:
            return self.runner.run(argv, timeout=QUERY_TIMEOUT_S)
        except SchedulerError as exc:
            raise ClientFailed(exc.message, hint=self.HINT) from None

    def failed(self, c: Completed) -> NoReturn:
        """A query that failed with an error of its client's own: ClientFailed with that line."""
        raise ClientFailed(f"'{' '.join(c.argv)}' exited {c.returncode}: "
                           + (_last_line(c.stderr, c.stdout) or "no output"), hint=self.HINT)

    def cancel(self, job_id: str) -> None:
        c = self.query([self.CANCEL, job_id])
        if c.returncode == 0 or (self.ENDED and _says(c, self.ENDED)):
            return
        if self.UNKNOWN and _says(c, self.UNKNOWN):
            raise UnknownJob(f"{self.CANCEL} {job_id}: {_last_line(c.stderr, c.stdout)}")
        self.failed(c)

    def gone(self, job_id: str) -> JobState:
        return JobState(job_id, self.name, "GONE", None, None, "the scheduler no longer knows this job")


# ---- each scheduler's own state names, in one place (docs/jobscripts.md "Status and cancel") ---------------

# Slurm: JobState as scontrol and sacct print it (sacct: "CANCELLED by UID"), podrun's names as they are
SLURM_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "RESIZING", "SUSPENDED", "STOPPED", "SIGNALING",
                          "COMPLETING", "STAGE_OUT", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SPECIAL_EXIT",
                          "RESV_DEL_HOLD"}) | FINAL - {"GONE"}
# Grid Engine: qstat's state letters, the first of this order in a job's letters deciding (dr: deleting, Eqw:
# error, hqw: held, Rr: restarted and running); an ended job is its qacct record (parse_qacct)
UGE_LETTERS = (("d", "COMPLETING", "being deleted"), ("E", "PENDING", "in error: see qstat -j JOB"),
               ("h", "PENDING", "on hold"), ("s", "SUSPENDED", "suspended"), ("S", "SUSPENDED", "queue suspended"),
               ("T", "SUSPENDED", "suspended at a threshold"), ("r", "RUNNING", None),
               ("t", "RUNNING", "being transferred to its hosts"), ("R", "RUNNING", "restarted"),
               ("q", "PENDING", None), ("w", "PENDING", None))
# PBS: job_state (qstat -f); F (finished) and X (a finished subjob) read Exit_status (parse_pbs)
PBS_STATES = {"Q": ("PENDING", None), "H": ("PENDING", "held"), "W": ("PENDING", "waiting for its start time"),
              "T": ("PENDING", "being moved"), "M": ("PENDING", "moved to another server"), "R": ("RUNNING", None),
              "B": ("RUNNING", "array begun"), "S": ("SUSPENDED", None), "U": ("SUSPENDED", "workstation busy"),
              "E": ("COMPLETING", None), "F": ("COMPLETED", None), "X": ("COMPLETED", None)}


class Slurm(_Client):
    name, CANCEL, SUBMIT, ID_SEP = "slurm", "scancel", "sbatch --parsable", ";"
    HINT = ("check that SLURM_CONF names the cluster's slurm.conf (or that this host is a login node) and that "
            "slurmctld answers: scontrol ping")
    UNKNOWN, ENDED = "Invalid job id specified", "already completing or completed"

    def query(self, argv: list[str]) -> Completed:
        """A named SLURM_CONF that cannot be read fails at once (Slurm's clients retry reading it for 60 s)."""
        conf = (getattr(self.runner, "env", None) or os.environ).get("SLURM_CONF")
        if conf and not os.access(conf, os.R_OK):
            raise ClientFailed(f"SLURM_CONF={conf} cannot be read: Slurm's clients cannot find the cluster",
                               hint=self.HINT)
        return super().query(argv)

    def state(self, job_id: str) -> JobState:
        """The controller's record (`scontrol show job`); a job id it does not hold ("Invalid job id specified":
        never queued, or purged MinJobAge after it ended): the accounting's (`sacct`), else GONE."""
        c = self.query(["scontrol", "show", "job", "-o", job_id])
        if c.returncode == 0 and c.stdout.strip():
            return parse_scontrol(job_id, c.stdout)
        if not _says(c, self.UNKNOWN):
            self.failed(c)
        a = self.query(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobID,State,ExitCode,NodeList"])
        if a.returncode == 0:
            return parse_sacct(job_id, a.stdout) or self.gone(job_id)
        if _says(a, "accounting storage is disabled"):
            return self.gone(job_id)
        self.failed(a)


def _slurm_state(job_id: str, native: str, exit_field: str, nodes: str | None, reason: str | None) -> JobState:
    """A Slurm job's state from its JobState and ExitCode (code:signal)."""
    state = native.split()[0].upper() if native.strip() else "UNKNOWN"
    exit_code = None
    if state in FINAL:
        code, _, sig = (exit_field or "0:0").partition(":")
        code_i, sig_i = int(code or 0), int(sig or 0)
        exit_code = 128 + sig_i if sig_i else code_i       # as Slurm says it: a job cancelled while held is 0:0
    if state not in SLURM_STATES:
        reason = f"JobState {state} is not one podrun knows" + (f" ({reason})" if reason else "")
    return JobState(job_id, "slurm", state, exit_code, None if nodes in (None, "", "(null)", "None assigned")
                    else nodes, reason, native)


def parse_scontrol(job_id: str, text: str) -> JobState:
    """One `scontrol show job -o` line -> JobState (ExitCode=code:signal)."""
    fields = dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", text))
    reason = fields.get("Reason")
    return _slurm_state(job_id, fields.get("JobState", ""), fields.get("ExitCode", "0:0"), fields.get("NodeList"),
                        reason if reason not in (None, "None") else None)


def parse_sacct(job_id: str, text: str) -> JobState | None:
    """`sacct -n -P -X -o JobID,State,ExitCode,NodeList` -> the job's record; None when it has none."""
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) >= 4 and parts[0] == job_id:
            return _slurm_state(job_id, parts[1], parts[2], parts[3], None)
    return None


class Pbs(_Client):
    name, CANCEL, SUBMIT = "pbs", "qdel", "qsub"
    HINT = "check that this host reaches the PBS server (PBS_SERVER, /etc/pbs.conf): qstat -B"
    UNKNOWN, ENDED = "Unknown Job Id", "has finished"

    def state(self, job_id: str) -> JobState:
        """`qstat -x -f JOB` (-x: finished jobs too, for the server's job_history_duration); "Unknown Job Id":
        GONE."""
        c = self.query(["qstat", "-x", "-f", job_id])
        if c.returncode == 0 and c.stdout.strip():
            return parse_pbs(job_id, c.stdout)
        if _says(c, self.UNKNOWN):
            return self.gone(job_id)
        self.failed(c)


def parse_pbs(job_id: str, text: str) -> JobState:
    """`qstat -x -f` of one job -> JobState by PBS_STATES; a finished job's Exit_status: 0 COMPLETED, N > 0 the
    script's code, 256+N killed by signal N (128+N), negative: PBS could not run the job (FAILED with that code;
    none: FAILED with no code)."""
    f = dict(m.groups() for m in re.finditer(r"^\s*([\w.]+) = (.*)$", text, re.M))
    native = f.get("job_state", "").strip()
    state, reason = PBS_STATES.get(native, ("UNKNOWN", f"job_state {native!r}"))
    code = f.get("Exit_status")
    exit_code = None
    if state == "COMPLETED":
        n = int(code) if code is not None and code.strip().lstrip("-").isdigit() else None
        if n is None:
            state, reason = "FAILED", "no Exit_status: the job ended before it ran"
        elif n < 0:         # PBS's own JOB_EXEC_* codes, kept as PBS says them
            state, exit_code, reason = "FAILED", n, f"Exit_status {n}: PBS could not run the job"
        else:
            exit_code = 128 + n - 256 if n > 256 else n
            state = "COMPLETED" if exit_code == 0 else "FAILED"
    return JobState(job_id, "pbs", state, exit_code, f.get("exec_host"), reason, native)


class Uge(_Client):
    """Grid Engine (Univa/Altair as on ABCI, Son of Grid Engine): qsub -terse, qstat, qacct -j, qdel."""

    name, CANCEL, SUBMIT, ID_SEP = "uge", "qdel", "qsub -terse", "."
    HINT = ("check SGE_ROOT and SGE_CELL (source $SGE_ROOT/$SGE_CELL/common/settings.sh) and that sge_qmaster "
            "answers: qstat")
    UNKNOWN = "does not exist"

    def state(self, job_id: str) -> JobState:
        """A job the qmaster holds: its `qstat -g t` lines (state letters, a queue@host for each of its hosts); an
        ended one: its `qacct -j` records (exit_status, failed, each host's); neither ("job id N not found"): GONE."""
        c = self.query(["qstat", "-g", "t"])
        if c.returncode != 0:
            self.failed(c)
        found = parse_qstat(job_id, c.stdout)
        if found is not None:
            return found
        a = self.query(["qacct", "-j", job_id])
        if a.returncode == 0 and a.stdout.strip():
            return parse_qacct(job_id, a.stdout)
        # "not found": no record of it; no accounting file at all: no job has ended on this cell yet
        if _says(a, "not found") or _says(a, "/accounting: no such file"):
            return self.gone(job_id)
        self.failed(a)


def parse_qstat(job_id: str, text: str) -> JobState | None:
    """The job's lines of Grid Engine's `qstat` table (`qstat -g t`: a line per host of a parallel job, MASTER or
    SLAVE) -> JobState by UGE_LETTERS, every host named (the master's first); None when it is not listed."""
    letters, hosts = None, []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 5 or parts[0] != job_id:
            continue
        letters = letters or parts[4]
        queue = next((p for p in parts[5:] if "@" in p), None)
        if queue is not None:
            host = queue.split("@", 1)[1]
            if host not in hosts:
                hosts.insert(0, host) if "MASTER" in parts else hosts.append(host)
            elif "MASTER" in parts:
                hosts.insert(0, hosts.pop(hosts.index(host)))
    if letters is None:
        return None
    state, why = next(((st, why) for ch, st, why in UGE_LETTERS if ch in letters),
                      ("UNKNOWN", "state letters podrun does not know"))
    reason = None if why is None else f"{letters}: {why.replace('JOB', job_id)}"
    return JobState(job_id, "uge", state, None, ",".join(hosts) or None, reason, letters)


def parse_qacct(job_id: str, text: str) -> JobState:
    """An ended job's `qacct -j` records -> JobState, the first that holds deciding: a deleted_by (Univa / Altair)
    CANCELLED; failed 100 (ended by Grid Engine) past the h_rt of its category TIMEOUT, else CANCELLED (100 :
    assumedly after job: qdel, or a signal Grid Engine sent); another nonzero failed (Grid Engine could not run the
    job) or a nonzero exit_status FAILED; else COMPLETED. exit_status is the job script's exit code as Grid Engine
    says it (128+signal when killed, as after qdel; none when it never ran), every host with a record named (the
    master task's, whose record comes last, first)."""
    records: list[dict] = [{}]
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key.startswith("="):
            records.append({})
        elif key:
            records[-1][key] = value.strip()
    records = [r for r in records if r] or [{}]
    f = records[-1]                 # the master task's (it ends last), and the last run of the id
    hosts = list(dict.fromkeys(r["hostname"] for r in (f, *records) if r.get("hostname")))
    code = int((f.get("exit_status") or "0").split()[0])
    failed = f.get("failed") or "0"
    number = failed.split()[0]
    limit = re.search(r"h_rt=(\d+)", f.get("category", ""))
    wall = re.match(r"\s*(\d+(?:\.\d+)?)", f.get("ru_wallclock") or "")
    deleted = (f.get("deleted_by") or "NONE").strip()
    if deleted not in ("", "NONE"):
        state = "CANCELLED"
    elif number == "100" and limit is not None and wall is not None and float(wall.group(1)) >= int(limit.group(1)):
        state = "TIMEOUT"
    elif number == "100":
        state = "CANCELLED"
    else:
        state = "COMPLETED" if code == 0 and number == "0" else "FAILED"
    ran = not (number not in ("0", "100") and code == 0)     # a job Grid Engine could not start has no code of its own
    return JobState(job_id, "uge", state, code if ran else None, ",".join(hosts) or None,
                    f"failed {failed}" if number != "0" else None, f"failed {failed}, exit_status {code}")


def client(scheduler: str, runner: CommandRunner | None = None):
    """The client for ``scheduler`` (slurm | pbs | uge); JobScriptError (exit 2) for an unknown one."""
    return {"slurm": Slurm, "pbs": Pbs, "uge": Uge}[check_scheduler(scheduler).name](runner or SubprocessRunner())


def known_state(cl, job_id: str, record: JobRecord | None) -> JobState:
    """The job's state for `podrun status` and `cancel`: a job id given bare that the scheduler neither holds nor
    has accounted is UnknownJob (exit 2, naming it); one recorded by `podrun submit` (``record``) was queued, so
    the scheduler no longer knowing it is its state, GONE."""
    st = cl.state(job_id)
    if st.state == "GONE" and record is None:
        raise UnknownJob(f"job {job_id} is unknown to {cl.name}: it neither holds it nor has an accounting record",
                         hint="check the job id (squeue / qstat list the queued jobs); a job that ended before the "
                              "scheduler's records were kept is gone from them")
    return st


def detect_scheduler(env=None) -> str | None:
    """The scheduler whose client is on PATH: sbatch -> slurm, qsub with qacct -> uge, qsub -> pbs."""
    path = (env or os.environ).get("PATH")
    if shutil.which("sbatch", path=path):
        return "slurm"
    if shutil.which("qsub", path=path):
        return "uge" if shutil.which("qacct", path=path) else "pbs"
    return None


def pick_scheduler(scheduler: str | None, who: str = "", hint: str = "") -> str:
    """``scheduler``, else the one whose client is on PATH (detect_scheduler); a PodrunError (exit 2) when there is
    none, said of ``who`` (the job id given), ``hint`` after its hint."""
    found = scheduler or detect_scheduler()
    if found is None:
        raise PodrunError(f"{who}no --scheduler given and no scheduler client (sbatch, qsub) on PATH",
                          hint=f"pass --scheduler {SCHEDULER_HELP}{hint}")
    return found


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

def resolve_job(target: str, scheduler: str | None = None) -> tuple[str, str, JobRecord | None]:
    """RUN_DIR or JOB_ID -> (scheduler, job_id, record or None)."""
    p = Path(target)
    if p.is_dir() or (p / JOB_FILE).exists():
        rec = JobRecord.load(p)
        return rec.scheduler, rec.job_id, rec
    if re.fullmatch(r"[0-9]+(\.[\w.-]+)?", target):
        return pick_scheduler(scheduler, f"job {target}: "), target, None
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
    made_runs_dir: bool = False  # --runs-dir did not exist before: a refused submission removes it too

    def to_dict(self) -> dict:
        return {"run_id": self.run_id, "run_dir": str(self.run_dir), "scheduler": self.request.scheduler,
                "script": str(self.script), "submit_argv": list(self.submit_argv), "job_id": None}


def prepare_job(plan, job: JobOptions, runs_dir: str | os.PathLike) -> PreparedJob:
    """Make runs/<run-id>/ (0700; --runs-dir checked as launch checks it) with job.sh and plan.json (0600, written
    through podrun.safefs) for ``request_from_plan(plan, job)``: the scheduler's stdout/stderr go to the run
    directory (unless ``job.log_dir`` names another) and the job's `podrun launch` writes its run into the same
    directory (--runs-dir/--run-id). The
    request is built and checked before anything is written: a bad value leaves no directory behind."""
    from podrun.jobscript.build import request_from_plan
    from podrun.jobscript.writers import render, submit_argv
    from podrun.rundir.layout import JOB_SCRIPT, make_runs_dir, new_run_id, write_plan
    from podrun.safefs import make_dir, write_file

    run_id = new_run_id()
    run_dir = Path(os.path.abspath(runs_dir)) / run_id
    req = request_from_plan(plan, replace(job, log_dir=str(run_dir) if job.log_dir is None else job.log_dir,
                                          launch_options=("--runs-dir", str(run_dir.parent), "--run-id", run_id)))
    text = render(req)
    made = not os.path.isdir(runs_dir)
    make_runs_dir(runs_dir)
    make_dir(run_dir, "run directory", error=LaunchError)
    script = write_file(run_dir / JOB_SCRIPT, text, "job script")
    write_plan(run_dir, plan)
    return PreparedJob(run_id, run_dir, script, tuple(submit_argv(req, str(script))), req, made)


def submit_prepared(job: PreparedJob, cl, *, cwd: str, cluster: str | None = None) -> JobRecord:
    """Submit a prepared job with its client and record runs/<run-id>/job.json. A submission the scheduler refused
    leaves nothing behind: no run directory, nor the --runs-dir made for it (one that timed out or answered no job
    id is kept: a job may have been queued)."""
    try:
        job_id = cl.submit(list(job.submit_argv), cwd=cwd)
    except Refused:
        shutil.rmtree(job.run_dir, ignore_errors=True)
        if job.made_runs_dir:
            with contextlib.suppress(OSError):
                os.rmdir(job.run_dir.parent)       # only when empty: another submission may be writing there
        raise
    rec = JobRecord(run_id=job.run_id, run_dir=str(job.run_dir), scheduler=job.request.scheduler, job_id=job_id,
                    script=str(job.script), submit_argv=job.submit_argv, submitted_at=time.time(),
                    cluster=cluster, nodes=job.request.nodes)
    rec.save()
    return rec


def exit_code_of(st: JobState) -> int:
    """The exit code `submit --wait` ends with: the job's own; 1 where it has none a shell could exit with (GONE,
    none, PBS's negative codes) or where it is 0 for a job that did not complete (cancelled while held)."""
    code = st.exit_code
    if code is None or not 0 <= code <= 255 or (code == 0 and st.state != "COMPLETED"):
        return 1
    return code
