"""Benchmarks of the training runner: step throughput against a plain torch loop, and the atomic checkpoint cost.

    python -c "import bench.bench_train as b, json; print(json.dumps(b.run(quick=True), indent=1))"
"""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path


def _plain_loop(steps: int, batch: int, image_size: int) -> list[float]:
    """The peer: the same model, data, optimiser and batch in a bare torch loop (no runner)."""
    import torch

    from podrun import models
    from podrun.train.data import digits, normalize

    torch.manual_seed(0)
    train, _ = digits(image_size)
    model = models.build("resnet18", 10, stem="cifar", norm="batch")
    opt = torch.optim.SGD(model.parameters(), lr=0.025, momentum=0.9, nesterov=True, weight_decay=5e-4)
    g = torch.Generator().manual_seed(0)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        idx = torch.randperm(len(train), generator=g)[:batch].numpy()
        x, y = train.batch(idx, 0, True)
        loss = torch.nn.functional.cross_entropy(model(normalize(x, train.mean, train.std)), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t)
    return times


def _runner(steps: int, batch: int, image_size: int, run_dir: Path) -> list[float]:
    from podrun.runtime.env import read_worker_info
    from podrun.rundir.metrics import read_metrics
    from podrun.train.runner import TrainConfig, train

    cfg = TrainConfig(model="resnet18", model_kwargs={"stem": "cifar", "norm": "batch"}, data="digits",
                      image_size=image_size, num_classes=10, steps=steps, global_batch=batch, lr=0.025,
                      optimizer="sgd", momentum=0.9, nesterov=True, weight_decay=5e-4, run_dir=str(run_dir),
                      resume=False, eval_every=0, console=False)
    train(cfg, read_worker_info({}))
    return [r["step_seconds"] for r in read_metrics(run_dir) if r.get("kind") == "step"]


def run(quick: bool) -> list[dict]:
    import torch

    rows = []
    steps, batch, size = (8, 32, 16) if quick else (20, 64, 16)
    repeats = 2 if quick else 3
    runner, plain = [], []
    with tempfile.TemporaryDirectory() as d:
        for i in range(repeats):   # interleaved, so load from other processes hits both alike
            runner.append(statistics.median(_runner(steps, batch, size, Path(d) / f"run{i}")[2:]))
            plain.append(statistics.median(_plain_loop(steps, batch, size)[2:]))  # first steps: warm-up
    v, p = batch / statistics.median(runner), batch / statistics.median(plain)
    rows.append({"benchmark": f"train step throughput, resnet18 (cifar stem) {size}px digits, batch {batch}, 1 CPU worker",
                 "subject": "podrun.train runner", "value": v, "peer": "plain torch loop", "peer_value": p,
                 "ratio": v / p, "unit": "img/s",
                 "note": f"median over {repeats} interleaved repeats of {steps - 2} steps, {torch.get_num_threads()} "
                         "threads; the runner adds prefetch, metrics and the step-stat all-reduce"})

    import torch as _t

    from podrun.train import checkpoint as ckpt

    state = {"model": {f"w{i}": _t.randn(256, 1024) for i in range(12)}}   # ~12.6 MB, about resnet18-size/3
    reps = 3 if quick else 9
    ours, peer = [], []
    with tempfile.TemporaryDirectory() as d:
        for i in range(reps):
            t = time.perf_counter()
            ckpt.save(state, d, i + 1, keep=2)
            ours.append(time.perf_counter() - t)
            t = time.perf_counter()
            _t.save(state, Path(d) / "plain.pt")
            peer.append(time.perf_counter() - t)
    o, p = statistics.median(ours), statistics.median(peer)
    rows.append({"benchmark": "checkpoint save, 12.6 MB state", "subject": "podrun atomic save (tmp+fsync+rename)",
                 "value": o * 1000, "peer": "torch.save in place", "peer_value": p * 1000, "ratio": o / p,
                 "unit": "ms", "note": f"median of {reps}; the fsync is what makes kill -9 safe"})
    return rows


if __name__ == "__main__":
    from bench.rows import run_alone

    run_alone(run)
