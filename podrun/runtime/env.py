"""Rank information inside a worker: one table per launcher (podrun, torchrun, Slurm, Open MPI, PMI) -> WorkerInfo."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Mapping

from podrun import safefs
from podrun.errors import PodrunError
from podrun.wire.worker_env import PODRUN_FIELDS, PODRUN_MARKER, POPDIST_FIELDS, TORCHRUN_FIELDS


class RuntimeEnvError(PodrunError):
    """The worker's environment is contradictory or malformed (a rank variable that is not a number...)."""


# Each source maps WorkerInfo fields to the variable that carries them. The first source whose
# `marker` variable is present wins; podrun first (it also sets torchrun's names), then torchrun,
# then Slurm (srun), Open MPI (mpirun), PMI (MPICH / Intel MPI / hydra). podrun's and torchrun's
# names are the env contract's (podrun.wire.worker_env), the one list the launcher sets them from.
_MASTER = {"master_addr": "MASTER_ADDR", "master_port": "MASTER_PORT"}
SOURCES: dict[str, dict[str, str]] = {
    "podrun": {
        **TORCHRUN_FIELDS,
        "marker": PODRUN_MARKER,
        "node_rank": PODRUN_FIELDS["instance_index"],
    },
    "torchrun": {
        **TORCHRUN_FIELDS,
        "marker": "TORCHELASTIC_RUN_ID|LOCAL_WORLD_SIZE|RANK",
    },
    "slurm": {
        "marker": "SLURM_PROCID",
        "rank": "SLURM_PROCID",
        "local_rank": "SLURM_LOCALID",
        "world_size": "SLURM_NTASKS",
        "local_world_size": "SLURM_NTASKS_PER_NODE|SLURM_TASKS_PER_NODE",
        "node_rank": "SLURM_NODEID",
        **_MASTER,      # without MASTER_ADDR: the step's first node (rank 0), else SLURM_LAUNCH_NODE_IPADDR
    },
    "openmpi": {
        "marker": "OMPI_COMM_WORLD_RANK",
        "rank": "OMPI_COMM_WORLD_RANK",
        "local_rank": "OMPI_COMM_WORLD_LOCAL_RANK",
        "world_size": "OMPI_COMM_WORLD_SIZE",
        "local_world_size": "OMPI_COMM_WORLD_LOCAL_SIZE",
        "node_rank": "OMPI_COMM_WORLD_NODE_RANK",
        **_MASTER,
    },
    "pmi": {
        "marker": "PMI_RANK",
        "rank": "PMI_RANK",
        "local_rank": "MPI_LOCALRANKID|PMI_LOCAL_RANK",
        "world_size": "PMI_SIZE",
        "local_world_size": "MPI_LOCALNRANKS|PMI_LOCAL_SIZE",
        "node_rank": "PMI_NODE_RANK",
        **_MASTER,
    },
}

DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class WorkerInfo:
    """Who this worker is, whichever launcher started it."""

    source: str                 # podrun | torchrun | slurm | openmpi | pmi | single
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int              # instance (podrun) / node index
    master_addr: str
    master_port: int
    # popdist-style view; derived from the ranks when podrun did not set them
    num_instances: int
    instance_index: int
    num_replicas: int
    local_replicas: int
    replica_offset: int
    devices_per_replica: int = 1
    # batch decomposition from the plan, None when not launched by podrun
    local_batch: int | None = None
    grad_accum: int | None = None
    global_batch: int | None = None
    run_id: str | None = None
    run_dir: str | None = None
    plan_path: str | None = None
    restart_count: int = 0      # restarts of the run so far (podrun's or torchrun's count)
    snapshot_dir: str | None = None   # this host's in-memory snapshots (podrun.runtime.snapshot); None: none kept

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _get(env: Mapping[str, str], names: str) -> tuple[str, str] | None:
    return next(((name, env[name]) for name in names.split("|") if env.get(name, "") != ""), None)


def _int(env: Mapping[str, str], names: str, default: int | None = None) -> int | None:
    hit = _get(env, names)
    if hit is None:
        return default
    name, value = hit
    m = re.match(r"^\s*(\d+)", value)  # SLURM_TASKS_PER_NODE may read "2(x3)"
    if not m:
        raise RuntimeEnvError(
            f"environment variable {name}={value!r} is not a non-negative integer",
            hint="unset it or fix the launcher that set it",
        )
    return int(m.group(1))


def detect_source(env: Mapping[str, str]) -> str:
    return next((source for source, table in SOURCES.items() if _get(env, table["marker"]) is not None), "single")


