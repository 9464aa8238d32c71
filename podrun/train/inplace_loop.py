"""The recipes' in-place recovery: one all-reduce per update through an abandonable group, and its re-forming.

A run that may restart (its agent sets podrun.runtime.inplace.PLAN_ENV) trains on CPU with gloo, data parallel
only (no FSDP, no pipeline), without DDP: each update's gradients and its (loss sum, correct, count) go in one
all-reduce of a podrun.runtime.inplace.Group, so that an update is either applied on every survivor or on none.
When the controller's new plan comes (the agent writes it, a Watch reads it) the group is abandoned: the update in
flight changed nothing (its gradients are dropped, the step not taken, the RNG state put back) and is redone on
the re-formed group, with this rank's new share of the same global batch (a new loader at the same position).
Anything that fails on the way (no plan within PLAN_WAIT_S, a rank that completed one update more than another, a
peer missing from the new group for the process group's timeout, cfg.dist_timeout) ends the worker with a
TrainError: the controller then restarts the run as it would have, from the snapshots.
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Iterator

import torch
import torch.distributed as dist

from podrun.runtime import inplace
from podrun.train.config import TrainError


def wanted(cfg, info, device) -> bool:
    """Whether this worker recovers in place: not --no-inplace, its agent names a plan file, and the run is data
    parallel on CPU over gloo with more than one rank (no FSDP, no torch.compile, one replica per rank)."""
    return (cfg.inplace and bool(os.environ.get(inplace.PLAN_ENV)) and device.kind == "cpu" and not cfg.fsdp and not cfg.compile
            and info.world_size > 1 and info.num_replicas == info.world_size)


class InPlace:
    """The loop's part: ``sync`` after each update's backward, ``recover`` when it raised Abandoned."""

    def __init__(self, s, watch: inplace.Watch | None = None):
        self.store = dist.distributed_c10d._get_default_store()
        self.watch = watch or inplace.Watch(os.environ[inplace.PLAN_ENV])
        self.timeout = s.cfg.dist_timeout       # each group's rendezvous and collectives, as the first group's
        self.group = inplace.Group(self.store, s.rank, s.world, 0, self.timeout)
        self.watch.watch(self.group)
        self.params = [p for p in s.core.parameters() if p.requires_grad]
        self.rng: torch.Tensor | None = None
        self.first: dict[str, Any] | None = None      # the recovery whose first update is still to complete
        from podrun.train import setup

        setup.use_group(self.group)
        inplace.tell({"inplace": "ready", "rank": s.rank})

    def begin(self) -> None:
        """At the update's start: the RNG state its redo starts from."""
        self.rng = torch.get_rng_state()

    def sync(self, s, stats: torch.Tensor) -> torch.Tensor:
        """The update's gradients averaged over the ranks (as DDP's) and its stats summed, in one all-reduce;
        returns the summed stats. Abandoned: nothing was applied."""
        flat = torch.cat([inplace.flat_grads(self.params).float(), stats.float()])
        try:
            self.group.all_reduce(flat)
        except inplace.Abandoned:
            s.opt.zero_grad(set_to_none=True)
            raise
        inplace.set_grads(self.params, flat[:-3] / s.world)
        return flat[-3:].double()

    def done(self, step: int) -> None:
        """After update ``step`` completed: the first update after a recovery is told to the controller."""
        if self.first is not None:
            inplace.tell({**self.first, "inplace": "trained", "step": step, "trained_at": time.time()})
            self.first = None

    def recover(self, s, step: int, loader_iter, make_loader) -> Iterator:
        """After Abandoned in update ``step + 1``: the new plan, the new group, the agreement on ``step``, the new
        share; returns the loader from update ``step + 1`` with the new share. TrainError when anything fails."""
        abandoned_at = time.time()
        gen = self.group.generation
        plan = self.watch.next_plan(gen, inplace.PLAN_WAIT_S)
        if plan is None:
            self._fail(gen, f"its group failed and no new plan came within {inplace.PLAN_WAIT_S:g} s")
        abandoned_at = min(abandoned_at, self.watch.told_at or abandoned_at)
        if self.rng is not None:
            torch.set_rng_state(self.rng)
        try:
            self.group = inplace.Group(self.store, plan.rank, plan.world, plan.generation, self.timeout)
            self.watch.watch(self.group)
            from podrun.train import setup

            setup.use_group(self.group)
            done = torch.tensor([float(step)])
            self.group.all_reduce(done, dist.ReduceOp.MIN)
        except (inplace.Abandoned, RuntimeError) as exc:
            self._fail(plan.generation, f"the group of {plan.world} could not be formed: {exc}".splitlines()[0])
        if int(done.item()) != step:
            self._fail(plan.generation, f"update {step} completed here but not on every survivor (they agree on "
                                        f"{int(done.item())})")
        formed_at = time.time()
        close = getattr(loader_iter, "close", None)
        if close is not None:
            close()
        s.info = dataclasses.replace(s.info, rank=plan.rank, world_size=plan.world, num_replicas=plan.world,
                                     replica_offset=plan.rank, local_batch=plan.local_batch,
                                     grad_accum=plan.grad_accum)
        s.local_batch, s.grad_accum = plan.local_batch, plan.grad_accum
        s.shard = dataclasses.replace(s.shard, local_batch=plan.local_batch, grad_accum=plan.grad_accum,
                                      replicas=plan.world, replica_offset=plan.rank)
        if s.shard.global_batch != s.global_batch:
            self._fail(plan.generation, f"the new plan's {plan.world} x {plan.local_batch} x GA {plan.grad_accum} "
                                        f"is not the global batch {s.global_batch}")
        it = make_loader(s, step)
        self.first = {"generation": plan.generation, "rank": plan.rank, "abandoned_at": abandoned_at,
                      "formed_at": formed_at, "resharded_at": time.time(), "redo": step + 1}
        inplace.tell({**self.first, "inplace": "reformed"})
        return it

    def _fail(self, generation: int, why: str):
        inplace.tell({"inplace": "failed", "generation": generation, "why": why})
        raise TrainError(f"in-place recovery failed: {why}; the run restarts from the snapshots", exit_code=1)
