"""The digits recipe's img/s on this machine with each worker bound to its cores (--cpu-bind auto) and without.

    python -m bench cpubind            # 2 interleaved pairs of 300 steps
    python -m bench --quick cpubind    # 1 pair of 20 steps
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench.rows import row, scratch

HERE = Path(__file__).resolve().parent
RECIPE = HERE.parent / "recipes" / "resnet18_cifar10"
WORKERS = 2
IMAGE_SIZE = 16


def _run(bind: str, steps: int, runs: Path) -> tuple[float, float]:
    """One `podrun launch` of the digits recipe with 2 local workers: (img/s, the median of the steps after the
    first 5 at the recipe's global batch; the run's wall seconds)."""
    from podrun.rundir.metrics import read_metrics

    before = set(runs.iterdir()) if runs.exists() else set()
    argv = [sys.executable, "-m", "podrun", "launch", "--devices-per-host", str(WORKERS), "--cpu-bind", bind,
            "--runs-dir", str(runs), str(RECIPE), "--data", "digits", "--image-size", str(IMAGE_SIZE),
            "--steps", str(steps), "--eval-every", "0"]
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    cp = subprocess.run(argv, capture_output=True, text=True, timeout=1800, env=env, stdin=subprocess.DEVNULL)
    if cp.returncode != 0:
        raise RuntimeError(f"podrun launch --cpu-bind {bind} exited {cp.returncode}: {cp.stderr[-2000:]}")
    (run_dir,) = set(runs.iterdir()) - before
    steps_ = [r for r in read_metrics(run_dir) if r.get("kind") == "step" and "step_seconds" in r]
    rates = [r["images_per_sec"] for r in steps_[5:]] or [r["images_per_sec"] for r in steps_]
    return statistics.median(rates), sum(r["step_seconds"] for r in steps_)


def run(quick: bool) -> list[dict]:
    steps, pairs = (20, 1) if quick else (300, 2)
    bound, free, bound_s, free_s = [], [], [], []
    with scratch("cpubind") as d:
        for i in range(pairs):          # interleaved: the machine's load from others hits both alike
            order = ("auto", "none") if i % 2 == 0 else ("none", "auto")
            for bind in order:
                rate, seconds = _run(bind, steps, d / "runs")
                (bound if bind == "auto" else free).append(rate)
                (bound_s if bind == "auto" else free_s).append(seconds)
    runs = (f"runs: auto {', '.join(f'{v:.1f}' for v in bound)}; none {', '.join(f'{v:.1f}' for v in free)}; "
            f"{os.cpu_count()} cores")
    return [row(f"digits resnet18 {IMAGE_SIZE}px, {WORKERS} local workers, {steps} steps: img/s",
                "--cpu-bind auto", bound, "img/s", runs, "--cpu-bind none", free, digits=1),
            row("train seconds (sum of the steps)", "--cpu-bind auto", bound_s, "s",
                f"median over {pairs} interleaved pair(s)", "--cpu-bind none", free_s, digits=1)]
