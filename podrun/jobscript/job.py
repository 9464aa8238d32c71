"""JobRequest: what a batch job asks the scheduler for and runs; the scheduler table; validation and wall time."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from podrun.errors import PodrunError


@dataclass(frozen=True)
class Scheduler:
    """One batch scheduler podrun writes scripts for and submits to."""

    name: str           # the --scheduler value
    title: str          # for help and errors
    transport: str      # how `podrun launch` starts one instance per host inside the job
    hosts_from: tuple[str, ...]   # the variables `podrun launch` finds the job's hosts in


SCHEDULER_TABLE = {
    "slurm": Scheduler("slurm", "Slurm", "srun", ("SLURM_JOB_NODELIST", "SLURM_NODELIST")),
    # PBS: Open MPI's mpirun (mpiexec) starts one agent per instance, which joins; Open MPI reads the hosts itself
    "pbs": Scheduler("pbs", "PBS Pro / OpenPBS", "mpirun", ("PBS_NODEFILE",)),
    "uge": Scheduler("uge", "Grid Engine: Univa/Altair or Son of Grid Engine, as on ABCI", "ssh",
                     ("PE_HOSTFILE", "SGE_JOB_HOSTLIST")),
}
SCHEDULERS = tuple(SCHEDULER_TABLE)
# other names a --scheduler value may have: Grid Engine's older name (Sun/Son of Grid Engine)
SCHEDULER_ALIASES = {"sge": "uge"}
SCHEDULER_HELP = ", ".join(f"{s.name} ({s.title})" for s in SCHEDULER_TABLE.values()) + "; sge is uge"


def scheduler_name(name: str) -> str | None:
    """A --scheduler value (any case, or an alias) as a SCHEDULER_TABLE key; None for an unknown one."""
    key = str(name).strip().lower()
    key = SCHEDULER_ALIASES.get(key, key)
    return key if key in SCHEDULER_TABLE else None


def suggest_scheduler(name: str) -> str:
    """"did you mean 'X'? " for a near miss of a scheduler's name or alias, else ""."""
    import difflib

    close = difflib.get_close_matches(str(name).lower()[:50], [*SCHEDULERS, *SCHEDULER_ALIASES], n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'? " if close else ""


def node_cpus(given: int | None, spec) -> int | None:
    """The cores a job asks for on each node: --cpus-per-node (``given``), else the cluster spec's ``cpu.cores``
    where the spec is a scheduled cluster's (its ``scheduler`` is not none). A spec with scheduler none describes
    the machine podrun runs on (local: its cores are this machine's), which says nothing of a compute node's: no
    count is asked, and the scheduler's default stands. A scheduled cluster's spec without ``cpu.cores``:
    JobScriptError (exit 2) naming the spec and --cpus-per-node."""
    if given is not None or spec is None or spec.scheduler == "none":
        return given
    if spec.cpu is None:
        raise JobScriptError(f"cluster spec {spec.path or spec.name} gives no cpu.cores: a job script asks each node's "
                             "cores from it", hint="pass --cpus-per-node C, or add cpu: {cores: C, numa_nodes: N} to "
                                                   "the spec (docs/cluster-specs.md)")
    return int(spec.cpu.cores)


def check_scheduler(name: str) -> Scheduler:
    """The table entry of a --scheduler value (an alias: its scheduler's); JobScriptError (exit 2) for an unknown
    one, with the nearest name."""
    key = scheduler_name(name)
    if key is None:
        raise JobScriptError(f"unknown scheduler {name!r}",
                             hint=f"{suggest_scheduler(name)}--scheduler {SCHEDULER_HELP}") from None
    return SCHEDULER_TABLE[key]


DEVICE_KINDS = ("gpu", "cpu", "ipu")

# Directive lines (#SBATCH, #PBS, #$) are read by the scheduler, not by a shell, and each scheduler
# treats quotes differently; so their values are restricted to characters that need no quoting.
_DIRECTIVE_SAFE = re.compile(r"^[A-Za-z0-9_.,:=+@%/\-]+$")
# Grid Engine expands these pseudo variables in -o/-e paths
_UGE_PSEUDO = re.compile(r"\$(JOB_ID|JOB_NAME|HOME|USER|HOSTNAME|TASK_ID)\b")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MODULE = re.compile(r"^[A-Za-z0-9_.+@/:\-]+$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_LOG_PATHS = ("log_dir", "output", "error")


class JobScriptError(PodrunError):
    """A job-script value that cannot be written safely (newlines, '#' tricks, bad time)."""


def parse_time(value: int | str) -> int:
    """Wall time in seconds from an int (seconds) or a string: 'HH:MM:SS', 'MM:SS', 'D-HH:MM:SS',
    'D-HH', or a number with a unit: '90s', '30m', '2h', '1d'. A bare number string is refused
    (Slurm reads it as minutes, others as seconds)."""
    if isinstance(value, bool):
        raise JobScriptError(f"time limit {value!r} is not a duration")
    if isinstance(value, int):
        if value <= 0:
            raise JobScriptError(f"time limit {value} s must be positive")
        return value
    s = str(value).strip()
    hint = "write HH:MM:SS (01:30:00), D-HH:MM:SS (2-00:00:00) or a number with a unit: 90m, 2h, 3600s"
    m = re.fullmatch(r"(\d+)\s*([smhd])", s)
    if m:
        secs = int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    elif re.fullmatch(r"\d+", s):
        raise JobScriptError(f"time limit {s!r} has no unit", hint=hint)
    else:
        m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", s)
        if not m or (m.group(1) is None and m.group(3) is None):
            raise JobScriptError(f"time limit {s!r} is not a duration", hint=hint)
        days = int(m.group(1) or 0)
        nums = [int(x) for x in m.group(2, 3, 4) if x is not None]
        if m.group(1) is not None:          # D-HH, D-HH:MM, D-HH:MM:SS
            h, mi, se = (nums + [0, 0])[:3]
        elif len(nums) == 2:                # MM:SS
            h, mi, se = 0, nums[0], nums[1]
        else:                               # HH:MM:SS
            h, mi, se = nums
        if mi >= 60 or se >= 60 or (m.group(1) is not None and h >= 24):
            raise JobScriptError(f"time limit {s!r}: minutes and seconds must be below 60", hint=hint)
        secs = days * 86400 + h * 3600 + mi * 60 + se
    if secs <= 0:
        raise JobScriptError(f"time limit {s!r} must be positive", hint=hint)
    return secs


def format_time(seconds: int) -> str:
    """HH:MM:SS with hours past 24 kept in the hours field (Slurm, PBS and Grid Engine all read it)."""
    h, rest = divmod(int(seconds), 3600)
    m, s = divmod(rest, 60)
    return f"{h:02d}:{m:02d}:{s:02d}"


@dataclass(frozen=True, kw_only=True)
class JobAsk:
    """What a batch job asks its scheduler for beside its size and command: JobOptions takes it from the options,
    JobRequest carries it into the script."""

    scheduler: str                      # slurm | pbs | uge
    cpus_per_node: int | None = None
    time_limit: int | str | None = None  # seconds or HH:MM:SS; None = the scheduler's default
    partition: str | None = None        # Slurm partition (PBS queue when queue is unset)
    queue: str | None = None            # PBS / Grid Engine queue (Slurm partition when partition is unset)
    group: str | None = None            # ABCI's group: Grid Engine `qsub -g GROUP`, PBS `#PBS -P GROUP`
    account: str | None = None
    log_dir: str | None = None          # where the scheduler writes stdout/stderr; must exist at start
    output: str | None = None           # explicit stdout path (wins over log_dir)
    error: str | None = None            # explicit stderr path (wins over log_dir)
    workdir: str | None = None          # cd here; None = the directory the job was submitted from
    modules: Sequence[str] = ()         # `module load NAME` lines
    resource: str | None = None         # Grid Engine: `-l RESOURCE=NODES`, whole nodes (ABCI 1.0's rt_F)
    pe: str | None = None               # Grid Engine parallel environment: `-pe PE NODES` instead of `-l resource`
    directives: Sequence[str] = ()      # extra raw directive arguments, e.g. "-l USE_SSH=1"


@dataclass(frozen=True)
class JobRequest(JobAsk):
    """One batch job: the allocation asked for and the command run inside it (pure data)."""

    job_name: str
    nodes: int
    devices_per_node: int
    device_kind: str                    # gpu | cpu | ipu
    command: tuple[str, ...]            # argv run inside the allocation (podrun launch ...)
    env: tuple[tuple[str, str], ...] = ()   # exported before the command, in this order
    site_directives: tuple[str, ...] = ()  # the cluster's own, for this job (its spec's jobs.ssh_directives)
    queue_sets_node: bool = False       # PBS: the queue sets each node's CPUs and GPUs (ABCI 3.0's rt_HF)
    ssh_port: int | None = None         # the port of sshd between a job's nodes (ABCI 1.0: 2299): an ssh config's Port
    launch_transport: str | None = None  # the --transport on the command's podrun launch (None: its engine starts it)
    comments: tuple[str, ...] = ()      # '# ...' lines under the directives (plan summary)
    agents_per_node: int = 1            # PBS's mpiprocs: the agents the launch starts on each node (one per instance)

    def __post_init__(self):
        for name in ("command", "modules", "directives", "site_directives", "comments"):
            v = getattr(self, name)
            if isinstance(v, (list, str)):
                object.__setattr__(self, name, tuple([v] if isinstance(v, str) else v))
        env = self.env.items() if isinstance(self.env, Mapping) else self.env
        object.__setattr__(self, "env", tuple((str(k), str(v)) for k, v in env))

    @property
    def time_seconds(self) -> int | None:
        return None if self.time_limit is None else parse_time(self.time_limit)

    @property
    def effective_partition(self) -> str | None:
        return self.partition or self.queue

    @property
    def effective_queue(self) -> str | None:
        return self.queue or self.partition


def _no_control(field_: str, value: str) -> None:
    m = _CONTROL.search(value)
    if m:
        what = "a newline" if m.group() in "\r\n" else f"control character {m.group()!r}"
        raise JobScriptError(f"job script {field_} {value!r} contains {what}",
                             hint="a value must fit on one line; it could otherwise inject scheduler directives")


def check_directive_value(field_: str, value: str, *, uge_pseudo: bool = False) -> str:
    """A value for a #SBATCH / #PBS / #$ line: one line, no quotes, spaces, '#' or '$'."""
    _no_control(field_, value)
    probe = _UGE_PSEUDO.sub("X", value) if uge_pseudo else value
    if not value or not _DIRECTIVE_SAFE.match(probe) or value.startswith("-"):
        bad = next((ch for ch in probe if not _DIRECTIVE_SAFE.match(ch)), value[:1])
        raise JobScriptError(
            f"job script {field_} {value!r}: {bad!r} cannot go on a scheduler directive line",
            hint="use letters, digits and _ . , : = + @ % / - (directives are parsed by the scheduler, not a shell)",
        )
    return value


def validate(req: JobRequest) -> JobRequest:
    """Check every field; raise JobScriptError (exit 2) naming the field and the bad value."""
    check_scheduler(req.scheduler)
    if req.device_kind not in DEVICE_KINDS:
        raise JobScriptError(f"unknown device kind {req.device_kind!r}", hint=f"one of: {', '.join(DEVICE_KINDS)}")
    for name in ("nodes", "devices_per_node", "agents_per_node"):
        v = getattr(req, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise JobScriptError(f"job script {name} must be a positive integer, got {v!r}")
    if req.cpus_per_node is not None and (not isinstance(req.cpus_per_node, int) or req.cpus_per_node < 1):
        raise JobScriptError(f"job script cpus_per_node must be a positive integer, got {req.cpus_per_node!r}")
    if req.time_limit is not None:
        parse_time(req.time_limit)
    check_directive_value("job name", req.job_name)
    if req.scheduler == "uge" and any(ch in req.job_name for ch in "/:@"):
        raise JobScriptError(f"job script job name {req.job_name!r}: Grid Engine job names may not contain / : @",
                             hint="use letters, digits, '_', '.', '-'")
    if req.group is not None and req.scheduler == "slurm":
        raise JobScriptError(f"--group {req.group!r} is Grid Engine's `qsub -g` and PBS's `-P` (ABCI); Slurm has no "
                             "groups", hint="charge a Slurm account with --account")
    for name, what in (("pe", "parallel environment"), ("resource", "resource request")):
        if getattr(req, name) is not None and req.scheduler != "uge":
            raise JobScriptError(f"--{name} {getattr(req, name)!r} is a Grid Engine {what}; {req.scheduler} has none",
                                 hint=f"drop --{name}, or write a Grid Engine script with --scheduler uge")
    if req.scheduler == "uge" and (req.pe is None) == (req.resource is None):
        raise JobScriptError("a Grid Engine job asks for its nodes with a parallel environment or a resource, "
                             + ("not both: --pe " + repr(req.pe) + " and --resource " + repr(req.resource)
                                if req.pe is not None else "and none was given"),
                             hint="pass --pe PE (`-pe PE N`, one slot per host) or --resource NAME (`-l NAME=N`, "
                                  "N whole nodes), or name one in the cluster spec (jobs: {pe: PE} or "
                                  "{resource: NAME}; docs/cluster-specs.md)")
    for name in ("partition", "queue", "group", "account", "resource", "pe", *_LOG_PATHS):
        v = getattr(req, name)
        if v is not None:     # Grid Engine expands its pseudo variables in the log paths
            check_directive_value(name, v, uge_pseudo=req.scheduler == "uge" and name in _LOG_PATHS)
    for d in (*req.directives, *req.site_directives):
        _no_control("directive", d)
        words = d.split()
        if not words or not words[0].startswith("-"):
            raise JobScriptError(f"directive {d!r} must start with an option such as -l or --exclusive")
        for word in words:
            if not _DIRECTIVE_SAFE.match(word):
                check_directive_value("directive", word)
    if not req.command:
        raise JobScriptError("job script has no command to run")
    for arg in req.command:
        _no_control("command argument", arg)
    for k, v in req.env:
        if not _ENV_NAME.match(k):
            raise JobScriptError(f"job script env name {k!r} is not a shell variable name",
                                 hint="names are letters, digits and _, not starting with a digit")
        _no_control(f"env {k}", v)
    for mod in req.modules:
        if not _MODULE.match(mod):
            raise JobScriptError(f"module name {mod!r} is not a module name",
                                 hint="e.g. --module cuda/12.1 --module openmpi/4.1.5")
    if req.workdir is not None:
        _no_control("workdir", req.workdir)
    for c in req.comments:
        _no_control("comment", c)
    return req
