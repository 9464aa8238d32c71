"""The agent's options (after its interpreter's part, podrun.pystart.agent) as one value: written, then read back."""
from __future__ import annotations

import argparse
import enum
from dataclasses import dataclass

from podrun.pystart import AGENT_MODULE
from podrun.wire.liveness import HEARTBEAT_MISSES, HEARTBEAT_S

GRACE_S = 5.0               # --grace: seconds between SIGTERM to the workers and SIGKILL (a failed worker's teardown)
# --interrupt-grace: seconds between a SIGINT, SIGHUP or SIGUSR1 passed on to the workers and SIGTERM, so that a
# KeyboardInterrupt handler that saves has time: torchrun's default shutdown timeout (torch.distributed.run)
INTERRUPT_GRACE_S = 30.0


def with_options(argv: list[str], *options: str) -> list[str]:
    """An agent command line (``agent_argv``: its interpreter's part, its options, ``--``, the workers' command) with
    ``options`` added after its others: the first ``--`` is the one that ends them (no option nor the boot is one)."""
    cut = argv.index("--")
    return [*argv[:cut], *options, *argv[cut:]]


class FromEnv(enum.Enum):
    """Where an agent started by a launcher (mpirun, srun) reads the launcher's rank (podrun.host.workers)."""

    INDEX = "index-from-env"   # the launcher's rank is the instance index
    RANK = "rank-from-env"     # it is a worker's global rank: run that one worker (mpirun: each worker an MPI rank)


@dataclass(frozen=True)
class RunAttempt:
    """One attempt of a run as its workers see it: the run, its plan file, where they meet, which restart it is."""

    run_id: str
    run_dir: str
    plan_path: str
    master_addr: str
    master_port: int
    restart_count: int = 0
    max_restarts: int = 0


CPU_BIND_MODES = ("none", "auto")
MAX_CPU = 1 << 16     # the highest CPU number a --cpu-bind list may name (Linux's NR_CPUS is at most 8192)


class CpuBindError(ValueError):
    """A --cpu-bind value that does not read (the CLI makes it an exit-2 error naming the option)."""


@dataclass(frozen=True)
class CpuBind:
    """--cpu-bind: ``none`` (the workers run where the agent may), ``auto`` (each local rank on its contiguous share
    of the host's cores, inside its NUMA domain: podrun.wire.worker_env.cpu_sets) or ``sets``, one core set per
    local rank (``0-3,4-7``: a comma between ranks, ``A-B`` a range, ``+`` joins ranges of one rank)."""

    mode: str = "none"                          # none | auto | list
    sets: tuple[tuple[int, ...], ...] = ()      # mode list: local rank r's cores, sorted, no repeats

    @property
    def binds(self) -> bool:
        return self.mode != "none"

    def text(self) -> str:
        """What --cpu-bind takes back (``parse(b.text()) == b``)."""
        if self.mode != "list":
            return self.mode
        return ",".join("+".join(_ranges(cores)) for cores in self.sets)

    @classmethod
    def parse(cls, text: str) -> "CpuBind":
        """``none``, ``auto`` or ``LIST``; CpuBindError for anything else (a range backwards, a core below 0)."""
        text = text.strip()
        if text in CPU_BIND_MODES:
            return cls(text)
        sets = [read_cores(item, "+") for item in text.split(",")]
        if not all(sets):
            raise CpuBindError(f"{text!r} gives local rank {sets.index(())} no core (one set per local rank, "
                               "0-3,4-7)")
        return cls("list", tuple(sets))


def read_cores(text: str, sep: str = ",") -> tuple[int, ...]:
    """Cores written as ranges (Linux's cpulist ``0-3,8``; ``sep`` between the ranges), sorted, each once; ""
    is none; CpuBindError for a part that is not N or N-M (low to high, at most MAX_CPU)."""
    cores: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(sep))):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise CpuBindError(f"{part!r} is not a core or a range of cores (N or N-M)")
        first, last = int(low), int(high) if dash else int(low)
        if last < first or last > MAX_CPU:
            raise CpuBindError(f"{part!r} is not a range of cores (0..{MAX_CPU}, low to high)")
        cores.update(range(first, last + 1))
    return tuple(sorted(cores))


def _ranges(cores: tuple[int, ...]) -> list[str]:
    """Sorted cores as ranges: (0, 1, 2, 5) -> ['0-2', '5']."""
    out: list[str] = []
    start = prev = None
    for c in (*cores, None):
        if start is not None and c != prev + 1:
            out.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if start is None:
            start = c
        prev = c
    return out


def cores_text(cores) -> str:
    """A core set as Linux's cpulist writes it: 0-3,8."""
    return ",".join(_ranges(tuple(sorted(cores))))


