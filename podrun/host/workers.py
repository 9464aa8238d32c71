"""An instance's workers on its agent: which they are and their env here, what they inherit, a failed one's error."""
from __future__ import annotations

import contextlib
import json
import os
import socket

from podrun import safefs
from podrun.errors import PodrunError
from podrun.wire import protocol
from podrun.wire.agent_args import AgentArgs, FromEnv, read_cores
from podrun.wire.liveness import FIRST_HEARTBEAT_S

ERROR_TRACEBACK_LINES = 40   # of a worker's @record traceback, sent to the controller
ERROR_MESSAGE_CHARS = 2000
INDEX_ENV = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")   # a launcher's rank of this process


def read_env_stdin() -> None:
    """--env-stdin: the run's --env values, first on stdin (podrun.wire.envchannel), into this environment."""
    from podrun.wire.envchannel import EnvMessageError, read as read_env

    try:
        os.environ.update(read_env(0, FIRST_HEARTBEAT_S))
    except (EnvMessageError, OSError) as exc:
        raise SystemExit(f"podrun agent: --env-stdin: {exc}") from None


def instance_workers(args: AgentArgs) -> tuple[int, list[int] | None, int | None, list[dict[str, str]]]:
    """(the instance index, the local ranks this agent runs (None: all of them), the local rank that tags the
    agent's own lines (--rank-from-env), their env contracts) from the plan file and --instance,
    --index-from-env or --rank-from-env. The env contract (podrun.wire.worker_env.instance_envs) is the one of
    this host: its environment, the cores this agent may use and, in a run over several hosts, gloo's interface
    where this host's name resolves to loopback (podrun.wire.probe.gloo_interface)."""
    from podrun.plan.model import Plan
    from podrun.wire.probe import gloo_interface
    from podrun.wire.worker_env import (CPU_SET_ENV, CPUS_ENV, cpu_sets, instance_envs, worker_of_rank,
                                        workers_per_instance)

    at = args.attempt
    try:
        plan = Plan.from_dict(json.loads(safefs.read_trusted(at.plan_path, "plan", limit=safefs.RECORD_LIMIT)))
    except (PodrunError, OSError, ValueError) as exc:
        raise SystemExit(f"podrun agent: --plan: {exc}") from None
    local_ranks = agent_rank = None
    if args.instance is FromEnv.RANK:
        rank = instance_index_from_env(flag="--rank-from-env")
        try:
            index, agent_rank = worker_of_rank(plan, rank)
        except ValueError as exc:
            raise SystemExit(f"podrun agent: --rank-from-env: {exc}") from None
        local_ranks = [agent_rank]
    else:
        index = instance_index_from_env() if args.instance is FromEnv.INDEX else args.instance
    several = len({p.host for p in plan.placement}) > 1
    for name in (CPU_SET_ENV, CPUS_ENV):      # an outer run's, inherited: this run's workers get their own
        os.environ.pop(name, None)
    cores = sorted(os.sched_getaffinity(0))
    try:
        bound = cpu_sets(args.cpu_bind, cores, workers_per_instance(plan), numa_cpus())
    except ValueError as exc:
        raise SystemExit(f"podrun agent: --cpu-bind {args.cpu_bind.text()} on {socket.gethostname()}: {exc}") from None
    envs = instance_envs(plan, index, at, agent_store=args.agent_store, host_env=os.environ, cpus=len(cores),
                         gloo_ifname=gloo_interface(at.master_addr) if several else None, bound=bound)
    if local_ranks is not None:
        envs = [envs[lr] for lr in local_ranks]
    return index, local_ranks, agent_rank, envs


NUMA_ROOT = "/sys/devices/system/node"


def numa_cpus(root: str = NUMA_ROOT) -> list[tuple[int, ...]]:
    """This host's NUMA nodes, each its CPUs (node*/cpulist), in node order; [] where the kernel lists none."""
    nodes = []
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            if name.startswith("node") and name[4:].isdigit():
                with contextlib.suppress(OSError, ValueError):
                    with open(os.path.join(root, name, "cpulist"), encoding="ascii") as f:
                        nodes.append((int(name[4:]), read_cores(f.read())))
    return [cpus for _, cpus in sorted(nodes)]


def bind_worker(env: dict[str, str]):
    """The cores ``env`` binds its worker to (podrun.wire.worker_env.CPU_SET_ENV), or None."""
    from podrun.wire.worker_env import CPU_SET_ENV

    text = env.get(CPU_SET_ENV)
    return read_cores(text) or None if text else None


def instance_index_from_env(environ=os.environ, flag: str = "--index-from-env") -> int:
    """The launcher's rank of this process (Open MPI, PMIx, PMI, Slurm)."""
    for name in INDEX_ENV:
        if environ.get(name, "").isdigit():
            return int(environ[name])
    raise SystemExit(f"podrun agent: {flag} but none of {', '.join(INDEX_ENV)} is set")


def read_error_file(path: str) -> protocol.WorkerError | None:
    """What torch's ``@record`` wrote to TORCHELASTIC_ERROR_FILE, or None.

    The file is JSON, ``{"message": {"message": "Type: text", "extraInfo": {"py_callstack": ...}}}``
    (or ``{"message": "text"}``); the traceback is cut to its last ERROR_TRACEBACK_LINES lines.
    """
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    msg = data.get("message") if isinstance(data, dict) else None
    tb = ""
    if isinstance(msg, dict):
        extra = msg.get("extraInfo") if isinstance(msg.get("extraInfo"), dict) else {}
        tb = str(extra.get("py_callstack") or "")
        msg = msg.get("message")
    if msg is None:
        return None
    lines = tb.rstrip("\n").splitlines()[-ERROR_TRACEBACK_LINES:]
    return protocol.WorkerError(str(msg)[:ERROR_MESSAGE_CHARS], tuple(l[:ERROR_MESSAGE_CHARS] for l in lines), path)


def launcher_fds(environ) -> tuple[int, ...]:
    """File descriptors the worker needs to join its launcher's world: MPICH's hydra hands each rank its
    PMI connection as PMI_FD (Open MPI's PMIx needs only variables)."""
    fd = environ.get("PMI_FD", "")
    if not fd.isdigit():
        return ()
    try:
        os.fstat(int(fd))
    except OSError:
        return ()
    return (int(fd),)


def fresh_error_file(path: str | None) -> None:
    """Make the error file's directory and remove a file a previous attempt left there."""
    if not path:
        return
    with contextlib.suppress(OSError, PodrunError):
        safefs.make_dirs(os.path.dirname(path), "error file directory")   # private, as the run dir
        os.unlink(path)
