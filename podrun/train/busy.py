"""Each rank's own busy time per update step: from the step's start to the moment DDP hands its last gradient bucket to the all-reduce.

In synchronous DDP every rank's wall step time is the same (the fast ones wait for the slow one inside the
gradient all-reduce), so wall time cannot name a slow rank. What differs is the work before that wait:
fetching the batch, the forward pass and the backward pass up to the last gradient. DDP calls its
communication hook once per gradient bucket as soon as that bucket's gradients are computed on this rank,
before any waiting on the others; the hook registered here notes the time and runs DDP's own all-reduce
(the default hook: the same result as no hook). The busy time is the last such moment minus the step's
start; the waiting that follows (and the optimiser step, the same work on every rank) is not counted.
"""
from __future__ import annotations

import time

from torch import nn


class BusyClock:
    """``start()`` at the top of an update step, ``seconds()`` after its backward: this rank's busy time (None
    when it cannot be told: one worker, no DDP (FSDP, a single process), or no bucket reported this step)."""

    def __init__(self, wrapped: nn.Module):
        self.t0: float | None = None
        self.ready: float | None = None
        self.hooked = isinstance(wrapped, nn.parallel.DistributedDataParallel)
        if self.hooked:
            wrapped.register_comm_hook(self, _noting_allreduce)

    def start(self) -> None:
        self.t0, self.ready = time.perf_counter(), None

    def seconds(self) -> float | None:
        if not self.hooked or self.t0 is None or self.ready is None:
            return None
        return max(self.ready - self.t0, 0.0)


def _noting_allreduce(clock: BusyClock, bucket):
    """DDP's communication hook: note when this bucket's gradients were ready here, then DDP's own all-reduce."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    clock.ready = time.perf_counter()
    return allreduce_hook(None, bucket)
