"""Inside a worker: read the env contract from any launcher, choose the device, join torch.distributed."""
from __future__ import annotations

from podrun.runtime.progress import phase, report

from podrun.runtime.env import (SOURCES, RuntimeEnvError, WorkerInfo, detect_source, global_batch, grad_accum,
                                instance_index, local_batch, num_instances, num_local_replicas, num_total_replicas,
                                read_plan, read_worker_info, replica_index_offset)

_LAZY = ("select_device", "init_distributed", "destroy_distributed", "Device", "poptorch_available")


def __getattr__(name):  # torch-touching helpers load lazily
    if name in _LAZY:
        from podrun.runtime import distributed

        return getattr(distributed, name)
    raise AttributeError(name)


__all__ = [
    "report", "phase",
    "SOURCES", "RuntimeEnvError", "WorkerInfo", "detect_source", "read_worker_info", "read_plan",
    "num_instances", "instance_index", "num_total_replicas", "num_local_replicas",
    "replica_index_offset", "local_batch", "grad_accum", "global_batch", *_LAZY,
]
