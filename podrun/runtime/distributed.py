"""Device choice (in ONE place) and torch.distributed set-up from the WorkerInfo."""
from __future__ import annotations

import datetime
import importlib
import os
from dataclasses import dataclass

from podrun.runtime.env import RuntimeEnvError, WorkerInfo, read_worker_info


@dataclass(frozen=True)
class Device:
    """Where the model runs: kind 'ipu' | 'cuda' | 'cpu' and the torch device string."""

    kind: str
    torch_device: str     # "cpu", "cuda:0"; "cpu" for ipu (the host side of poptorch)
    index: int = 0


def poptorch_available() -> bool:
    try:
        importlib.import_module("poptorch")
        return True
    except ImportError:
        return False


def select_device(prefer: str | None = None, info: WorkerInfo | None = None) -> Device:
    """IPU via poptorch when importable, else CUDA with LOCAL_RANK, else CPU.

    ``prefer`` ('ipu' | 'cuda' | 'cpu' | None / 'auto') or PODRUN_DEVICE forces a kind; forcing a
    kind that is not present is an error naming it.
    """
    prefer = (prefer or os.environ.get("PODRUN_DEVICE") or "auto").lower()
    prefer = "cuda" if prefer == "gpu" else prefer
    if prefer not in ("auto", "ipu", "cuda", "cpu"):
        raise RuntimeEnvError(f"unknown device kind {prefer!r}", hint="use ipu, cuda, cpu or auto")
    info = info or read_worker_info()
    if prefer in ("auto", "ipu") and poptorch_available():
        return Device("ipu", "cpu", info.local_rank)
    if prefer == "ipu":
        raise RuntimeEnvError("device kind ipu asked for, but poptorch cannot be imported",
                              hint="install the Poplar SDK's poptorch wheel, or use --device cpu")
    import torch

    if prefer in ("auto", "cuda") and torch.cuda.is_available():
        n = torch.cuda.device_count()
        index = info.local_rank % n
        torch.cuda.set_device(index)
        return Device("cuda", f"cuda:{index}", index)
    if prefer == "cuda":
        raise RuntimeEnvError("device kind cuda asked for, but torch.cuda.is_available() is False",
                              hint="check the NVIDIA driver and the torch build, or use --device cpu")
    return Device("cpu", "cpu", 0)


def init_distributed(backend: str | None = None, timeout: float = 120.0,
                     info: WorkerInfo | None = None, device: Device | None = None) -> WorkerInfo:
    """Join the process group (gloo on CPU, NCCL on CUDA) when the world has more than one worker.

    Reads ranks from any launcher (see podrun.runtime.env.SOURCES); a world of one does nothing.
    Returns the WorkerInfo used.
    """
    import torch.distributed as dist

    info = info or read_worker_info()
    if not info.distributed or dist.is_initialized():
        return info
    if backend is None:
        import torch

        cuda = device.kind == "cuda" if device is not None else torch.cuda.is_available()
        backend = "nccl" if cuda else "gloo"
    try:
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{_bracket(info.master_addr)}:{info.master_port}",
            rank=info.rank,
            world_size=info.world_size,
            timeout=datetime.timedelta(seconds=timeout),
        )
    except Exception as exc:  # rendezvous failures: name where it tried
        raise RuntimeEnvError(
            f"rank {info.rank}/{info.world_size} could not join the {backend} process group at "
            f"{info.master_addr}:{info.master_port} within {timeout:.0f}s ({type(exc).__name__}: {exc})",
            hint="check that every worker was started, that MASTER_ADDR is reachable and MASTER_PORT free",
        ) from None
    return info


def destroy_distributed() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _bracket(addr: str) -> str:
    return f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr
