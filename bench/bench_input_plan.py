"""The calibrated plan's input against a launched folder run on this machine's CPU (docs/calibrate.md, "How the plan
uses it"): `podrun calibrate --data TREE` (the recipe's step and its input pipeline), `podrun plan --calibration`
(the step with the input in it, and whether input bounds it), then `podrun launch` of the same recipe on the same
folder for some steps; the plan's step beside the run's median step, and the run's step split (input, compute).

On a machine that others load, the same calibration runs again just after the launch, and the row's plan is the
mean of the two plans (each in its note): the load the run met lies between the two, most often
(BENCH_INPUT_PLAN_BRACKET=0: the one before alone).

Two cases, resnet18_cifar10 on one host (one rank, its default loader workers: the host's cores):

- input-bound: a tree of large noisy JPEGs (3200 x 2400, noise 60, quality 98: ~10 MB each; the entropy decoding,
  which no DCT scaling skips, costs ~56 ms of CPU a file here) trained at 8 px with one torch thread
  (OMP_NUM_THREADS=1 for the calibration and the run: on a loaded machine two threads' barriers cost far more than
  the arithmetic), where the model's step is cheap and the decode is not;
- the recipe as it is (32 px) on bench/jpeg_tree.py's tree of 500 x 375 JPEGs (~96 KB, ImageNet's typical size)
  with 2 loader workers, where the step split should not name input as the cause.

    python -m bench --keep input-plan           # 12 steps a run (10 step splits: the input-bound rule's window), the median of steps 3-12
    python -m bench --quick input-plan          # 6 steps, the median of steps 3-6
    BENCH_INPUT_PLAN_CASE=bound python -m bench --keep input-plan      # one case alone (bound or r18)

Global batch 32 (local batch 8 x GA 4 on one rank); the launch's heartbeat is 2 s (a loaded machine's agent can miss
the default's four of 0.25 s while the run is well).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.rows import row, scratch

ROOT = Path(__file__).resolve().parents[1]
RECIPE = str(ROOT / "recipes" / "resnet18_cifar10")
GLOBAL_BATCH = 32
BRACKET = os.environ.get("BENCH_INPUT_PLAN_BRACKET", "1") != "0"     # calibrate again after the run (0: not)


def _podrun(*args, cwd: Path, timeout: float = 1500, env: dict | None = None) -> subprocess.CompletedProcess:
    cp = subprocess.run([sys.executable, "-m", "podrun", *args], capture_output=True, text=True, cwd=cwd,
                        timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    if cp.returncode != 0:
        raise RuntimeError(f"podrun {' '.join(args[:2])} exited {cp.returncode}: {cp.stderr[-3000:]}")
    return cp


def case(tmp: Path, name: str, tree: Path, image_size: int, *, steps: int, timed_from: int,
         loader_workers: int | None = None, env: dict | None = None) -> dict:
    """Calibrate (rate at local batch 8, the input on ``tree``), plan with it, launch ``steps`` steps: the figures."""
    runs = tmp / "runs"

    def calibrated(label: str) -> tuple[dict, dict]:
        c = json.loads(_podrun("calibrate", "--devices-per-host", "1", "--largest-batch", "8", "--batches", "8",
                               "--steps", "5", "--image-size", str(image_size), "--data", str(tree), "--input-images",
                               "64", "--name", label, "--runs-dir", str(runs), "--json", RECIPE, cwd=tmp,
                               env=env).stdout)
        plan = json.loads(_podrun("plan", "--devices-per-host", "1", "--global-batch", str(GLOBAL_BATCH), RECIPE,
                                  "--calibration", c["file"], "--json", cwd=tmp).stdout)
        return c, plan

    t0 = time.monotonic()
    c, plan = calibrated(name)
    calib_s = time.monotonic() - t0
    run_id = f"{name}-{int(time.time())}"
    extra = [] if loader_workers is None else ["--loader-workers", str(loader_workers)]
    load0 = os.getloadavg()[0]
    _podrun("launch", "--devices-per-host", "1", "--global-batch", str(GLOBAL_BATCH), "--heartbeat", "2",
            "--calibration", c["file"], "--runs-dir", str(runs), "--run-id", run_id, RECIPE, "--data", str(tree), "--image-size", str(image_size), "--steps", str(steps),
            "--log-every", "1", "--eval-every", "0", "--quiet", *extra, cwd=tmp, env=env)
    load1 = os.getloadavg()[0]
    # the same calibration again just after the run: on a machine others load, the plan either side of the run
    c_after, plan_after = calibrated(f"{name}-after") if BRACKET else (None, None)
    run_dir = runs / run_id
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    step_s = [x["step_seconds"] for x in rows if x.get("kind") == "step" and x["step"] >= timed_from]
    summary = json.loads((run_dir / "summary.json").read_text())
    split = summary.get("step_split") or {}
    ranks = split.get("ranks") or {}
    r0 = next(iter(ranks.values()), {})
    e = plan["estimate"]
    return {"case": name, "image_size": image_size, "calibrate_seconds": calib_s, "input_rates": c["input"]["rates"],
            "decoder": c["input"]["decoder"], "cores": c["input"]["cores"], "device_rate": c["throughput"],
            "step_cpu_seconds": [t.get("cpu_seconds") for t in c["throughput"]],
            "local_batch": plan["local_batch"], "grad_accum": plan["grad_accum"], "global_batch": plan["global_batch"],
            "plan_step": e["step_seconds"], "plan_compute": e["compute_seconds"], "plan_input": e["input_seconds"],
            "plan_input_bound": e["input_bound"], "plan_levers": e["input_levers"], "assumptions": e["assumptions"],
            "run_step": statistics.median(step_s), "run_steps": step_s, "run_split": r0,
            "run_input_bound": split.get("input_bound"), "loads": [load0, load1], "loader_workers": r0.get("loaders"),
            "plan_step_after": None if plan_after is None else plan_after["estimate"]["step_seconds"],
            "assumptions_after": None if plan_after is None else plan_after["estimate"]["assumptions"],
            "input_rates_after": None if c_after is None else c_after["input"]["rates"],
            "device_rate_after": None if c_after is None else c_after["throughput"]}


def _shared(r: dict) -> str:
    """The plan's core-seconds term as its assumption states it."""
    text = r["assumptions"][-1]
    i = text.find("their core-seconds over the cores, ")
    return text[i + len("their core-seconds over the cores, "):].split(" (the compute")[0] if i >= 0 else "-"


