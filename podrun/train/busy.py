"""Each rank's own busy time per update step: from the step's start to the moment its last gradient is computed.

In synchronous DDP every rank's wall step time is the same (the fast ones wait for the slow one inside the
gradient all-reduce), so wall time cannot name a slow rank. What differs is the work before that wait:
fetching the batch, the forward pass and the backward pass up to the last gradient. A post-accumulate-grad
hook on every parameter notes when its gradient was accumulated on this rank (DDP hands a bucket to the
all-reduce at that moment, before any waiting on the others); the busy time is the last such moment minus the
step's start. The waiting that follows (and the optimiser step, the same work on every rank) is not counted.

Autograd hooks, not a DDP communication hook: a Python comm hook leaves Python callbacks on gloo's work
objects, and gloo can then abort the process at interpreter exit ("terminate called without an active
exception"); the hooks here are plain autograd callbacks and DDP keeps its own C++ all-reduce.
"""
from __future__ import annotations

import time

from torch import nn


class BusyClock:
    """``start()`` at the top of an update step, ``seconds()`` after its backward: this rank's busy time (None
    when it cannot be told: one worker, no DDP (FSDP, a single process), or no gradient this step)."""

    def __init__(self, wrapped: nn.Module):
        self.t0: float | None = None
        self.ready: float | None = None
        self.hooked = isinstance(wrapped, nn.parallel.DistributedDataParallel)
        if self.hooked:
            for p in wrapped.module.parameters():
                if p.requires_grad:
                    p.register_post_accumulate_grad_hook(self._note)

    def _note(self, _param) -> None:
        self.ready = time.perf_counter()

    def start(self) -> None:
        self.t0, self.ready = time.perf_counter(), None

    def seconds(self) -> float | None:
        if not self.hooked or self.t0 is None or self.ready is None:
            return None
        return max(self.ready - self.t0, 0.0)
