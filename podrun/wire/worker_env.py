"""The env contract: every variable a worker sees, derived from the plan, and the popdist and horovod views of it.

One home for the names: the agent sets them (``instance_envs``), ``--dry-run`` and env.json print them
(the same function), the poprun and horovod engines take their views from here, and podrun.runtime
reads them back through ``PODRUN_FIELDS`` / ``POPDIST_FIELDS``. No torch, no I/O.
"""
from __future__ import annotations

import os
from dataclasses import asdict
from typing import TYPE_CHECKING, Mapping, Sequence

from podrun.errors import PlanError
from podrun.rundir.layout import ERRORS, snapshot_dir
from podrun.wire.agent_args import cores_text

if TYPE_CHECKING:  # pragma: no cover
    from podrun.plan.model import Plan
    from podrun.wire.agent_args import CpuBind, RunAttempt

# WorkerInfo field (podrun.runtime) -> the PODRUN_* name that carries it
PODRUN_FIELDS: dict[str, str] = {
    "run_id": "PODRUN_RUN_ID",
    "run_dir": "PODRUN_RUN_DIR",
    "plan_path": "PODRUN_PLAN",
    "num_instances": "PODRUN_NUM_INSTANCES",
    "instance_index": "PODRUN_INSTANCE_INDEX",
    "num_replicas": "PODRUN_NUM_REPLICAS",
    "local_replicas": "PODRUN_LOCAL_REPLICAS",
    "replica_offset": "PODRUN_REPLICA_OFFSET",
    "devices_per_replica": "PODRUN_DEVICES_PER_REPLICA",
    "local_batch": "PODRUN_LOCAL_BATCH",
    "grad_accum": "PODRUN_GRAD_ACCUM",
    "global_batch": "PODRUN_GLOBAL_BATCH",
    "restart_count": "PODRUN_RESTART_COUNT",
    "snapshot_dir": "PODRUN_SNAPSHOT_DIR",
}
PODRUN_NAMES = tuple(PODRUN_FIELDS.values())
# the variable that tells podrun.runtime a worker was started by podrun
PODRUN_MARKER = PODRUN_FIELDS["num_replicas"]

# WorkerInfo field -> torchrun's name (torch.distributed.run sets the same ones)
TORCHRUN_FIELDS: dict[str, str] = {
    "rank": "RANK",
    "local_rank": "LOCAL_RANK",
    "world_size": "WORLD_SIZE",
    "local_world_size": "LOCAL_WORLD_SIZE",
    "node_rank": "GROUP_RANK",
    "master_addr": "MASTER_ADDR",
    "master_port": "MASTER_PORT",
}
# What torchrun's agent sets besides (torch.distributed.elastic LocalElasticAgent): podrun runs one role
# ("default", torchrun's), so a worker's role rank and role world are its global rank and world size.
TORCHELASTIC_NAMES = (
    "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE",
)
TORCHRUN_NAMES = tuple(TORCHRUN_FIELDS.values()) + TORCHELASTIC_NAMES
ROLE_NAME = "default"

# WorkerInfo field -> what popdist reads on IPU (Graphcore's PopDist; poprun sets the same names), so
# Graphcore example scripts run unchanged. One name per popdist query.
POPDIST_FIELDS: dict[str, str] = {
    "num_instances": "POPDIST_NUM_INSTANCES",          # popdist.getNumInstances()
    "instance_index": "POPDIST_INSTANCE_INDEX",        # popdist.getInstanceIndex()
    "num_replicas": "POPDIST_NUM_TOTAL_REPLICAS",      # popdist.getNumTotalReplicas()
    "local_replicas": "POPDIST_NUM_LOCAL_REPLICAS",    # popdist.getNumLocalReplicas()
    "replica_offset": "POPDIST_REPLICA_INDEX_OFFSET",  # popdist.getReplicaIndexOffset()
    "devices_per_replica": "POPDIST_NUM_IPUS_PER_REPLICA",  # with the local replicas, getDeviceId()
}
POPDIST_NAMES = tuple(POPDIST_FIELDS.values())

# a worker's share of its host's cores (its bound set's size, else the cores shared by the host's workers): what
# OMP_NUM_THREADS defaults to, and what the recipes' runner sets torch's threads from (podrun.train.setup)
CPUS_ENV = "PODRUN_CPUS"
# a bound worker's cores (--cpu-bind), as Linux's cpulist writes them: the agent (or the zygote's fork) sets them
# as its affinity before the worker runs
CPU_SET_ENV = "PODRUN_CPU_SET"
# what the agent tells a worker's Python processes (podrun's sitecustomize reads these names itself: it imports no
# podrun module but safefs): the directory its stacks go to and the signal that dumps them (podrun.host.stackdump),
# and the largest write one message of its output sockets takes
STACK_DIR_ENV, STACK_SIGNAL_ENV, OUTPUT_CHUNK_ENV = "PODRUN_STACK_DIR", "PODRUN_STACK_SIGNAL", "PODRUN_OUTPUT_CHUNK"
PROGRESS_FD_ENV = "PODRUN_PROGRESS_FD"      # the worker's end of its progress pipe (podrun.runtime.progress)
INPLACE_PLAN_ENV = "PODRUN_INPLACE_PLAN"    # the file a worker's new plans come in (podrun.runtime.inplace)


