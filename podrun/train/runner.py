"""The entry every recipe calls: ``train(TrainConfig)`` picks the device, then runs the IPU path or setup -> resume -> loop."""
from __future__ import annotations

import gc
import sys
from typing import Any

from podrun.runtime.distributed import destroy_distributed, init_distributed, select_device
from podrun.runtime.env import WorkerInfo, read_worker_info
from podrun.safefs import UnsafePath
from podrun.train.config import CONFIG_FILE, TrainConfig, TrainError, config_dict, decompose, write_config

__all__ = ["TrainConfig", "TrainError", "config_dict", "decompose", "train"]


def train(cfg: TrainConfig, info: WorkerInfo | None = None) -> dict[str, Any]:
    """Train to cfg.steps / cfg.epochs; returns the summary (also written to <run_dir>/train_summary.json)."""
    from podrun.train import setup

    info = info or read_worker_info()
    device = select_device(cfg.device, info)
    setup.set_threads(cfg, info, device)
    if device.kind == "ipu":
        from podrun.train.ipu import train_ipu

        return train_ipu(cfg, info, device)
    setup.setup_determinism(cfg)
    init_distributed(info=info, device=device, timeout=cfg.dist_timeout)
    try:
        return _train(cfg, info, device)
    finally:
        # what _train built is freed on its return, but a wrapper caught in a reference cycle (hooks that hold
        # their module) lives until a collection: gloo work still alive at destroy aborts the worker at exit
        gc.collect()
        from podrun.runtime.inplace import abandoned_any

        if not abandoned_any():        # after an in-place recovery the first group holds a dead peer: never torn down
            destroy_distributed()


def _train(cfg: TrainConfig, info: WorkerInfo, device) -> dict[str, Any]:
    """setup -> resume -> loop. Its own frame, so that the session (the DDP/FSDP wrappers and their
    reducers) is freed before the process group is destroyed: freed after it, gloo's destructors can hang."""
    from podrun.train import inplace_loop, loop, save, setup

    in_place = inplace_loop.wanted(cfg, info, device)
    s = setup.prepare(cfg, info, device, inplace=in_place)
    writer = save.snapshot_writer(s)
    try:
        step, acc, origin = save.restore(s, writer)
        save.check_room(s, step)
        if s.rank == 0:
            try:
                write_config(s.run_dir, cfg, {**s.resolved(), "resumed_from": loop.resumed_from(origin, step),
                                              "resumed_at_step": step})
            except (OSError, UnsafePath) as exc:     # a record of the run, not its state: training goes on
                why = exc.message if isinstance(exc, UnsafePath) else exc.strerror or exc
                print(f"podrun: cannot write {s.run_dir / CONFIG_FILE}: {why}; training goes on",
                      file=sys.stderr, flush=True)
        return loop.run(s, step, acc, origin, writer, inplace_loop.InPlace(s) if in_place else None)
    finally:
        if writer is not None:
            writer.close()
        for held in s.locks:
            held.release()
