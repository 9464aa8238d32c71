"""LaunchRequest: everything a launch will run, per host, built purely from a plan and options.

What --dry-run prints is produced from this object by the same functions that the transports use
to run it: ``shell_command(i)`` is the exact command line each host runs, ``worker_envs(i)`` the
exact variables the agent sets for each worker on top of the host's environment. ``env`` (--env) is never
part of a command line: it reaches the agents over their stdin (``--env-stdin``, podrun.wire.envchannel) or
in their launcher's environment (only the names on its command line).
"""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from podrun import pystart
from podrun.errors import LaunchError
from podrun.redaction import ENV_NAME_RE, redact_argv, remember_secret, secret_name
from podrun.launch.instance_logs import RankFiles
from podrun.wire.agent_args import (GRACE_S, INTERRUPT_GRACE_S, MAX_CPU, AgentArgs, CpuBind, FromEnv,
                                    RunAttempt)
from podrun.wire.liveness import FIRST_HEARTBEAT_S, HEARTBEAT_MISSES, HEARTBEAT_S, Liveness

if TYPE_CHECKING:  # pragma: no cover
    from podrun.launch.transports import TransportKind
    from podrun.plan.model import Plan

NO_WORKDIR = 97           # the exit code of a host's command line when the working directory is missing


@dataclass(frozen=True)
class InstanceLaunch:
    """One instance agent: its index and the host it runs on."""

    index: int
    host: str


@dataclass(frozen=True)
class SSHOptions:
    config_path: str | None = None      # --ssh-config, else ~/.ssh/config when it exists
    host_key_check: bool = True         # False: --no-host-key-check
    max_concurrency: int = 64           # ssh handshakes in flight at once
    connect_timeout: float = 10.0
    client: str = "auto"                # --ssh-client: openssh (the system's ssh), paramiko, or auto


@dataclass(frozen=True, kw_only=True)
class LaunchRequest(RunAttempt):
    """One attempt (RunAttempt: its run_dir absolute and visible on every host, plan_path run_dir/plan.json) and
    everything it runs."""

    plan: "Plan"
    command: tuple[str, ...]            # what each worker runs
    python: str                         # python on the hosts (default: the controller's sys.executable)
    workdir: str                        # working directory on the hosts
    transport: str = "local"
    grace: float = GRACE_S
    interrupt_grace: float = INTERRUPT_GRACE_S   # after SIGINT/SIGHUP/SIGUSR1 to the workers, before SIGTERM
    heartbeat: float = HEARTBEAT_S      # seconds between heartbeats, both ways (podrun.wire.liveness)
    keepalive: float = HEARTBEAT_S * HEARTBEAT_MISSES   # seconds of silence after which a host is lost, both ways
    agent_keepalive: float | None = None   # an agent's bound on the controller's silence (None: keepalive)
    env: tuple[tuple[str, str], ...] = ()   # --env NAME=VALUE, set for the agent and its workers (never on argv)
    instances: tuple[InstanceLaunch, ...] = ()
    ssh: SSHOptions = field(default_factory=SSHOptions)
    mpi_args: tuple[str, ...] = ()      # --mpi-args: passed through to mpirun (transport mpirun, engine horovod)
    poprun: object | None = None        # PoprunOptions for --engine poprun (podrun.launch.engines.poprun)
    agent_store: bool = True            # rank 0's agent serves the store on master_port (podrun.host.store)
    listen_fd: int | None = None        # the controller's socket on master_port, for a local rank 0 agent to serve on
    preflight: bool = True              # check every host before anything starts (False: --no-preflight)
    straggler_timeout: float | None = None  # seconds the others get after a worker exits 0 (None: no bound)
    rank_files: RankFiles = RankFiles()    # torchrun's --tee/--redirects: each rank's streams to files of its own
    replanned: bool = False             # an elastic re-plan made this attempt's hosts (podrun.elastic.replan)
    needs: tuple[str, ...] = ()         # modules every worker imports; a held agent reports those it lacks
    data_interface: str | None = None   # --data-interface: the workers' network (gloo, NCCL, MASTER_ADDR)
    # what MASTER_ADDR was derived from when no --master-addr was given: "" (the host of instance 0 as written),
    # "ssh" (its HostName in the ssh config, an IP address), "data-interface" (its address there, asked at launch)
    master_derived: str = ""
    warm: bool = False                  # agents fork workers from a zygote per host (podrun.host.zygote): restarts,
    #                                     and a first attempt's several workers on a host
    cpu_bind: CpuBind = CpuBind()       # --cpu-bind: each agent binds its workers to their cores on its host
    # the cores of a host as the controller knows them (the cluster spec's, this machine's for a local run), so
    # that a bound run's --dry-run shows each worker's cores: (cores, NUMA domains), None when unknown
    host_cores: tuple[tuple[int, ...], ...] | None = None
    # agents that join (podrun.wire.join): the address they are given, HOST or HOST:PORT (None: this machine's address
    # on the route to the first other host, else its host name; a port picked at start), and how long the controller
    # waits for each before it is lost (--join-window)
    join_address: str | None = None
    join_window: float = FIRST_HEARTBEAT_S
    # under mpirun: one MPI rank per worker, each under an agent of its own (--mpi-ranks, the horovod engine); else
    # one agent per instance that joins the controller and starts the instance's workers
    mpi_ranks: bool = False
    #: what ``transport`` can do for this request (podrun.launch.transports: its mode for ``mpi_ranks``), looked up
    #: once when the request is made
    kind: "TransportKind" = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        from podrun.launch.transports import transport_of

        object.__setattr__(self, "kind", transport_of(self.transport).for_request(self.mpi_ranks))
        for name, value in self.env:     # the run's keys too (PODRUN_SNAPSHOT_KEY): hidden wherever they show up
            if secret_name(name):
                remember_secret(value)

    def checks_hosts(self) -> bool:
        """Whether this attempt checks its hosts before any worker starts: the first attempt, and every
        attempt on a re-planned set of hosts (a spare is first contacted there); never with --no-preflight."""
        return self.preflight and (self.restart_count == 0 or self.replanned)

    @property
    def liveness(self) -> Liveness:
        return Liveness(self.heartbeat, self.keepalive, self.agent_keepalive)

    def agent_argv(self, index: int | None, *, stdin_watch: bool = True, hold: bool = False,
                   per_worker: bool = False, env_stdin: bool = False, worker_stdin_fd: int | None = None,
                   lean: bool = False, join: str | None = None) -> list[str]:
        """The agent command line; index None means --index-from-env (mpirun/srun ranks), or with
        ``per_worker`` --rank-from-env (each launcher rank is one worker); ``hold``: the agent reports
        its preflight facts and starts workers only on a go from the controller; ``env_stdin``: the
        transport writes ``env_message()`` first on the agent's stdin (--env-stdin, when there is an env);
        ``worker_stdin_fd``: the agent's inherited descriptor that its local rank 0 reads as stdin (the local
        transport's copy of podrun's own stdin); ``lean``: with this python (the same path on every host) the agent is
        started isolated and without site (``-I -S``: no site-packages scan, no .pth file run), this podrun's own
        directory first on its path, and on a host where this podrun is not at that path started safe
        (podrun.pystart.lean_boot); without it safe (the host's own podrun, never the working directory's);
        ``join``: the address the agent joins (--join), its key in its environment. Every agent but one a worker (``per_worker``)
        forks its several workers from its host's zygote when the run is warm."""
        source = FromEnv.RANK if per_worker else FromEnv.INDEX
        args = AgentArgs(self.attempt, source if index is None else index, self.command, grace=self.grace,
                         interrupt_grace=self.interrupt_grace, heartbeat=self.heartbeat,
                         stdin_timeout=self.liveness.controller_silence if stdin_watch else None,
                         agent_store=self.agent_store, listen_fd=self.listen_fd if index == 0 else None,
                         warm=self.warm and not per_worker, hold=hold, needs=self.needs if hold else (),
                         env_stdin=env_stdin and bool(self.env), worker_stdin_fd=worker_stdin_fd,
                         cpu_bind=self.cpu_bind, join=join)
        return pystart.agent(self.python, args.to_argv(), lean=lean)

    @property
    def attempt(self) -> RunAttempt:
        return RunAttempt(self.run_id, self.run_dir, self.plan_path, self.master_addr, self.master_port,
                          self.restart_count, self.max_restarts)

    def rendezvous_ports(self) -> tuple[int, ...]:
        """The ports a preflight must find free on the master host: the rendezvous port, unless the
        controller already holds it (``listen_fd``)."""
        return () if self.listen_fd is not None else (self.master_port,)

    def pass_fds(self, index: int) -> tuple[int, ...]:
        """The controller's file descriptors that the agent of instance ``index`` inherits (see ``listen_fd``)."""
        return (self.listen_fd,) if self.listen_fd is not None and index == 0 else ()

    def env_names(self) -> list[str]:
        """The names of --env, in order (what a launcher's command line may carry: ``-x NAME``)."""
        return [k for k, _ in self.env]

    def env_message(self) -> bytes:
        """What the controller writes first on the stdin of an agent started with ``--env-stdin``."""
        from podrun.wire.envchannel import encode

        return encode(self.env)

    def shell_command(self, index: int | None, *, stdin_watch: bool = True, redact: bool = False,
                      hold: bool = False, per_worker: bool = False, env_stdin: bool = False,
                      join: str | None = None) -> str:
        """The exact shell line a host runs: cd to the workdir, then exec the agent, started lean (quoted with shlex).
        It holds no --env value: ``env_stdin`` adds --env-stdin (the values follow on the agent's stdin);
        without it they come in the environment of whatever runs the line (mpirun, srun, poprun)."""
        argv = self.agent_argv(index, stdin_watch=stdin_watch, hold=hold, per_worker=per_worker,
                               env_stdin=env_stdin, join=join, lean=True)
        if redact:
            cut = len(argv) - len(self.command)
            argv = argv[:cut] + redact_argv(argv[cut:])
        return f"cd {shlex.quote(self.workdir)} || exit {NO_WORKDIR}; exec " + " ".join(shlex.quote(w) for w in argv)

    def worker_envs(self, index: int) -> list[dict[str, str]]:
        """The variables the agent of instance ``index`` sets for each of its workers
        (podrun.wire.worker_env.instance_envs; OMP_NUM_THREADS is left to the agent, which knows its host's cores,
        but for a bound run on a host whose cores are known here: ``host_cores``, its NUMA domains)."""
        from podrun.wire.worker_env import cpu_sets, instance_envs, workers_per_instance

        bound = cores = None
        if self.cpu_bind.binds and self.host_cores is not None:
            cores = sorted(c for dom in self.host_cores for c in dom)
            bound = cpu_sets(self.cpu_bind, cores, workers_per_instance(self.plan), self.host_cores)
        return instance_envs(self.plan, index, self.attempt, agent_store=self.agent_store, host_env=dict(self.env),
                             cpus=None if cores is None else len(cores), bound=bound)

    def for_restart(self, restart_count: int, master_port: int) -> "LaunchRequest":
        return replace(self, restart_count=restart_count, master_port=master_port)


