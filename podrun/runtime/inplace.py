"""In-place recovery for a data-parallel loop: a gloo group whose collectives can be abandoned, its re-forming with a
new world on the same store, the loop's step boundary that redoes an update the lost peer left half-done, and the
worker's end of the channel the new plan comes over (``Watch``: the file the agent writes, PLAN_ENV).

A lost peer (its link cut) leaves the others blocked in a collective until gloo's timeout; ``pg.abort()`` does not
wake a gloo wait (torch 2.13), and destroying the group joins threads that wait on the dead peer. So a Group never
blocks in gloo: each collective's work is waited on through an event that either its completion or ``abandon``
(called by the thread that hears the new plan) sets. An abandoned group is kept referenced and never destroyed
(its threads may stay blocked on the dead peer until the process ends by ``os._exit``, as forked workers end).

The loop's part (``Trainer.update``): forward and backward over this rank's share of the update's global batch,
one all-reduce of the flattened gradients (their sum over ranks, divided by the global batch's micro-batch count
as DDP's mean over replicas of the GA-divided loss is), then the optimizer step. An update whose all-reduce was
abandoned has changed nothing (the gradients are dropped, the step not taken) and is redone on the new group with
the new plan's share of the same global batch: the model, optimizer, RNG and the position in global samples are
the process's own and are kept. The ranks then agree on the last update all of them completed (one all-reduce of
MIN); a rank that completed one more (the lost peer sent its last bytes to it, not to another) goes back to the
state it kept before that update.
"""
from __future__ import annotations

import datetime
import json
import os
import threading
import time
from dataclasses import dataclass, fields
from typing import Any, Callable

import torch
import torch.distributed as dist

from podrun.wire.worker_env import INPLACE_PLAN_ENV as PLAN_ENV

_KEPT: list = []          # abandoned groups: never freed (their gloo threads may wait on a dead peer)


class Abandoned(RuntimeError):
    """The collective's group was abandoned (a new plan came) or failed (a peer's connection was reset)."""


@dataclass(frozen=True)
class NewPlan:
    """What a surviving worker is told: the group's generation, its rank and the world in it, and its share of the
    same global batch (local batch x GA)."""

    generation: int
    rank: int
    world: int
    local_batch: int
    grad_accum: int


