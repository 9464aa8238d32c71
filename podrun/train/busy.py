"""Each rank's own busy time per update step: from the step's start to the moment its last gradient is computed.

In synchronous DDP every rank's wall step time is the same (the fast ones wait for the slow one inside the
gradient all-reduce), so wall time cannot name a slow rank. What differs is the work before that wait:
fetching the batch, the forward pass and the backward pass up to the last gradient. A post-accumulate-grad
hook on every parameter notes when its gradient was accumulated on this rank (DDP hands a bucket to the
all-reduce at that moment, before any waiting on the others); the busy time is the last such moment minus the
step's start. The waiting that follows (and the optimiser step, the same work on every rank) is not counted.
The same stamps split the step into input, compute, comm and optim (podrun.runtime.steps.StepClock), so that a
slow rank is named with its cause.
"""
from __future__ import annotations

from podrun.runtime.steps import StepClock


class BusyClock(StepClock):
    """``start()`` at the top of an update step, ``seconds()`` after its backward: this rank's busy time (None
    when it cannot be told: one worker, no DDP (FSDP, a single process), or no gradient this step); the split's
    stamps (``fetched``, ``synced``, ``stepped``, ``split``) are the StepClock's."""

    def seconds(self) -> float | None:
        return self.busy()
