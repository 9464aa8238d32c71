"""Each rank's step split (issue 43): is a slow rank named with its cause, is a healthy run left alone, and what the
split costs. Real `podrun launch` runs of the digits recipe (resnet18, 8 px, global batch 8) with 2 local workers:

- input: rank 1's loader slowed 0.3 s a batch (PODRUN_TEST_INPUT_DELAY, the loader's test knob): named "input"
  within 10 steps?
- compute: rank 1's forward made 0.1 s slower (tests/launch/scripts/slow_recipe.py: the runner on a GroupNorm
  net): named "compute"?
- neighbour: the workers bound to one core each (--cpu-bind 0,1) and NEIGHBOURS processes spinning on rank 1's
  core: named "compute"? (On this shared 2-core machine the other sessions' unbound processes move to the other
  core, so a neighbour slows both ranks alike: bench/RESULTS.md says what it gave.)
- healthy: no knob, no neighbour, under whatever load the machine has: any note (a slow rank, an input-bound run)?
- cost: the 2-rank DDP loop of bench_busy with every stamp of the split against no clock, interleaved.

    python -m bench split            # 5 input, 5 compute, 5 neighbour, 10 healthy runs; 5 interleaved cost pairs
    python -m bench --quick split    # 1, 1, 1, 2; 1 pair
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

from bench.bench_busy import one
from bench.rows import rows_for, scratch

HERE = Path(__file__).resolve().parent
RECIPE = HERE.parent / "recipes" / "resnet18_cifar10"
STEPS = 16
NEIGHBOURS = 3
SLOW_RECIPE = HERE.parent / "tests" / "launch" / "scripts" / "slow_recipe.py"
TINY = dict(data="digits", image_size=8, num_classes=10, steps=STEPS, global_batch=8, lr=0.1, optimizer="sgd",
            eval_every=0, console=False, resume=False, checkpoint_every=0, keep_checkpoints=0, seed=3)
NAMED = re.compile(r"^podrun: rank (\d+) on \S+ is slow: .*; the cause: (\w+):", re.M)
row = rows_for("split")


def _spin() -> subprocess.Popen:
    """A busy neighbour on core 1: a python loop bound there."""
    return subprocess.Popen([sys.executable, "-c", "import os\nos.sched_setaffinity(0, {1})\nwhile True: pass"])


def _launch(runs: Path, env: dict, bind: str = "none", neighbours: int = 0, slow_forward: float = 0.0) -> dict:
    """One run of the digits recipe (or, with ``slow_forward``, the runner on slow_recipe.py's net with rank 1's
    forward that much slower): what podrun named (rank, cause, from_step of each slow rank; the input-bound note)
    and each rank's mean split."""
    before = set(runs.iterdir()) if runs.exists() else set()
    what = [sys.executable, str(SLOW_RECIPE), json.dumps(TINY), "1", str(slow_forward)] if slow_forward > 0 else \
        [str(RECIPE), "--data", "digits", "--image-size", "8", "--steps", str(STEPS), "--eval-every", "0",
         "--keep-checkpoints", "0"]
    argv = [sys.executable, "-m", "podrun", "launch", "--devices-per-host", "2", "--global-batch", "8",
            "--cpu-bind", bind, "--runs-dir", str(runs), *(["--"] if slow_forward > 0 else []), *what]
    spins = [_spin() for _ in range(neighbours)]
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(HERE.parent), **env})
    finally:
        for spin in spins:
            spin.kill()
            spin.wait()
    if cp.returncode != 0:
        raise RuntimeError(f"podrun launch exited {cp.returncode}: {cp.stderr[-2000:]}")
    (run_dir,) = set(runs.iterdir()) - before
    s = json.loads((run_dir / "summary.json").read_text())
    return {"named": [(r["rank"], r.get("cause"), r["from_step"]) for r in s["slow_ranks"]],
            "console": NAMED.findall(cp.stderr), "bound": "the run is input-bound" in cp.stderr,
            "split": s.get("step_split", {}).get("ranks", {})}


