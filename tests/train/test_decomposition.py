"""Proof: the decomposition of one global batch (1 worker x GA 4, 2 x 2, 4 x 1) does not change training.

Real processes, real torch.distributed gloo on loopback, a GroupNorm model (batch-independent), fixed
seed, deterministic mode, real JPEGs decoded by loader worker processes: the per-step loss curves and the final
weights agree within float tolerance.
"""
from __future__ import annotations

import pytest
import torch

from podrun.rundir.metrics import latest_by_step, read_metrics
from tests.ports import free_port
from tests.train.train_procs import start_workers, wait_all

STEPS = 10


@pytest.mark.timeout(240)
def test_same_loss_curve_for_1x4_2x2_4x1(tmp_path):
    """On an ImageNet-style folder of JPEGs (decoded, randomly cropped and flipped per sample), 1x4 with the loader
    in the rank, 2x2 with 2 loader worker processes per rank, 4x1 with 1: the same samples in every update, the same
    augmentation whoever decodes it, the same curve and weights."""
    from bench.jpeg_tree import make_tree

    data = make_tree(tmp_path / "jpeg", classes=3, train_per_class=16, val_per_class=2, seed=2, width=120, height=90)
    base = dict(data=str(data), image_size=16, num_classes=3, steps=STEPS, global_batch=16, lr=0.3,
                optimizer="sgd", momentum=0.9, weight_decay=1e-4, schedule="cosine", warmup_epochs=0.05,
                deterministic=True, seed=7, eval_every=0, console=False, resume=False, checkpoint_every=0)
    runs = {}
    procs = {}
    for world, ga, workers in ((1, 4, 0), (2, 2, 2), (4, 1, 1)):
        d = tmp_path / f"w{world}ga{ga}"
        procs[(world, ga)] = (d, start_workers(world, {**base, "grad_accum": ga, "loader_workers": workers,
                                                       "run_dir": str(d)}))
    for key, (d, ps) in procs.items():
        wait_all(ps, timeout=210)
        steps = latest_by_step(read_metrics(d), "step")
        assert [r["step"] for r in steps] == list(range(1, STEPS + 1)), key
        start = [r for r in read_metrics(d) if r.get("event") == "start"][0]
        assert (start["world_size"], start["grad_accum"], start["local_batch"]) == (key[0], key[1], 16 // (key[0] * key[1]))
        assert (start["dataset"], start["loader_workers"]) == ("folder", {1: 0, 2: 2, 4: 1}[key[0]])
        runs[key] = d
    curves = {k: [r["loss"] for r in latest_by_step(read_metrics(d), "step")] for k, d in runs.items()}
    ref = curves[(1, 4)]
    assert max(ref) - min(ref) > 0.01, f"the loss curve is flat, the test would prove nothing: {ref}"
    for key, curve in curves.items():
        assert curve == pytest.approx(ref, rel=1e-4, abs=1e-5), f"{key}: {curve} vs 1x4 {ref}"
    # the final weights (rank 0's checkpoint at the end) agree too
    weights = {k: torch.load(sorted((d / "checkpoints").glob("ckpt-*.pt"))[-1], weights_only=False)["model"]
               for k, d in runs.items()}
    for key, sd in weights.items():
        for name, t in sd.items():
            torch.testing.assert_close(t, weights[(1, 4)][name], rtol=1e-4, atol=1e-5,
                                       msg=lambda m: f"{key} {name}: {m}")


@pytest.mark.timeout(180)
def test_stats_fetched_every_few_steps_give_the_same_rows(tmp_path):
    """sync_every (CUDA's default: log_every) fetches the step stats in one all-reduce per interval, so
    the host does not wait for the device every step. Two gloo workers: the step rows (loss, accuracy, lr),
    the epoch rows and the checkpoint are those of fetching every step, also across an epoch end and a
    checkpoint step that fall inside an interval. Both runs go through the same two worker processes, one after
    the other: each run seeds itself, so the second's rows owe nothing to the first's."""
    base = dict(data="digits", image_size=8, num_classes=10, steps=14, global_batch=128, lr=0.5, optimizer="sgd",
                momentum=0.9, schedule="cosine", deterministic=True, seed=3, eval_every=0, console=False,
                resume=False, checkpoint_every=5)
    # both runs in the same two workers, one after the other (each run seeds itself; the second meets on a port
    # of its own): one interpreter start per worker rather than per run
    wait_all(start_workers(2, [{**base, "sync_every": 1, "run_dir": str(tmp_path / "sync1")},
                               {**base, "sync_every": 4, "run_dir": str(tmp_path / "sync4"),
                                "master_port": free_port()}]), timeout=170)
    runs = {k: [r for r in read_metrics(tmp_path / f"sync{k}") if r.get("kind") in ("step", "epoch")] for k in (1, 4)}
    keys = ("kind", "step", "epoch", "loss", "accuracy", "lr")
    one, four = ([{k: r.get(k) for k in keys} for r in rows] for rows in (runs[1], runs[4]))
    assert [r["step"] for r in one if r["kind"] == "step"] == list(range(1, 15))
    assert len([r for r in one if r["kind"] == "epoch"]) >= 1, "no epoch end inside the run: the test would prove less"
    assert one == four
    ck = {k: sorted(p.name for p in (tmp_path / f"sync{k}" / "checkpoints").glob("ckpt-*.pt")) for k in (1, 4)}
    assert ck[1] == ck[4] and ck[1]
