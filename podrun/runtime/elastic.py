"""The user-script API of elastic runs: ``plan()``, ``snapshot(step, state)`` after each update, ``restore()``.

    from podrun.runtime import elastic

    p = elastic.plan()                      # rank, world size, local batch, GA, global batch, restart count
    got = elastic.restore()                 # after init_process_group: every rank calls it
    if got is not None:
        model.load_state_dict(got.state["model"]); opt.load_state_dict(got.state["opt"]); step = got.step
    ...
        opt.step()
        step += 1
        elastic.snapshot(step, {"model": model, "opt": opt})

``snapshot`` copies the state into this host's shared memory on a background thread (modules and optimizers are
taken as their state dicts; the next optimizer step waits for the copy). ``restore`` agrees with every rank on
the newest snapshot any of them holds and sends it to the ranks that do not hold it; None when there is none
(or none newer than ``newer_than``, a disk checkpoint's step). Outside podrun launch (no PODRUN_SNAPSHOT_DIR)
``snapshot`` does nothing and ``restore`` returns None. The state is kept in podrun's raw format (tensors, numpy
arrays, numbers, strings, bools, None, bytes, and lists, tuples and dicts with int or str keys of them: nothing is
unpickled on restore); a state holding anything else is written with torch.save and read back with
``torch.load(weights_only=True)``, which refuses most other types. torch is imported only when these are called.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from podrun.runtime.env import read_worker_info
from podrun.runtime.snapshot import Restored, freeze, open_writer, recover

_writer = None      # this process's snapshot writer, made by the first snapshot or restore (False: none, said why)


@dataclass(frozen=True)
class Plan:
    """This attempt's share of the run (the env contract): a re-plan changes all but the global batch."""

    rank: int
    local_rank: int
    world_size: int
    replica: int             # this worker's first replica (PODRUN_REPLICA_OFFSET)
    replicas: int
    local_batch: int | None
    grad_accum: int | None
    global_batch: int | None
    restart_count: int


def plan() -> Plan:
    i = read_worker_info()
    return Plan(rank=i.rank, local_rank=i.local_rank, world_size=i.world_size, replica=i.replica_offset,
                replicas=i.num_replicas, local_batch=i.local_batch, grad_accum=i.grad_accum,
                global_batch=i.global_batch, restart_count=i.restart_count)


def _get_writer():
    global _writer
    if _writer is None:
        info = read_worker_info()
        if not info.snapshot_dir:
            return None
        # one writer per host; None said why (no key, or a directory podrun will not use): no snapshots, once
        _writer = open_writer(info.snapshot_dir, writes=info.local_rank == 0) or False
    return _writer or None


def _plain(state: dict[str, Any]) -> dict[str, Any]:
    """Modules -> their state dicts (buffers copied now), optimizers and anything with state_dict() -> theirs."""
    import torch

    out = {}
    for k, v in state.items():
        if isinstance(v, torch.nn.Module):
            out[k] = freeze(v)
        elif hasattr(v, "state_dict") and callable(v.state_dict):
            out[k] = v.state_dict()
        else:
            out[k] = v
    return out


def snapshot(step: int, state: dict[str, Any]) -> None:
    """Keep ``state`` as the state after update ``step`` (call it after every optimizer step, on every rank)."""
    w = _get_writer()
    if w is not None:
        w.submit(step, _plain(state))


def restore(newer_than: int = -1) -> Restored | None:
    """The newest snapshot any rank holds, on every rank (a collective: call it on every rank after
    init_process_group); None when no rank holds one newer than update ``newer_than``."""
    return recover(_get_writer(), newer_than, read_worker_info().restart_count)


def close() -> None:
    """Wait for the last snapshot write (at the end of training; restore and snapshot need no close)."""
    if _writer:
        _writer.close()
