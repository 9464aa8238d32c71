"""Loader worker processes: a rank's micro batches decoded and augmented in parallel by torch DataLoader workers
forked from the rank, in order, through shared memory, and ended with the rank.

Each worker is forked (never a fresh interpreter) and asks the kernel for SIGKILL when the rank that forked it dies
(prctl PR_SET_PDEATHSIG): a rank killed with -9 leaves no loader process behind, whatever the worker was doing.
DataLoader's own watch of the parent (every few seconds) is the second line. The kernel ties that signal to the
thread that forked: the loop iterates the loader in the rank's main thread (no prefetch thread beside workers). The batches come back through shared
memory (DataLoader's tensors) and, on CUDA, are pinned by DataLoader's pin thread so that the copies to the device
are asynchronous (``.to(device, non_blocking=True)`` in the loop). The pinned path runs on CUDA hosts only.
"""
from __future__ import annotations

import os
import warnings
from typing import Iterable, Iterator

import numpy as np
import torch

from podrun.proctl import die_with_parent
from podrun.train.images import DataError, ImageDataset, make_micro
from podrun.wire.worker_env import cpus_here

WORKERS_ENV = "PODRUN_LOADER_WORKERS"       # --loader-workers, for a script of one's own


class _Micro(torch.utils.data.Dataset):
    """Key (epoch, step, micro step, indices) -> (epoch, step, micro step, x, y, skipped); a refusal of the dataset
    travels back as its message and hint (DataLoader would wrap it in a traceback)."""

    def __init__(self, ds: ImageDataset, train: bool = True):
        self.ds, self.train = ds, train

    def __getitem__(self, key):
        epoch, step, j, ix = key
        try:
            x, y, skipped = make_micro(self.ds, epoch, ix, self.train)
        except DataError as exc:
            return epoch, step, j, None, None, (exc.message, exc.hint)
        return epoch, step, j, x, y, skipped

    def __len__(self):          # not used: the keys come from an iterable of their own
        return len(self.ds)


def pooled(ds: ImageDataset, keys: Iterable[tuple[int, int, int, np.ndarray]], workers: int, *,
           pin_memory: bool = False, prefetch_factor: int = 2, train: bool = True) -> Iterator[tuple]:
    """The micro batches of ``keys`` made by ``workers`` forked processes, in the keys' order (``train``: with the
    training augmentation, else the validation crop)."""
    dies = die_with_parent()             # noted here, in the rank: a worker gets SIGKILL when the rank dies
    with warnings.catch_warnings():      # more workers than cores is the caller's choice (--loader-workers)
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        loader = torch.utils.data.DataLoader(
            _Micro(ds, train), batch_size=None, sampler=keys, num_workers=workers, pin_memory=pin_memory,
            prefetch_factor=prefetch_factor, multiprocessing_context="fork", worker_init_fn=lambda _id: dies())
        it = iter(loader)
    try:
        for epoch, step, j, x, y, skipped in it:
            if x is None:
                message, hint = skipped
                raise DataError(message, hint=hint)
            yield epoch, step, j, x, y, list(skipped)
    finally:
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:    # now, not at the iterator's collection
            shutdown()


def worker_pids() -> list[int]:
    """The live loader workers of this process (its children that DataLoader forked)."""
    import multiprocessing

    return [p.pid for p in multiprocessing.active_children() if p.pid is not None]


def default_workers(ds: ImageDataset, local_world_size: int, given: int | None = None) -> int:
    """Loader workers for one rank: ``given`` (--loader-workers) when set, else 0 for a dataset in memory, else this
    rank's share of its host's cores: PODRUN_CPUS (podrun's share from the cluster spec's ``cpu:`` cores, or the
    host's, divided among its ranks), else the cores it may run on divided by the ranks on the host."""
    if given is None:
        env = os.environ.get(WORKERS_ENV, "")
        given = int(env) if env.isdigit() else None
    if given is not None:
        return max(0, given)
    if not ds.decodes_files:
        return 0
    return cpus_here(local_world_size)
