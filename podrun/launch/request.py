"""LaunchRequest: everything a launch will run, per host, built purely from a plan and options.

What --dry-run prints is produced from this object by the same functions that the transports use
to run it: ``shell_command(i)`` is the exact command line each host runs, ``worker_envs(i)`` the
exact variables the agent sets for each worker on top of the host's environment.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from podrun.plan.model import Plan

AGENT_MODULE = "podrun.launch.agent"
NO_WORKDIR = 97           # the exit code of a host's command line when the working directory is missing
SECRET_RE = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIAL", re.IGNORECASE)
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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


@dataclass(frozen=True)
class LaunchRequest:
    run_id: str
    run_dir: str                        # absolute path; must be visible on every host (shared filesystem)
    plan: "Plan"
    plan_path: str                      # run_dir/plan.json
    command: tuple[str, ...]            # what each worker runs
    python: str                         # python on the hosts (default: the controller's sys.executable)
    workdir: str                        # working directory on the hosts
    master_addr: str
    master_port: int
    transport: str = "local"
    grace: float = 5.0
    keepalive: float = 5.0
    restart_count: int = 0
    max_restarts: int = 0
    env: tuple[tuple[str, str], ...] = ()   # --env NAME=VALUE, set for the agent and its workers
    instances: tuple[InstanceLaunch, ...] = ()
    ssh: SSHOptions = field(default_factory=SSHOptions)
    mpi_args: tuple[str, ...] = ()      # --mpi-args: passed through to mpirun (transport mpirun, engine horovod)
    poprun: object | None = None        # PoprunOptions for --engine poprun (podrun.launch.engines.poprun)
    store_relay: bool = True            # rank 0's agent serves the store on master_port (podrun.launch.agent_store)
    listen_fd: int | None = None        # the controller's socket on master_port, for a local rank 0 agent to serve on
    preflight: bool = True              # check every host before anything starts (False: --no-preflight)

    def instance(self, index: int) -> InstanceLaunch:
        return self.instances[index]

    def agent_argv(self, index: int | None, *, stdin_watch: bool = True, hold: bool = False) -> list[str]:
        """The agent command line; index None means --index-from-env (mpirun/srun ranks); ``hold``: the
        agent reports its preflight facts and starts workers only on a go from the controller."""
        argv = [self.python, "-m", AGENT_MODULE,
                "--plan", self.plan_path, "--run-id", self.run_id, "--run-dir", self.run_dir,
                "--master-addr", self.master_addr, "--master-port", str(self.master_port),
                "--grace", _num(self.grace), "--restart-count", str(self.restart_count)]
        argv += ["--index-from-env"] if index is None else ["--instance", str(index)]
        argv += ["--stdin-timeout", _num(self.keepalive)] if stdin_watch else ["--no-stdin-watch"]
        argv += ["--store-relay"] if self.store_relay else []
        argv += ["--listen-fd", str(self.listen_fd)] if self.listen_fd is not None and index == 0 else []
        argv += ["--hold"] if hold else []
        return argv + ["--", *self.command]

    def rendezvous_ports(self) -> tuple[int, ...]:
        """The ports a preflight must find free on the master host: the rendezvous port, unless the
        controller already holds it (``listen_fd``)."""
        return () if self.listen_fd is not None else (self.master_port,)

    def pass_fds(self, index: int) -> tuple[int, ...]:
        """The controller's file descriptors that the agent of instance ``index`` inherits (see ``listen_fd``)."""
        return (self.listen_fd,) if self.listen_fd is not None and index == 0 else ()

    def env_prefix(self) -> list[str]:
        """``env NAME=VALUE ...`` for the user's --env (empty when there is none)."""
        return ["env", *(f"{k}={v}" for k, v in self.env)] if self.env else []

    def shell_command(self, index: int | None, *, stdin_watch: bool = True, redact: bool = False,
                      hold: bool = False) -> str:
        """The exact shell line a host runs: cd to the workdir, then exec the agent (quoted with shlex)."""
        env = self.env_prefix()
        if redact:
            env = [redact_assignment(a) for a in env]
        words = env + self.agent_argv(index, stdin_watch=stdin_watch, hold=hold)
        return f"cd {shlex.quote(self.workdir)} || exit {NO_WORKDIR}; exec " + " ".join(shlex.quote(w) for w in words)

    def worker_envs(self, index: int) -> list[dict[str, str]]:
        """The variables the agent of instance ``index`` sets for each of its workers."""
        from podrun.launch.agent import compute_worker_envs

        return compute_worker_envs(self.plan, index, run_id=self.run_id, run_dir=self.run_dir,
                                   plan_path=self.plan_path, master_addr=self.master_addr,
                                   master_port=self.master_port, restart_count=self.restart_count,
                                   store_relay=self.store_relay)

    def for_restart(self, restart_count: int, master_port: int) -> "LaunchRequest":
        return replace(self, restart_count=restart_count, master_port=master_port)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def redact(env: dict[str, str]) -> dict[str, str]:
    """A copy with the values of secret-looking names (TOKEN, SECRET, PASSWORD, KEY, CREDENTIAL) hidden."""
    return {k: ("<redacted>" if SECRET_RE.search(k) else v) for k, v in env.items()}


def redact_assignment(word: str) -> str:
    name, sep, _ = word.partition("=")
    return f"{name}=<redacted>" if sep and SECRET_RE.search(name) else word


def parse_env_options(items: tuple[str, ...] | list[str]) -> tuple[tuple[str, str], ...]:
    """--env NAME=VALUE items -> pairs; a malformed one is a LaunchError naming it."""
    from podrun.errors import LaunchError

    out = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not ENV_NAME_RE.match(name):
            raise LaunchError(f"--env {item!r} is not NAME=VALUE",
                              hint="write e.g. --env NCCL_DEBUG=INFO (a name of letters, digits and _)")
        out.append((name, value))
    return tuple(out)
