"""The env contract (DESIGN.md section 5): what every worker sees, derived purely from the plan."""
from __future__ import annotations

from podrun.plan.model import Plan

# Names podrun sets; podrun.runtime reads the same names.
PODRUN_NAMES = (
    "PODRUN_RUN_ID", "PODRUN_RUN_DIR", "PODRUN_NUM_INSTANCES", "PODRUN_INSTANCE_INDEX",
    "PODRUN_NUM_REPLICAS", "PODRUN_LOCAL_REPLICAS", "PODRUN_REPLICA_OFFSET",
    "PODRUN_DEVICES_PER_REPLICA", "PODRUN_LOCAL_BATCH", "PODRUN_GRAD_ACCUM", "PODRUN_GLOBAL_BATCH",
    "PODRUN_PLAN",
)
TORCHRUN_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
# What popdist reads on IPU (Graphcore's PopDist), so example scripts run unchanged.
POPDIST_NAMES = (
    "POPDIST_NUM_INSTANCES", "POPDIST_INSTANCE_INDEX", "POPDIST_NUM_TOTAL_REPLICAS",
    "POPDIST_NUM_LOCAL_REPLICAS", "POPDIST_REPLICA_INDEX_OFFSET", "POPDIST_NUM_IPUS_PER_REPLICA",
)


def workers_per_instance(plan: Plan) -> int:
    """One worker per local replica on CPU/GPU; one per instance on IPU (poptorch drives its replicas)."""
    return 1 if plan.device_kind.startswith("ipu") else plan.replicas_per_instance


def world_size(plan: Plan) -> int:
    return plan.instances * workers_per_instance(plan)


def worker_env(plan: Plan, instance_index: int, local_rank: int, *, run_id: str, run_dir: str,
               plan_path: str, master_addr: str, master_port: int) -> dict[str, str]:
    """The complete env contract of one worker (strings only)."""
    pl = plan.placement[instance_index]
    wpi = workers_per_instance(plan)
    if not 0 <= local_rank < wpi:
        raise ValueError(f"local_rank {local_rank} out of range for {wpi} workers per instance")
    env = {
        "PODRUN_RUN_ID": run_id,
        "PODRUN_RUN_DIR": run_dir,
        "PODRUN_NUM_INSTANCES": plan.instances,
        "PODRUN_INSTANCE_INDEX": instance_index,
        "PODRUN_NUM_REPLICAS": plan.replicas,
        "PODRUN_LOCAL_REPLICAS": pl.local_replicas,
        "PODRUN_REPLICA_OFFSET": pl.replica_offset,
        "PODRUN_DEVICES_PER_REPLICA": plan.devices_per_replica,
        "PODRUN_LOCAL_BATCH": plan.local_batch,
        "PODRUN_GRAD_ACCUM": plan.grad_accum,
        "PODRUN_GLOBAL_BATCH": plan.global_batch,
        "PODRUN_PLAN": plan_path,
        "RANK": instance_index * wpi + local_rank,
        "LOCAL_RANK": local_rank,
        "WORLD_SIZE": world_size(plan),
        "LOCAL_WORLD_SIZE": wpi,
        "GROUP_RANK": instance_index,
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": master_port,
    }
    if plan.device_kind.startswith("ipu"):
        env.update({
            "POPDIST_NUM_INSTANCES": plan.instances,
            "POPDIST_INSTANCE_INDEX": instance_index,
            "POPDIST_NUM_TOTAL_REPLICAS": plan.replicas,
            "POPDIST_NUM_LOCAL_REPLICAS": pl.local_replicas,
            "POPDIST_REPLICA_INDEX_OFFSET": pl.replica_offset,
            "POPDIST_NUM_IPUS_PER_REPLICA": plan.devices_per_replica,
        })
    return {k: str(v) for k, v in env.items()}