class Group:
    """A gloo process group on ``store`` under the generation's prefix, whose collectives ``abandon`` ends."""

    def __init__(self, store, rank: int, world: int, generation: int, timeout_s: float = 1800.0):
        self.rank, self.world, self.generation = rank, world, generation
        prefix = dist.PrefixStore(f"podrun-inplace-{generation}/", store)
        self.pg = dist.ProcessGroupGloo(prefix, rank, world, datetime.timedelta(seconds=timeout_s))
        self._abandoned = threading.Event()
        self._waiting: set[threading.Event] = set()
        self._lock = threading.Lock()

    def abandon(self) -> None:
        """End every collective waiting on this group now (from any thread); later ones raise at once."""
        with self._lock:
            self._abandoned.set()
            for ev in self._waiting:
                ev.set()
        _KEPT.append(self.pg)

    @property
    def abandoned(self) -> bool:
        return self._abandoned.is_set()

    def all_reduce(self, t: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        """``t`` reduced in place over the group; Abandoned when the group is abandoned first or the work fails."""
        done = threading.Event()
        with self._lock:
            if self._abandoned.is_set():
                raise Abandoned(f"group {self.generation} was abandoned")
            if self.world == 1:
                return t
            self._waiting.add(done)
        try:
            opts = dist.AllreduceOptions()
            opts.reduceOp = op
            fut = self.pg.allreduce([t], opts).get_future()
            fut.add_done_callback(lambda _f: done.set())
            done.wait()
            if self._abandoned.is_set() and not fut.done():
                raise Abandoned(f"group {self.generation} was abandoned during an all-reduce")
            try:
                fut.value()
            except Exception as exc:  # noqa: BLE001 - a peer's connection reset: the same as a lost peer
                raise Abandoned(f"group {self.generation}: {type(exc).__name__}: {exc}".splitlines()[0]) from None
            return t
        finally:
            with self._lock:
                self._waiting.discard(done)


def flat_grads(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """The parameters' gradients in one flat buffer (zeros for a parameter without one)."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])


def set_grads(params: list[torch.nn.Parameter], flat: torch.Tensor) -> None:
    at = 0
    for p in params:
        n = p.numel()
        p.grad = flat[at:at + n].view_as(p).clone()
        at += n


@dataclass
class Share:
    """This rank's share of every update's global batch: ``grad_accum`` micro batches of ``local_batch`` samples,
    the rank's place among ``world`` ranks."""

    rank: int
    world: int
    local_batch: int
    grad_accum: int

    def micro_batches(self, global_batch: int) -> list[slice]:
        """Slices of the update's global batch (samples in global order) this rank takes, one per micro batch: the
        same global batch whatever the world, each micro batch a contiguous run of local_batch samples."""
        if self.world * self.local_batch * self.grad_accum != global_batch:
            raise ValueError(f"{self.world} x {self.local_batch} x GA {self.grad_accum} is not the global batch "
                             f"{global_batch}")
        per_micro = self.world * self.local_batch
        return [slice(j * per_micro + self.rank * self.local_batch, j * per_micro + (self.rank + 1) * self.local_batch)
                for j in range(self.grad_accum)]


class Trainer:
    """The step boundary of a data-parallel loop that recovers in place. ``batch(step)`` gives the update's global
    batch (inputs and targets, in global order: a function of the seed and the step only); ``loss_fn(model, x, y)``
    the mean loss of a micro batch. ``keep()`` / ``restore(state)`` save and give back what an update changes
    (model, optimizer, scaler, RNG): the state before the update in flight is kept in memory, so that a rank that
    completed one update more than the others can go back to it."""

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer, group: Group, share: Share,
                 global_batch: int, batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
                 loss_fn: Callable[..., torch.Tensor]):
        self.model, self.opt, self.group, self.share = model, opt, group, share
        self.global_batch, self.batch, self.loss_fn = global_batch, batch, loss_fn
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.step = 0                      # updates completed
        self._before: tuple[int, dict[str, Any]] | None = None
        self.redone: list[int] = []        # updates redone after an abandoned group

    def _state(self) -> dict[str, Any]:
        import copy

        return {"model": copy.deepcopy(self.model.state_dict()), "opt": copy.deepcopy(self.opt.state_dict()),
                "rng": torch.get_rng_state()}

    def _restore(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        torch.set_rng_state(state["rng"])

    def update(self) -> float:
        """Update ``self.step + 1`` on the current group; returns the global batch's mean loss. Abandoned: nothing
        of the update was applied (call ``reform``, then ``update`` again)."""
        x, y = self.batch(self.step)
        self.opt.zero_grad(set_to_none=True)
        loss_sum = torch.zeros(1, dtype=torch.float64)
        for sl in self.share.micro_batches(self.global_batch):
            loss = self.loss_fn(self.model, x[sl], y[sl])
            (loss / self.share.grad_accum).backward()
            loss_sum += loss.detach().double() * (sl.stop - sl.start)
        flat = torch.cat([flat_grads(self.params), loss_sum.float()])
        try:
            self.group.all_reduce(flat)
        except Abandoned:
            self.opt.zero_grad(set_to_none=True)
            raise
        set_grads(self.params, flat[:-1] / self.share.world)
        self._before = (self.step, self._state())
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        return flat[-1].item() / self.global_batch

    def reform(self, store, plan: NewPlan, timeout_s: float = 1800.0) -> int:
        """Abandon the current group (if the listener did not yet), form the new one on ``store``, take the new
        share, and agree on the last update every rank completed; a rank ahead goes back to its state before its
        last update. Returns the update training goes on from."""
        if not self.group.abandoned:
            self.group.abandon()
        self.group = Group(store, plan.rank, plan.world, plan.generation, timeout_s)
        self.share = Share(plan.rank, plan.world, plan.local_batch, plan.grad_accum)
        done = torch.tensor([float(self.step)])
        self.group.all_reduce(done, dist.ReduceOp.MIN)
        agreed = int(done.item())
        if agreed < self.step:
            if self._before is None or self._before[0] != agreed:
                raise Abandoned(f"update {self.step} was completed here but not on every rank, and the state before "
                                "it is not kept: restart")
            self._restore(self._before[1])
            self.step = agreed
        self.redone.append(self.step + 1)
        return self.step


POLL_S = 0.02             # how often the watch looks at the plan file (its stat only, unless it changed)
PLAN_LIMIT = 4096


def read_plan(path: str) -> NewPlan | None:
    """The plan in ``path`` (written by this user's agent: read through safefs's trusted read), None when there is
    none yet or it is not one."""
    from podrun import safefs
    from podrun.errors import PodrunError

    try:
        raw = json.loads(safefs.read_trusted(path, "in-place plan", limit=PLAN_LIMIT))
        return NewPlan(**{f.name: int(raw[f.name]) for f in fields(NewPlan)})
    except (OSError, PodrunError, ValueError, KeyError, TypeError):
        return None


class Watch:
    """A thread that reads this worker's plan file every POLL_S: a new generation's plan abandons ``group`` (the one
    ``watch`` was last given) at once and wakes ``next_plan``. ``told_at``: when the newest plan was read."""

    def __init__(self, path: str, generation: int = 0):
        self.path, self.generation = path, generation
        self.group: Group | None = None
        self.plan: NewPlan | None = None
        self.told_at: float | None = None
        self._came = threading.Event()
        self._lock = threading.Lock()
        threading.Thread(target=self._run, name="podrun-inplace-watch", daemon=True).start()

    def watch(self, group: Group) -> None:
        with self._lock:
            self.group = group
            if self.plan is not None and self.plan.generation > group.generation:
                group.abandon()

    def _run(self) -> None:
        seen = None
        while True:
            time.sleep(POLL_S)
            try:
                st = os.stat(self.path)
            except OSError:
                continue
            if (st.st_mtime_ns, st.st_size, st.st_ino) == seen:
                continue
            seen = (st.st_mtime_ns, st.st_size, st.st_ino)
            plan = read_plan(self.path)
            if plan is None or plan.generation <= self.generation:
                continue
            with self._lock:
                self.generation, self.plan, self.told_at = plan.generation, plan, time.time()
                if self.group is not None and self.group.generation < plan.generation:
                    self.group.abandon()
            self._came.set()
            tell({"inplace": "abandoned", "generation": plan.generation, "abandoned_at": self.told_at})

    def next_plan(self, after: int, timeout: float) -> NewPlan | None:
        """The plan of a generation above ``after``, waiting up to ``timeout`` s; None when none came."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if self.plan is not None and self.plan.generation > after:
                    return self.plan
                self._came.clear()
            left = deadline - time.monotonic()
            if left <= 0 or not self._came.wait(left):
                with self._lock:
                    return self.plan if self.plan is not None and self.plan.generation > after else None


def tell(record: dict[str, Any]) -> None:
    """One record of the in-place recovery to the controller (the progress channel: a ``prog`` line with an
    ``inplace`` field), never merged with another."""
    from podrun.runtime import progress

    progress.send({"phase": "train", **record})


def abandoned_any() -> bool:
    """Whether this process abandoned a group (whose gloo threads may wait on a dead peer: its end must be os._exit)."""
    return bool(_KEPT)


def end_process(code: int) -> None:
    """End a process that abandoned a group: output flushed, atexit run, no teardown of gloo's groups (os._exit)."""
    from podrun.proctl import exit_now

    exit_now(code)


PLAN_WAIT_S = 20.0        # a rank whose group failed waits this long for the controller's plan


class Loop(Trainer):
    """The hook for a user's own data-parallel loop (``loop()`` makes it): ``train_step()`` is the step boundary (one
    update; after a lost host, the same update again on the re-formed group), the model and optimizer given are the
    state kept, ``reshard(share)`` is called with the rank's new Share after each re-forming (to rebuild what the
    loop derives from rank and world). It tells the controller what it does, as podrun's recipes do. ``step``: the
    updates completed; ``share``: this rank's place and share now."""

    def __init__(self, model, opt, group: Group, share: Share, global_batch: int, batch, loss_fn, store,
                 watch: Watch, reshard=None, timeout_s: float = 1800.0):
        super().__init__(model, opt, group, share, global_batch, batch, loss_fn)
        self.store, self.watch, self.reshard, self.timeout_s = store, watch, reshard, timeout_s
        self.first: dict[str, Any] | None = None
        watch.watch(group)
        tell({"inplace": "ready", "rank": share.rank})

    def train_step(self) -> float:
        """Update ``self.step + 1`` (a collective: every rank calls it); returns the global batch's mean loss.
        Abandoned when the recovery in place fails (the controller then restarts the run)."""
        while True:
            rng = torch.get_rng_state()
            try:
                loss = self.update()
                break
            except Abandoned:
                torch.set_rng_state(rng)
                self._recover()
        if self.first is not None:
            tell({**self.first, "inplace": "trained", "step": self.step, "trained_at": time.time()})
            self.first = None
        return loss

    def _recover(self) -> None:
        abandoned_at = time.time()
        gen = self.group.generation
        plan = self.watch.next_plan(gen, PLAN_WAIT_S)
        if plan is None:
            self._fail(gen, f"its group failed and no new plan came within {PLAN_WAIT_S:g} s")
        try:
            self.reform(self.store, plan, self.timeout_s)
        except (Abandoned, RuntimeError) as exc:
            self._fail(plan.generation, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        self.watch.watch(self.group)
        formed_at = time.time()
        if self.reshard is not None:
            self.reshard(self.share)
        self.first = {"generation": plan.generation, "rank": plan.rank,
                      "abandoned_at": min(abandoned_at, self.watch.told_at or abandoned_at), "formed_at": formed_at,
                      "resharded_at": time.time(), "redo": self.step + 1}
        tell({**self.first, "inplace": "reformed"})

    def _fail(self, generation: int, why: str):
        tell({"inplace": "failed", "generation": generation, "why": why})
        raise Abandoned(f"in-place recovery failed: {why}")


def loop(model: torch.nn.Module, opt: torch.optim.Optimizer, global_batch: int,
         batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]], loss_fn: Callable[..., torch.Tensor], *,
         reshard: Callable[[Share], None] | None = None, timeout_s: float = 1800.0) -> Loop | None:
    """The in-place hook of a user's loop, after ``init_process_group("gloo")``; None where it cannot run (not
    under ``podrun launch --elastic`` over ssh or locally, another backend, one rank): train as before then.
    ``batch(step)``: update ``step + 1``'s global batch (inputs, targets) in global order, a function of the step
    only; ``loss_fn(model, x, y)``: a micro batch's mean loss. The rank's share is the plan's (PODRUN_LOCAL_BATCH,
    PODRUN_GRAD_ACCUM)."""
    from podrun.runtime.env import read_worker_info

    path = os.environ.get(PLAN_ENV)
    if not path or not dist.is_initialized() or dist.get_backend() != "gloo" or dist.get_world_size() < 2:
        return None
    info = read_worker_info()
    rank, world = dist.get_rank(), dist.get_world_size()
    ga = info.grad_accum if info.grad_accum is not None else 1
    local = info.local_batch if info.local_batch is not None else global_batch // (world * ga)
    store = dist.distributed_c10d._get_default_store()
    group = Group(store, rank, world, 0, timeout_s)
    return Loop(model, opt, group, Share(rank, world, local, ga), global_batch, batch, loss_fn, store, Watch(path),
                reshard, timeout_s)
