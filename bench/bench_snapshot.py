"""The cost of the runner's in-memory snapshot after every update: step time with and without, side by side.

    python -m bench snapshot            (--quick: fewer steps and repeats)
"""
from __future__ import annotations

import statistics
import tempfile
import time
import uuid
from pathlib import Path


def _steps(steps: int, batch: int, size: int, run_dir: Path, snapshot_dir: str | None) -> list[float]:
    """Seconds of each update of the runner (one CPU worker, resnet18 cifar stem on digits), with snapshots
    into ``snapshot_dir`` or none."""
    from podrun.runtime.env import read_worker_info
    from podrun.rundir.metrics import read_metrics
    from podrun.train.runner import TrainConfig, train

    cfg = TrainConfig(model="resnet18", model_kwargs={"stem": "cifar", "norm": "batch"}, data="digits",
                      image_size=size, num_classes=10, steps=steps, global_batch=batch, lr=0.025,
                      optimizer="sgd", momentum=0.9, nesterov=True, weight_decay=5e-4, run_dir=str(run_dir),
                      resume=False, eval_every=0, console=False, keep_checkpoints=0)
    env = {"PODRUN_SNAPSHOT_DIR": snapshot_dir} if snapshot_dir else {}
    train(cfg, read_worker_info(env))
    return [r["step_seconds"] for r in read_metrics(run_dir) if r.get("kind") == "step"]


def run(quick: bool) -> list[dict]:
    import os
    import secrets

    import torch

    from podrun.wire.worker_env import SNAPSHOT_KEY_NAME
    from podrun.runtime import snapshot

    os.environ.setdefault(SNAPSHOT_KEY_NAME, secrets.token_hex(32))     # as podrun launch gives every worker

    steps, batch, size = (10, 32, 16) if quick else (30, 64, 16)
    repeats = 2 if quick else 4
    on, off = [], []
    shm = Path("/dev/shm") / f"podrun-bench-{uuid.uuid4().hex[:8]}" / "host"
    t_write = []
    try:
        with tempfile.TemporaryDirectory() as d:
            for i in range(repeats):     # interleaved, so load from other processes hits both alike
                on.append(statistics.median(_steps(steps, batch, size, Path(d) / f"on{i}", str(shm))[2:]))
                off.append(statistics.median(_steps(steps, batch, size, Path(d) / f"off{i}", None)[2:]))
            size_mb = max(p.stat().st_size for p in shm.glob("slot-*.bin")) / 1e6
            from podrun.models import build

            model = build("resnet18", 10, stem="cifar", norm="batch")
            w = snapshot.Writer(shm.parent / "alone")
            for k in range(5):            # the write alone, waited for: what the background thread does
                t = time.perf_counter()
                w.submit(k + 1, {"model": snapshot.freeze(model)})
                w.wait()
                t_write.append(time.perf_counter() - t)
            w.close()
    finally:
        for sub in (shm, shm.parent / "alone"):
            snapshot.remove(sub)
    o, p = statistics.median(on), statistics.median(off)
    return [{"benchmark": f"runner step time, resnet18 (cifar stem) {size}px digits, batch {batch}, 1 CPU worker",
             "subject": "snapshot after every update", "value": o * 1000, "peer": "--no-snapshots",
             "peer_value": p * 1000, "ratio": o / p, "unit": "ms",
             "note": f"median over {repeats} interleaved repeats of {steps - 2} steps' medians, "
                     f"{torch.get_num_threads()} threads; snapshot {size_mb:.1f} MB (weights, momentum, BN stats); "
                     f"the write alone {statistics.median(t_write) * 1000:.1f} ms (weights only, waited for)"}]


if __name__ == "__main__":
    from bench.rows import run_alone

    run_alone(run)