def rows_of(results: list[dict]) -> list[dict]:
    out = []
    for r in results:
        what = (f"resnet18_cifar10 at {r['image_size']} px on {r['tree']}, 1 host, {r['cores']} cores, "
                f"b={r['local_batch']} GA={r['grad_accum']}")
        sp = r["run_split"]
        split = ", ".join(f"{k} {sp[k]:.3f} s" for k in ("input", "compute", "comm", "optim") if k in sp)
        bound = r["run_input_bound"]
        after = r.get("plan_step_after")
        value = r["plan_step"] if after is None else (r["plan_step"] + after) / 2
        either = "" if after is None else (f"the mean of the plans from a calibration before the run "
                                           f"({r['plan_step']:.3f} s) and one after it ({after:.3f} s); before: ")
        out.append(row("calibrated plan vs launched folder run: step time", what, value, "s",
                       f"{either}plan: compute {r['plan_compute']:.3f} s, input {r['plan_input']:.3f} s, the step the "
                       f"longest of the two and their core-seconds over the cores ({_shared(r)}), input "
                       f"{'bounds' if r['plan_input_bound'] else 'does not bound'} the step; run: median of "
                       f"{len(r['run_steps'])} steps ({', '.join(f'{x:.2f}' for x in r['run_steps'])}), split "
                       f"{split}, input-bound record {'none' if bound is None else bound}; load average "
                       f"{r['loads'][0]:.1f}-{r['loads'][1]:.1f}", "launched run", r["run_step"]))
    return out


def run(quick: bool) -> list[dict]:
    from bench.jpeg_tree import make_tree

    steps, timed_from = (6, 3) if quick else (12, 3)
    only = os.environ.get("BENCH_INPUT_PLAN_CASE")      # one case alone: bound or r18
    with scratch("input-plan") as d:
        big = make_tree(d / "big", classes=4, train_per_class=8, val_per_class=1, width=3200, height=2400, noise=60,
                        quality=98)
        small = make_tree(d / "small", classes=4, train_per_class=50, val_per_class=1)
        results = []
        for name, tree, px, workers, label, env in (
                ("bound", big, 8, None, "3200x2400 JPEGs (~10 MB), 1 torch thread", {"OMP_NUM_THREADS": "1"}),
                ("r18", small, 32, 2, "500x375 JPEGs (~96 KB), 2 loader workers", None)):
            if only is not None and name != only:
                continue
            print(f"input-plan: {name} ...", file=sys.stderr, flush=True)
            r = case(d, name, tree, px, steps=steps, timed_from=timed_from, loader_workers=workers, env=env)
            r["tree"] = label
            results.append(r)
        print(json.dumps(results), file=sys.stderr)       # every figure, for the record beside the table
    return rows_of(results)


if __name__ == "__main__":
    from bench.rows import run_alone

    run_alone(run)