@dataclass(frozen=True)
class AgentArgs:
    """Every option of the agent; ``to_argv`` writes them, ``parse`` reads them back (``parse(a.to_argv()) == a``)."""

    attempt: RunAttempt
    instance: int | FromEnv          # --instance N, else the launcher's rank (--index-from-env, --rank-from-env)
    command: tuple[str, ...]         # what each worker runs
    grace: float = GRACE_S
    interrupt_grace: float = INTERRUPT_GRACE_S
    heartbeat: float = HEARTBEAT_S   # seconds between heartbeats to the controller
    # seconds of silence on stdin (no controller heartbeat) after which the workers are ended; None: no stdin watch
    stdin_timeout: float | None = HEARTBEAT_S * HEARTBEAT_MISSES
    # if this instance runs global rank 0: hold --master-port from the start and serve the run's TCPStore on it
    # (podrun.host.store), on ``listen_fd`` when given (the listening socket, inherited from the controller)
    agent_store: bool = False
    listen_fd: int | None = None
    # fork workers from this host's zygote when it runs (podrun.host.zygote); start it when it does not and
    # restart_count is below max_restarts
    warm: bool = False
    # report preflight facts (a probe line) and start workers only on a G on stdin; ``needs``: the modules whose
    # import the probe checks
    hold: bool = False
    needs: tuple[str, ...] = ()
    env_stdin: bool = False          # read the run's --env first from stdin (podrun.wire.envchannel)
    # an inherited descriptor that local rank 0 reads as its stdin (the local transport's copy of podrun's stdin);
    # every other worker reads /dev/null
    worker_stdin_fd: int | None = None
    cpu_bind: CpuBind = CpuBind()     # --cpu-bind: each worker's cores (podrun.host.workers applies it)
    # --join HOST:PORT: connect to the controller there (podrun.wire.join, the key in the environment) and speak the
    # protocol over that connection instead of stdout and stdin
    join: str | None = None
    # --join-fd N: the connection to the controller is descriptor N, joined already (a copy of `podrun launch`)
    join_fd: int | None = None

    def to_argv(self) -> list[str]:
        """The agent's options and command (what follows ``python -m podrun.host.agent``)."""
        at = self.attempt
        argv = ["--plan", at.plan_path, "--run-id", at.run_id, "--run-dir", at.run_dir,
                "--master-addr", at.master_addr, "--master-port", str(at.master_port), "--grace", _num(self.grace),
                "--interrupt-grace", _num(self.interrupt_grace),
                "--restart-count", str(at.restart_count), "--max-restarts", str(at.max_restarts),
                "--heartbeat", _num(self.heartbeat)]
        argv += ([f"--{self.instance.value}"] if isinstance(self.instance, FromEnv)
                 else ["--instance", str(self.instance)])
        argv += ["--no-stdin-watch"] if self.stdin_timeout is None else ["--stdin-timeout", _num(self.stdin_timeout)]
        for option, value in (("--agent-store", self.agent_store), ("--listen-fd", self.listen_fd),
                              ("--warm", self.warm), ("--hold", self.hold),
                              ("--needs", ",".join(self.needs) if self.needs else None), ("--env-stdin", self.env_stdin),
                              ("--worker-stdin-fd", self.worker_stdin_fd),
                              ("--cpu-bind", self.cpu_bind.text() if self.cpu_bind.binds else None),
                              ("--join", self.join), ("--join-fd", self.join_fd)):
            if value is not None and value is not False:    # a flag when True, else the option and its value
                argv += [option] if value is True else [option, str(value)]
        return argv + ["--", *self.command]

    @classmethod
    def parse(cls, argv: list[str] | None, description: str = "") -> "AgentArgs":
        """The options of ``argv`` (None: sys.argv); a malformed one exits 2 with argparse's usage."""
        ap = argparse.ArgumentParser(prog=f"python -m {AGENT_MODULE}", description=description)
        for name in ("plan", "run-id", "run-dir", "master-addr"):
            ap.add_argument(f"--{name}", required=True)
        ap.add_argument("--master-port", type=int, required=True)
        for name in ("grace", "interrupt-grace", "heartbeat", "stdin-timeout"):
            ap.add_argument(f"--{name}", type=float)
        for name in ("restart-count", "max-restarts", "listen-fd", "worker-stdin-fd", "join-fd"):
            ap.add_argument(f"--{name}", type=int)
        for name in ("no-stdin-watch", "agent-store", "warm", "hold", "env-stdin"):
            ap.add_argument(f"--{name}", action="store_true")
        ap.add_argument("--needs", default="", metavar="MOD,...")
        ap.add_argument("--cpu-bind", metavar="auto|LIST")
        ap.add_argument("--join", metavar="HOST:PORT")
        g = ap.add_mutually_exclusive_group(required=True)
        g.add_argument("--instance", type=int)
        for source in FromEnv:
            g.add_argument(f"--{source.value}", dest="instance", action="store_const", const=source)
        ap.add_argument("command", nargs=argparse.REMAINDER)
        ns = {k: v for k, v in vars(ap.parse_args(argv)).items() if v is not None}   # None: the default
        command = ns.pop("command")
        command = command[1:] if command[:1] == ["--"] else command
        if not command:
            ap.error("no command given after --")
        attempt = RunAttempt(ns.pop("run_id"), ns.pop("run_dir"), ns.pop("plan"), ns.pop("master_addr"),
                             ns.pop("master_port"), ns.pop("restart_count", 0), ns.pop("max_restarts", 0))
        if ns.pop("no_stdin_watch"):
            ns["stdin_timeout"] = None
        needs = tuple(m for m in ns.pop("needs").split(",") if m)
        if "cpu_bind" in ns:
            try:
                ns["cpu_bind"] = CpuBind.parse(ns["cpu_bind"])
            except CpuBindError as exc:
                ap.error(f"--cpu-bind: {exc}")
        return cls(attempt, command=tuple(command), needs=needs, **ns)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)
