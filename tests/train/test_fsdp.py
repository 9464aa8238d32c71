"""FSDP (FSDP2 fully_shard on gloo, CPU) trains like DDP, with GA through set_requires_gradient_sync, and
its full-state checkpoints resume exactly."""
from __future__ import annotations

import pytest

from podrun.train import checkpoint as ckpt
from podrun.rundir.metrics import latest_by_step, read_metrics
from tests.ports import free_port
from tests.train.train_procs import start_workers, train_opts, wait_all


def _opts(run_dir, fsdp):
    return train_opts(run_dir, steps=9, grad_accum=2, lr=0.01, optimizer="adamw", weight_decay=0.05, seed=1,
                      checkpoint_every=3, fsdp=fsdp)


def _curve(run_dir):
    return [(r["step"], r["loss"]) for r in latest_by_step(read_metrics(run_dir), "step")]


@pytest.mark.timeout(180)
def test_fsdp_matches_ddp_and_resumes(tmp_path):
    """DDP, then FSDP in the same two worker processes (each run seeds itself and meets on a port of its own: one
    interpreter start per worker for both), give the same curve; FSDP restarted from its step-6 checkpoint in new
    processes continues it exactly."""
    ddp, fsdp = tmp_path / "ddp", tmp_path / "fsdp"
    wait_all(start_workers(2, [_opts(ddp, False), {**_opts(fsdp, True), "master_port": free_port()}]), 150)
    assert len(_curve(ddp)) == 9 and _flat(_curve(fsdp)) == pytest.approx(_flat(_curve(ddp)), rel=1e-5, abs=1e-6)
    want = _curve(fsdp)
    # drop the final checkpoint and the records after step 6: the rerun resumes from step 6 under FSDP
    ckpt.list_checkpoints(fsdp / "checkpoints")[-1].unlink()
    assert int(ckpt.list_checkpoints(fsdp / "checkpoints")[-1].name[5:14]) == 6
    lines = (fsdp / "metrics.jsonl").read_text().splitlines()
    keep = [l for l in lines if '"kind": "step"' in l and int(l.split('"step": ')[1].split(",")[0]) <= 6]
    (fsdp / "metrics.jsonl").write_text("\n".join(keep) + "\n")
    wait_all(start_workers(2, _opts(fsdp, True)), 150)
    assert [r for r in read_metrics(fsdp) if r.get("event") == "resume"][0]["step"] == 6
    assert _flat(_curve(fsdp)) == pytest.approx(_flat(want), rel=1e-6, abs=1e-7)


def _flat(rows):
    """pytest.approx compares flat sequences only (nested tuples are refused since pytest 9.2)."""
    return [v for row in rows for v in row]

