"""Real-cluster test harness: OpenSSH hosts (NetnsHosts), Slurm (SlurmCluster) and Grid Engine
(GridEngineCluster) in network namespaces."""
from .common import HarnessError, check_prerequisites
from .netns import NetnsHosts

__all__ = ["GridEngineCluster", "HarnessError", "NetnsHosts", "SlurmCluster", "check_prerequisites",
           "cleanup_stale"]


def __getattr__(name):  # SlurmCluster lives in slurm.py, GridEngineCluster in uge.py; imported lazily
    if name == "SlurmCluster":
        from .slurm import SlurmCluster
        return SlurmCluster
    if name == "GridEngineCluster":
        from .uge import GridEngineCluster
        return GridEngineCluster
    raise AttributeError(name)


def cleanup_stale() -> list[str]:
    """Tear down every slot whose lock is free (leftovers of killed sessions); return the slots cleaned."""
    from . import netns, slurm
    from .common import NUM_SLOTS, SlotLock
    cleaned = []
    for kind, cleanup in ((netns.KIND, netns._cleanup_slot), (slurm.KIND, slurm._cleanup_slot)):
        for slot in range(NUM_SLOTS):
            lock = SlotLock.try_acquire(kind, slot)
            if lock is None:
                continue  # in use by a live session
            try:
                cleanup(slot)
                cleaned.append(f"{kind}-{slot}")
            finally:
                lock.release()
    return cleaned