def cpu_share(environ: Mapping[str, str] | None = None) -> int | None:
    """A worker's share of its host's cores as podrun set it (CPUS_ENV in ``environ``, else this process's
    environment); None where it set none."""
    share = (os.environ if environ is None else environ).get(CPUS_ENV, "")
    return int(share) if share.isdigit() and int(share) > 0 else None

# The signals podrun handles and passes on to the workers as they are (podrun.launch.supervisor.STOP_SIGNALS,
# podrun.wire.protocol.STOP_TOKENS, the agent's own handlers), in torchrun's variable for its own list
SIGNALS_HANDLED = "SIGTERM,SIGINT,SIGHUP,SIGUSR1"
# What --data-interface NAME (or a cluster spec's data_interface) sets for every worker: the interface gloo
# and NCCL open their sockets on
DATA_INTERFACE_NAMES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def cpus_here(local_world_size: int = 1) -> int:
    """The cores this process may run on: podrun's share (CPUS_ENV, --cpu-bind's set) where it set one, else its
    affinity shared by the ``local_world_size`` ranks on its host (at least one core)."""
    share = cpu_share()
    return share if share is not None else max(1, len(os.sched_getaffinity(0)) // max(1, local_world_size))


def data_interface_env(name: str | None) -> tuple[tuple[str, str], ...]:
    """(NAME, interface) pairs for --data-interface; () without one."""
    return () if name is None else tuple((n, name) for n in DATA_INTERFACE_NAMES)


# Every worker is a client of the store that rank 0's agent hosts (podrun.host.store), as under torchrun
AGENT_STORE_NAME = "TORCHELASTIC_USE_AGENT_STORE"

# The run's secret (made once per run by the controller, podrun.launch.run.build_request, and passed to the agents
# and workers among the --env pairs): the slots' HMAC key and the source of the directory's unguessable part. No
# key, no snapshots. Its name matches the redaction by name (podrun.redaction.secret_name).
SNAPSHOT_KEY_NAME = "PODRUN_SNAPSHOT_KEY"


def is_ipu(plan: "Plan") -> bool:
    return str(plan.device_kind).startswith("ipu")


def workers_per_instance(plan: "Plan") -> int:
    """One worker per local replica on CPU/GPU; one per instance on IPU (poptorch drives its replicas)."""
    return 1 if is_ipu(plan) else plan.replicas_per_instance


def world_size(plan: "Plan") -> int:
    return plan.instances * workers_per_instance(plan)


def worker_of_rank(plan: "Plan", rank: int) -> tuple[int, int]:
    """(instance, local rank) of global rank ``rank``: ranks fill an instance before the next."""
    wpi = workers_per_instance(plan)
    if not 0 <= rank < world_size(plan):
        raise ValueError(f"rank {rank} out of range for a world of {world_size(plan)} workers")
    return rank // wpi, rank % wpi


def error_file(run_dir: str, instance_index: int, local_rank: int) -> str:
    """TORCHELASTIC_ERROR_FILE of one worker: where torch's ``@record`` writes its exception as JSON."""
    return os.path.join(run_dir, ERRORS, f"worker-{instance_index}-{local_rank}.json")


def omp_num_threads(plan: "Plan", cpus: int) -> int:
    """OMP_NUM_THREADS when the user did not set it: the host's cores shared by its workers.

    torchrun sets 1 whenever a node runs more than one worker, which leaves cores idle when there are
    fewer workers than cores (2 GPU workers on a 64-core node); the cores' share agrees with torchrun
    where torchrun's choice is right (one worker per core: 1; one worker per host: every core) and
    never oversubscribes the host.
    """
    return max(1, cpus // (plan.instances_per_host * workers_per_instance(plan)))


def numa_domains(cores: Sequence[int], n: int) -> list[tuple[int, ...]]:
    """``cores`` (sorted) cut into ``n`` contiguous domains of equal size (the last takes a remainder): a host's
    NUMA nodes when it does not list them itself."""
    cores = sorted(cores)
    n = max(1, min(n, len(cores)))
    size = len(cores) // n
    return [tuple(cores[i * size:(i + 1) * size if i < n - 1 else len(cores)]) for i in range(n)]


def cpu_sets(bind: "CpuBind", cores: Sequence[int], workers: int,
             domains: Sequence[Sequence[int]] | None = None) -> list[tuple[int, ...]] | None:
    """Each local rank's cores under ``bind`` on a host whose usable cores are ``cores``; None: no binding.

    auto: local rank r's devices are on domain ``r * D // workers`` of the ``domains`` (the host's NUMA nodes, each
    cut to ``cores``; None or none left: one domain), and the ranks of one domain take its cores in contiguous parts
    of equal size, the first ones a core more where they do not divide (more ranks than cores: one core each, in
    turn). A list: as given, one set per local rank; ValueError when their count is not ``workers`` or a set names a
    core not in ``cores``.
    """
    usable = set(cores)
    if bind.mode == "none":
        return None
    if bind.mode == "list":
        if len(bind.sets) != workers:
            raise ValueError(f"it gives {len(bind.sets)} core set(s) for {workers} worker(s) on the host; give one "
                             "per local rank")
        for rank, cores_of in enumerate(bind.sets):
            missing = sorted(set(cores_of) - usable)
            if missing:
                raise ValueError(f"local rank {rank}'s core {missing[0]} is not one of the host's usable cores "
                                 f"({cores_text(usable)})")
        return [tuple(s) for s in bind.sets]
    doms = [tuple(c for c in d if c in usable) for d in (domains or ())]
    doms = [d for d in doms if d] or [tuple(sorted(usable))]
    of_rank = [r * len(doms) // workers for r in range(workers)]
    out: list[tuple[int, ...]] = []
    for r in range(workers):
        dom, peers = doms[of_rank[r]], [q for q in range(workers) if of_rank[q] == of_rank[r]]
        i, k = peers.index(r), len(peers)
        if k > len(dom):
            out.append((dom[i % len(dom)],))
            continue
        size, extra = divmod(len(dom), k)
        start = i * size + min(i, extra)
        out.append(dom[start:start + size + (1 if i < extra else 0)])
    return out


def popdist_env(plan: "Plan", instance_index: int) -> dict[str, str]:
    """The POPDIST_* variables instance ``instance_index`` sees (the popdist view of the contract)."""
    if not 0 <= instance_index < plan.instances:
        raise PlanError(f"instance index {instance_index} is outside the plan's {plan.instances} instances")
    pl = plan.placement[instance_index]
    values = {"num_instances": plan.instances, "instance_index": instance_index, "num_replicas": plan.replicas,
              "local_replicas": pl.local_replicas, "replica_offset": pl.replica_offset,
              "devices_per_replica": plan.devices_per_replica}
    return {POPDIST_FIELDS[k]: str(v) for k, v in values.items()}


def worker_env(plan: "Plan", instance_index: int, local_rank: int, *, run_id: str, run_dir: str,
               plan_path: str, master_addr: str, master_port: int, restart_count: int = 0,
               max_restarts: int = 0, snapshot_key: str | None = None) -> dict[str, str]:
    """The plan's part of one worker's env contract (strings only; no host-dependent defaults). ``snapshot_key``:
    the run's SNAPSHOT_KEY_NAME, without which the workers keep no snapshot."""
    pl = plan.placement[instance_index]
    wpi = workers_per_instance(plan)
    if not 0 <= local_rank < wpi:
        raise ValueError(f"local_rank {local_rank} out of range for {wpi} workers per instance")
    rank, popdist = instance_index * wpi + local_rank, popdist_env(plan, instance_index)
    podrun = {"run_id": run_id, "run_dir": run_dir, "plan_path": plan_path,
              **{k: popdist[name] for k, name in POPDIST_FIELDS.items()}, "local_batch": plan.local_batch, "grad_accum": plan.grad_accum, "global_batch": plan.global_batch,
              "restart_count": restart_count}
    if max_restarts > 0 and snapshot_key:   # only where a restart may read them: they cost a write per update
        podrun["snapshot_dir"] = snapshot_dir(run_id, pl.host, snapshot_key)
    torchrun = {"rank": rank, "local_rank": local_rank, "world_size": world_size(plan), "local_world_size": wpi,
                "node_rank": instance_index, "master_addr": master_addr, "master_port": master_port}
    env: dict[str, object] = {PODRUN_FIELDS[k]: v for k, v in podrun.items()}
    env.update({TORCHRUN_FIELDS[k]: v for k, v in torchrun.items()})
    env.update({
        "ROLE_RANK": rank,
        "ROLE_NAME": ROLE_NAME,
        "ROLE_WORLD_SIZE": world_size(plan),
        "GROUP_WORLD_SIZE": plan.instances,
        "TORCHELASTIC_RESTART_COUNT": restart_count,
        "TORCHELASTIC_MAX_RESTARTS": max_restarts,
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_ERROR_FILE": error_file(run_dir, instance_index, local_rank),
    })
    if is_ipu(plan):
        env.update(popdist)
    return {k: str(v) for k, v in env.items()}


# What the launch sets for every agent (podrun launch's --rdzv-id and --role, podrun.launch.prepare.launch_names)
# and the workers' names they give: TORCHELASTIC_RUN_ID is the rendezvous id (torchrun's), not the run id
RDZV_ID_ENV, ROLE_ENV = "PODRUN_RDZV_ID", "PODRUN_ROLE"
# torchrun's --virtual-local-rank, for every agent: each worker's LOCAL_RANK is 0 and CUDA_VISIBLE_DEVICES its own
# device (its entry of the host's CUDA_VISIBLE_DEVICES, else its local rank), as torchrun's LocalElasticAgent sets
VIRTUAL_LOCAL_RANK_ENV = "PODRUN_VIRTUAL_LOCAL_RANK"
LAUNCH_OVERRIDES = {RDZV_ID_ENV: "TORCHELASTIC_RUN_ID", ROLE_ENV: "ROLE_NAME"}


def launch_overrides(env: dict[str, str], launch_env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with TORCHELASTIC_RUN_ID and ROLE_NAME set from the launch's variables (LAUNCH_OVERRIDES) found in
    ``launch_env``."""
    for src, name in LAUNCH_OVERRIDES.items():
        if src in launch_env and name in env:
            env[name] = launch_env[src]
    return env


def instance_envs(plan: "Plan", instance_index: int, attempt: "RunAttempt", *, agent_store: bool = False,
                  host_env: Mapping[str, str] | None = None, cpus: int | None = None,
                  gloo_ifname: str | None = None, bound: Sequence[Sequence[int]] | None = None
                  ) -> list[dict[str, str]]:
    """What the agent of instance ``instance_index`` sets for each of its workers in ``attempt``, on top of the
    host's env.

    ``agent_store``: the agent of global rank 0 hosts the store on ``master_port`` (podrun.host.store),
    so every worker, rank 0 included, is a client of it (TORCHELASTIC_USE_AGENT_STORE=True, as under torchrun).
    ``host_env``: the variables the workers inherit (the host's, with --env): the defaults below that are set there
    are left to them; its SNAPSHOT_KEY_NAME names the snapshot directory. ``cpus``: the cores the agent may use;
    None (the controller, which does not know a remote host's cores) leaves OMP_NUM_THREADS out. ``bound``: each
    local rank's cores (podrun.wire.worker_env.cpu_sets): its share is their count. ``gloo_ifname``: the interface
    gloo must bind on this host (the agent's finding; None: gloo's own choice stands).
    """
    host_env = {} if host_env is None else host_env
    # set only when neither the host nor --env has them: threads per worker (see omp_num_threads), line buffered
    # output so logs stream live, NCCL's async error handling as torchrun sets it, torchrun's list of forwarded
    # signals, and gloo's interface where the host's own name resolves to loopback (podrun.wire.probe.gloo_interface)
    defaults = {"PYTHONUNBUFFERED": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
                "TORCHELASTIC_SIGNALS_TO_HANDLE": SIGNALS_HANDLED}
    if cpus is not None:
        defaults[CPUS_ENV] = defaults["OMP_NUM_THREADS"] = str(omp_num_threads(plan, cpus))
    if gloo_ifname is not None:
        defaults["GLOO_SOCKET_IFNAME"] = gloo_ifname
    envs = []
    for local_rank in range(workers_per_instance(plan)):
        env = worker_env(plan, instance_index, local_rank, **asdict(attempt),
                         snapshot_key=host_env.get(SNAPSHOT_KEY_NAME))
        if agent_store:
            env[AGENT_STORE_NAME] = "True"
        share = {} if bound is None else dict.fromkeys((CPUS_ENV, "OMP_NUM_THREADS"), str(len(bound[local_rank])))
        if bound is not None:
            env[CPU_SET_ENV] = cores_text(bound[local_rank])
        env.update({k: v for k, v in {**defaults, **share}.items() if k not in host_env})
        if host_env.get(VIRTUAL_LOCAL_RANK_ENV) == "1":
            visible = host_env.get("CUDA_VISIBLE_DEVICES")
            devices = visible.split(",") if visible else []
            env["LOCAL_RANK"] = "0"
            env["CUDA_VISIBLE_DEVICES"] = devices[local_rank].strip() if local_rank < len(devices) else str(local_rank)
        envs.append(launch_overrides(env, host_env))
    return envs
