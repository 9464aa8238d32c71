"""Each rank's step split (input, compute, comm, optim): the clock the recipes' runner stamps, and the hook for a
user's own script.

The hook, in a script podrun launches (torchrun scripts keep working without it; outside podrun every call is a
no-op that costs one attribute test)::

    from podrun.runtime import steps
    steps.watch(ddp_model)               # optional: the backward's time after the last gradient counts as comm
    for step in range(1, total + 1):
        with steps.phase("input"):
            x, y = next(it)
        with steps.phase("compute"):
            loss = loss_fn(ddp_model(x), y)
            loss.backward()
        with steps.phase("optim"):
            opt.step()
            opt.zero_grad()
        steps.step(step, total, loss=loss.item())

``steps.step`` sends the mean split of the steps since the last report on the progress channel
(podrun.runtime.progress, the ``split`` field, a podrun.wire.protocol.StepSplit) with the step's busy time
(input + compute: what the slow-rank watch compares). The parts are host-clock times: on CUDA a phase's end must
follow a ``torch.cuda.synchronize()`` (the recipes' runner does it where the device is cuda), else the kernels it
queued are counted in a later phase.
"""
from __future__ import annotations

import contextlib
import functools
import time
from typing import Callable

from podrun.runtime import progress
from podrun.wire.protocol import SPLIT_PARTS, StepSplit
from podrun.wire.worker_env import cpus_here


class LastGrad:
    """When a DDP model's last gradient of this step was accumulated on this rank (``at``: a post-accumulate-grad
    hook on every parameter; DDP hands each bucket to the all-reduce at that moment, before any wait on the others),
    and how long its forwards waited in DDP's own work before the module ran (``waited``: a pre-forward hook on the
    wrapper and one on the module; mostly the broadcast of BatchNorm's buffers, a collective where a fast rank
    waits for a slow one: communication, not this rank's compute). Plain autograd and module callbacks, not a DDP
    communication hook (a Python comm hook leaves callbacks on gloo's work objects, and gloo can abort at
    interpreter exit). ``hooked`` False for anything but DDP: no moment known."""

    def __init__(self, model):
        self.at: float | None = None
        self.waited = 0.0
        self._outer: float | None = None
        from torch import nn

        self.hooked = isinstance(model, nn.parallel.DistributedDataParallel)
        if self.hooked:
            for p in model.module.parameters():
                if p.requires_grad:
                    p.register_post_accumulate_grad_hook(self._note)
            model.register_forward_pre_hook(self._enter)
            model.module.register_forward_pre_hook(self._entered)

    def _note(self, _param) -> None:
        self.at = time.perf_counter()

    def _enter(self, *_args) -> None:
        self._outer = time.perf_counter()

    def _entered(self, *_args) -> None:
        if self._outer is not None:
            self.waited += time.perf_counter() - self._outer
            self._outer = None

    def reset(self) -> None:
        self.at, self.waited = None, 0.0


class StepClock:
    """One update step's stamps: ``start()`` before its batch is fetched, ``fetched()`` with the batch in hand,
    ``synced()`` once backward returned (DDP's backward returns after its all-reduce completed), ``stepped()``
    after the optimiser step and zero_grad. ``split()``: the StepSplit (compute up to the last gradient, comm from
    it to ``synced``; with no gradient hook, FSDP or one process, compute runs to ``synced`` and comm is 0);
    ``busy()``: start to the last gradient, the figure the slow-rank watch compares (None without a hook). The
    forwards' wait in DDP's buffer broadcast (LastGrad.waited) counts as comm, not compute or busy time.
    ``sync``: called before each stamp (torch.cuda.synchronize on CUDA, which this machine cannot run)."""

    def __init__(self, model, sync: Callable[[], None] | None = None, loaders: int | None = None):
        self.grad = LastGrad(model)
        self.sync, self.loaders = sync, loaders
        self.cpus = cpus_here()
        self.t = [None] * 4                   # start, fetched, synced, stepped

    def _stamp(self, i: int) -> None:
        if self.sync is not None:
            self.sync()
        self.t[i] = time.perf_counter()

    def start(self) -> None:
        self._stamp(0)
        self.t[1] = self.t[2] = self.t[3] = None
        self.grad.reset()

    fetched = functools.partialmethod(_stamp, 1)
    synced = functools.partialmethod(_stamp, 2)
    stepped = functools.partialmethod(_stamp, 3)

    def busy(self) -> float | None:
        if not self.grad.hooked or self.t[0] is None or self.grad.at is None:
            return None
        return max(self.grad.at - self.t[0] - self.grad.waited, 0.0)

    def split(self) -> StepSplit | None:
        t0, t1, t2, t3 = self.t
        if t0 is None or t1 is None or t2 is None or t3 is None:
            return None
        last = self.grad.at if self.grad.at is not None and t1 <= self.grad.at <= t2 else t2
        wait = min(self.grad.waited, last - t1)
        return StepSplit(t1 - t0, last - t1 - wait, t2 - last + wait, t3 - t2, self.cpus, self.loaders)


def mean_split(splits: list[StepSplit]) -> StepSplit | None:
    """The mean of a window's splits (None for none)."""
    if not splits:
        return None
    n = len(splits)
    first = splits[0]
    return StepSplit(*(sum(getattr(s, k) for s in splits) / n for k in SPLIT_PARTS), first.cpus, first.loaders)


class _Hook:
    """The user hook's state: the parts of the steps since the last report, the phase in progress."""

    def __init__(self):
        self.sums = dict.fromkeys(SPLIT_PARTS, 0.0)
        self.steps = 0
        self.grad: LastGrad | None = None


_hook = _Hook()
_OFF = contextlib.nullcontext()


def enabled() -> bool:
    """Whether this process reports to podrun (PODRUN_PROGRESS_FD is set and open)."""
    return progress._fd() is not None


def watch(model) -> None:
    """Let a DDP ``model``'s last gradient split a ``compute`` phase: the time after it counts as comm."""
    if enabled():
        _hook.grad = LastGrad(model)


@contextlib.contextmanager
def _timed(name: str):
    t0 = time.perf_counter()
    if _hook.grad is not None:
        _hook.grad.reset()
    try:
        yield
    finally:
        t1 = time.perf_counter()
        last = _hook.grad.at if _hook.grad is not None and name == "compute" else None
        if last is not None and t0 <= last <= t1:
            wait = min(_hook.grad.waited, last - t0)
            _hook.sums["compute"] += last - t0 - wait
            _hook.sums["comm"] += t1 - last + wait
        else:
            _hook.sums[name] += t1 - t0


def phase(name: str):
    """A context manager that counts its time in part ``name`` (input, compute, comm, optim) of this step."""
    if name not in SPLIT_PARTS:
        raise ValueError(f"phase {name!r}: use one of {', '.join(SPLIT_PARTS)}")
    return _timed(name) if enabled() else _OFF


def step(step: int | None = None, total: int | None = None, **fields) -> bool:
    """The step ended: its parts join the window's, and the window's mean split goes with a progress report
    (``fields``: report's own, e.g. loss); returns whether a report was sent."""
    if not enabled():
        return False
    _hook.steps += 1
    n = _hook.steps
    split = StepSplit(*(_hook.sums[k] / n for k in SPLIT_PARTS), cpus_here())
    sent = progress.report(step, total, busy_seconds=split.input + split.compute, split=split, **fields)
    if sent:
        _hook.sums, _hook.steps = dict.fromkeys(SPLIT_PARTS, 0.0), 0
    return sent