def instances_of(plan: "Plan") -> tuple[InstanceLaunch, ...]:
    """The instance agents of ``plan``: one per placed instance, on its host."""
    return tuple(InstanceLaunch(p.index, p.host) for p in plan.placement)


def decide_cpu_bind(text: str | None, plan: "Plan", cpu, here: bool, spec: str = ""
                    ) -> tuple[CpuBind, tuple[tuple[int, ...], ...] | None, str | None]:
    """--cpu-bind for a run of ``plan``: the binding, a host's cores as the controller knows them (this machine's
    when ``here``, else the cluster spec's ``cpu`` (HostCpuSpec or None) from ``spec``), cut into its NUMA domains,
    and what --dry-run says of it. A LaunchError (exit 2) for a value that does not read, or a list that does not
    give one set per local rank or names a core those cores lack."""
    from podrun.wire.agent_args import CpuBindError, cores_text
    from podrun.wire.worker_env import cpu_sets, numa_domains, workers_per_instance

    try:
        bind = CpuBind() if text is None else CpuBind.parse(text)
    except CpuBindError as exc:
        raise LaunchError(f"--cpu-bind {text}: {exc}", hint="give auto, none, or one core set per local rank: "
                                                              "--cpu-bind 0-3,4-7") from None
    if not bind.binds:
        return bind, None, None
    cores = sorted(os.sched_getaffinity(0)) if here else None if cpu is None else list(range(cpu.cores))
    wpi = workers_per_instance(plan)
    domains = None if cores is None else tuple(numa_domains(cores, 1 if cpu is None else cpu.numa_nodes))
    try:
        sets = cpu_sets(bind, range(MAX_CPU + 1) if cores is None else cores, wpi, domains)
    except ValueError as exc:
        where = "this machine" if here else f"a host of {spec}"
        raise LaunchError(f"--cpu-bind {text} on {where}: {exc}", hint="one set per local rank of cores the host "
                          "has, e.g. --cpu-bind 0-3,4-7, or --cpu-bind auto") from None
    if cores is None:
        return bind, None, (f"--cpu-bind {bind.text()}: each host's agent binds its {wpi} worker(s) by the cores it "
                            f"may run on (the cluster spec {spec} gives no cpu.cores)")
    shown = ", ".join(f"{r}: {cores_text(c)}" for r, c in enumerate(sets))
    return bind, domains, (f"--cpu-bind {bind.text()}: local rank -> cores {shown} (on "
                           f"{'this machine' if here else f'{len(cores)} cores of {spec}'}; each host's agent binds "
                           "by the cores it may run on and its NUMA nodes)")


def parse_env_options(items: tuple[str, ...] | list[str]) -> tuple[tuple[str, str], ...]:
    """--env NAME=VALUE items -> pairs; a bare ``--env NAME`` takes NAME's value from podrun's own environment, so that a secret need not be typed on podrun's command line. The values of secret-named items
    and of bare names are hidden from here on wherever podrun shows or records text (podrun.redaction). A
    malformed item, or a bare name that is not set, is a LaunchError naming it."""
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        if not ENV_NAME_RE.match(name):
            raise LaunchError(f"--env {item!r} is not NAME=VALUE nor NAME",
                              hint="write e.g. --env NCCL_DEBUG=INFO, or --env HF_TOKEN to pass podrun's own "
                                   "HF_TOKEN (a name of letters, digits and _)")
        if not sep:
            if name not in os.environ:
                raise LaunchError(f"--env {name}: {name} is not set in podrun's environment",
                                  hint=f"export {name} before podrun launch, or write --env {name}=VALUE")
            value = os.environ[name]
        if not sep or secret_name(name):
            remember_secret(value)
        out.append((name, value))
    return tuple(out)
