"""Proof: a checkpoint holds the position in global samples and the data order is a function of the seed and the
epoch only, so a run killed on 4 replicas and resumed on 3 (same global batch, another local batch) trains exactly
as a run that was never cut. Real processes, real torch.distributed gloo on loopback, a GroupNorm model."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from podrun.train import checkpoint as ckpt
from podrun.rundir.metrics import latest_by_step, read_metrics
from tests.train.train_procs import (SGD_COSINE, assert_same_final_weights, kill_mid_run, outside_env, start_workers,
                                    train_opts, wait_all)

ROOT = Path(__file__).resolve().parents[2]
STEPS = 40
GLOBAL = 24          # divisible by 4, 3 and 2 replicas


def _opts(run_dir, **kw):
    return train_opts(run_dir, **{**SGD_COSINE, "steps": STEPS, "global_batch": GLOBAL, "checkpoint_every": 5, **kw})


@pytest.mark.timeout(420)
def test_killed_on_4_replicas_resumed_on_3_continues_the_same_curve(tmp_path):
    """The reference, never cut, runs on 2 replicas (local batch 12): with GroupNorm the split of the global
    batch changes only float rounding, so it is the curve of a run that stayed on 4 (rel 1e-5), and a data order
    that depended on the replica count would show before the cut (4 vs 2) and after it (3 vs 2). Two processes
    to start rather than four."""
    ref_dir, run_dir = tmp_path / "never-cut-on-2", tmp_path / "4-then-3"
    seen = kill_mid_run(4, _opts(run_dir), run_dir, 12)
    saved = ckpt.list_checkpoints(run_dir / "checkpoints")
    state = torch.load(saved[-1], weights_only=False)
    # the position is in global samples, on a global-batch boundary
    assert state["samples"] == state["step"] * GLOBAL and 5 <= state["step"] <= seen < STEPS, (state["step"], seen)
    assert state["global_batch"] == GLOBAL

    resumed = start_workers(3, _opts(run_dir))          # the same run on 3 replicas
    ref = start_workers(2, _opts(ref_dir))              # beside it: neither reads the other's directory
    wait_all(resumed, timeout=300)
    wait_all(ref, timeout=300)

    records = read_metrics(run_dir)
    resume = [r for r in records if r.get("event") == "resume"]
    assert len(resume) == 1, resume
    assert (resume[0]["step"], resume[0]["samples"]) == (state["step"], state["samples"])
    assert (resume[0]["world_size"], resume[0]["local_batch"], resume[0]["grad_accum"]) == (3, 8, 1)
    start = [r for r in records if r.get("event") == "start"][0]
    assert (start["world_size"], start["local_batch"]) == (4, 6)

    got = [(r["step"], r["loss"], r["accuracy"], r["lr"]) for r in latest_by_step(records, "step")]
    want = [(r["step"], r["loss"], r["accuracy"], r["lr"]) for r in latest_by_step(read_metrics(ref_dir), "step")]
    assert [row[0] for row in got] == list(range(1, STEPS + 1))
    losses = [row[1] for row in want]
    assert max(losses) - min(losses) > 0.05, f"the loss curve is flat, the test would prove nothing: {losses}"
    for g, w in zip(got, want):
        assert g == pytest.approx(w, rel=1e-5, abs=1e-7), f"step {g[0]}: 4->3 {g} vs never cut (2) {w}"
    a, b = assert_same_final_weights(run_dir, ref_dir, rtol=1e-5, atol=1e-6)
    assert a["samples"] == b["samples"] == STEPS * GLOBAL


@pytest.mark.timeout(180)
def test_resume_with_another_global_batch_is_refused_exit_2(tmp_path):
    """train.py resumed onto a decomposition that cannot continue the sequence: one paragraph, exit 2."""
    train_py = ROOT / "recipes" / "resnet18_cifar10" / "train.py"
    common = ["--data", "digits", "--image-size", "8", "--steps", "2", "--run-dir", str(tmp_path / "r"), "--quiet",
              "--eval-every", "0"]
    first = subprocess.run([sys.executable, str(train_py), *common, "--global-batch", "16"], env=outside_env(OMP_NUM_THREADS="1"),
                           capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr
    again = subprocess.run([sys.executable, str(train_py), *common, "--global-batch", "32", "--steps", "4"],
                           env=outside_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=120)
    assert again.returncode == 2, again.stdout + again.stderr
    assert "Traceback" not in again.stderr
    assert "saved at global batch 16 after 32 samples" in again.stderr and "uses global batch 32" in again.stderr
    assert "hint:" in again.stderr and "--no-resume" in again.stderr
    # nothing was trained or rewritten by the refused attempt
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "r" / "checkpoints")] == ["ckpt-000000002.pt"]