def _hit(run: dict, cause: str) -> bool:
    """Rank 1 named, with ``cause``, within 10 steps of the first (its window of 10 reports), and no other rank."""
    return [(r, c) for r, c, _ in run["named"]] == [(1, cause)] and run["named"][0][2] <= 10 and not run["bound"]


def run(quick: bool) -> list[dict]:
    n_in, n_cpu, n_ok, pairs, steps = (1, 1, 2, 1, 50) if quick else (5, 5, 10, 5, 300)
    with scratch("split") as d:
        inputs = [_launch(d / "runs", {"PODRUN_TEST_INPUT_DELAY": "1=0.3"}) for _ in range(n_in)]
        computes = [_launch(d / "runs", {}, slow_forward=0.1) for _ in range(n_cpu)]
        neighbours = [_launch(d / "runs", {}, bind="0,1", neighbours=NEIGHBOURS) for _ in range(n_cpu)]
        healthy = [_launch(d / "runs", {}) for _ in range(n_ok)]
    on, off = [], []
    for _ in range(pairs):
        on.append(one("split", steps)[0])
        off.append(one("plain", steps)[0])

    def said(runs: list[dict]) -> str:
        return "; ".join(",".join(f"r{r} {c} @{at}" for r, c, at in x["named"]) + (" input-bound" if x["bound"] else "")
                         or "none" for x in runs)

    def waits(runs: list[dict], part: str) -> str:
        return ", ".join(f"{x['split'].get('1', {}).get(part, 0) * 1000:.0f}/"
                         f"{x['split'].get('0', {}).get(part, 0) * 1000:.0f}" for x in runs)

    false_notes = sum(len(x["named"]) + x["bound"] for x in healthy)
    return [
        row("input-bound rank named 'input' within 10 steps", sum(_hit(x, "input") for x in inputs), "runs",
            f"rank 1's loader +0.3 s a batch, {STEPS} steps; named: {said(inputs)}; input ms rank 1/rank 0 (mean): "
            f"{waits(inputs, 'input')}", "runs made", n_in),
        row("compute-slow rank (its forward +0.1 s) named 'compute' within 10 steps",
            sum(_hit(x, "compute") for x in computes), "runs",
            f"the runner on slow_recipe.py's GroupNorm net; named: {said(computes)}; compute ms rank 1/rank 0 "
            f"(mean): {waits(computes, 'compute')}", "runs made", n_cpu),
        row("compute-slow rank (busy neighbours on its core) named 'compute' within 10 steps",
            sum(_hit(x, "compute") for x in neighbours), "runs",
            f"digits recipe, --cpu-bind 0,1, {NEIGHBOURS} python loops bound to core 1; named: {said(neighbours)}; "
            f"compute ms rank 1/rank 0 (mean): {waits(neighbours, 'compute')}", "runs made", n_cpu),
        row("healthy run: notes (slow rank or input-bound)", false_notes, "notes",
            f"{n_ok} runs, no knob, no neighbour; named: {said(healthy)}", "runs made", n_ok),
        row("DDP step with the split's every stamp", on, "ms",
            f"2 ranks, gloo on loopback, 6 x Linear(768, 768), batch 32, {steps} steps; median step, median of "
            f"{pairs} interleaved runs (split/plain ms: {'; '.join(f'{a:.2f}/{b:.2f}' for a, b in zip(on, off))})",
            "DDP, no clock", off),
        row("healthy run: median step split, rank 0 (input/compute/comm/optim ms)",
            statistics.median(x["split"].get("0", {}).get("compute", 0) * 1000 for x in healthy), "ms",
            "compute shown; every run's " + "; ".join("/".join(f"{x['split'].get('0', {}).get(k, 0) * 1000:.0f}"
                                                               for k in ("input", "compute", "comm", "optim"))
                                                      for x in healthy)),
    ]


if __name__ == "__main__":
    from bench.rows import run_alone

    run_alone(run)