def _slurm_first_node(env: Mapping[str, str]) -> str | None:
    from podrun.specs.allocation import expand_nodelist

    return next((expand_nodelist(env[var], var)[0] for var in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                                                                "SLURM_NODELIST") if env.get(var)), None)


def read_worker_info(env: Mapping[str, str] | None = None) -> WorkerInfo:
    """Read rank info from the first launcher whose variables are present (see SOURCES)."""
    env = os.environ if env is None else env
    source = detect_source(env)
    if source == "single":
        rank, local_rank, world, local_world, node_rank = 0, 0, 1, 1, 0
        master_addr, master_port = env.get("MASTER_ADDR", "127.0.0.1"), _int(env, "MASTER_PORT", DEFAULT_MASTER_PORT)
    else:
        t = SOURCES[source]
        rank = _int(env, t["rank"], 0)
        world = _int(env, t["world_size"], 1)
        local_rank = _int(env, t["local_rank"], 0)
        local_world = _int(env, t["local_world_size"], None)
        node_rank = _int(env, t["node_rank"], None)
        if local_world is None:
            local_world = world if node_rank in (None, 0) and local_rank == rank else 1
        if node_rank is None:
            node_rank = rank // max(local_world, 1)
        addr_hit = _get(env, t["master_addr"])
        master_addr = addr_hit[1] if addr_hit else None
        if master_addr is None and source == "slurm":
            master_addr = _slurm_first_node(env) or env.get("SLURM_LAUNCH_NODE_IPADDR")
        master_addr = master_addr or "127.0.0.1"
        master_port = _int(env, t["master_port"], DEFAULT_MASTER_PORT)
    if not (0 <= rank < world):
        raise RuntimeEnvError(
            f"rank {rank} is outside world size {world} (read from the {source} variables)",
            hint="the launcher's rank and size variables disagree",
        )
    # popdist-style view: podrun's names, else popdist's as poprun sets them, else derived from the ranks
    derived = {"num_instances": max(1, world // max(local_world, 1)), "instance_index": node_rank,
               "num_replicas": world, "local_replicas": local_world, "replica_offset": rank - local_rank,
               "devices_per_replica": 1}
    popdist = {f: _int(env, f"{PODRUN_FIELDS[f]}|{POPDIST_FIELDS[f]}", d) for f, d in derived.items()}
    # the plan's batch decomposition and the run's places: podrun's names only
    batch = {f: _int(env, PODRUN_FIELDS[f], None) for f in ("local_batch", "grad_accum", "global_batch")}
    places = {f: env.get(PODRUN_FIELDS[f]) or None for f in ("run_id", "run_dir", "plan_path", "snapshot_dir")}
    return WorkerInfo(source=source, rank=rank, local_rank=local_rank, world_size=world,
                      local_world_size=local_world, node_rank=node_rank, master_addr=master_addr,
                      master_port=master_port, **popdist, **batch, **places,
                      restart_count=_int(env, f"{PODRUN_FIELDS['restart_count']}|TORCHELASTIC_RESTART_COUNT", 0))


def read_plan(info: WorkerInfo | None = None) -> dict | None:
    """The plan.json the launcher wrote (PODRUN_PLAN), as a dict; None when not launched by podrun. Read only when
    no one but this user (or root) can have written it (safefs.read_trusted), else RuntimeEnvError (exit 2)."""
    info = info or read_worker_info()
    if not info.plan_path:
        return None
    if not os.path.lexists(info.plan_path):
        raise RuntimeEnvError(
            f"PODRUN_PLAN points to {info.plan_path}, which does not exist",
            hint="the run directory must be visible on every host (shared file system) or copied there",
        )
    try:
        return json.loads(safefs.read_trusted(info.plan_path, "plan", limit=safefs.RECORD_LIMIT, error=RuntimeEnvError))
    except OSError as exc:
        raise RuntimeEnvError(f"{info.plan_path}: cannot read it ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RuntimeEnvError(f"{info.plan_path}: not valid JSON ({exc})") from None


# popdist-style queries (getNumInstances, getInstanceIndex, ...), valid under any launcher: each returns one field
# of this worker's WorkerInfo
def _query(name: str, field: str):
    def query():
        return getattr(read_worker_info(), field)

    query.__name__ = query.__qualname__ = name
    return query


num_instances = _query("num_instances", "num_instances")
instance_index = _query("instance_index", "instance_index")
num_total_replicas = _query("num_total_replicas", "num_replicas")
num_local_replicas = _query("num_local_replicas", "local_replicas")
replica_index_offset = _query("replica_index_offset", "replica_offset")
local_batch = _query("local_batch", "local_batch")                       # None when not launched by podrun
grad_accum = _query("grad_accum", "grad_accum")
global_batch = _query("global_batch", "global_batch")
