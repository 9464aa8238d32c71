"""Proof: kill -9 a 2-worker gloo run mid-training, restart it, and the loss curve continues as if uninterrupted.
Also: kill -9 during a checkpoint save never corrupts the last good checkpoint."""
from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from podrun.train import checkpoint as ckpt
from podrun.rundir.metrics import latest_by_step, read_metrics
from tests.harness.podrun_proc import started
from tests.ports import free_port
from tests.rundir.account_check import assert_adds_up, process_start
from tests.train.train_procs import (assert_same_final_weights, kill_a_save_in_flight, kill_mid_run, outside_env,
                                    start_workers, train_opts, wait_all, wait_for_step)

STEPS = 40


def _opts(run_dir):
    return train_opts(run_dir, image_size=16, steps=STEPS, optimizer="sgd", momentum=0.9, schedule="cosine",
                      warmup_epochs=0.2, seed=3, eval_every=1, checkpoint_every=5)


@pytest.mark.timeout(240)
def test_kill9_mid_training_then_resume_continues_the_curve(tmp_path):
    """The restart (the same command, in new processes) resumes from the last checkpoint and its curve, final
    evaluation and weights are those of an uninterrupted run, which the restarted workers run next, each run
    seeded by itself on a port of its own (one interpreter start per worker for both)."""
    ref_dir, run_dir = tmp_path / "uninterrupted", tmp_path / "killed"
    seen = kill_mid_run(2, _opts(run_dir), run_dir, 12)
    saved = [int(p.name[5:14]) for p in ckpt.list_checkpoints(run_dir / "checkpoints")]
    assert saved and max(saved) <= seen < STEPS, (saved, seen)

    # the restart (same command), then the reference
    wait_all(start_workers(2, [_opts(run_dir), {**_opts(ref_dir), "master_port": free_port()}]), timeout=200)

    records = read_metrics(run_dir)
    resume = [r for r in records if r.get("event") == "resume"]
    assert len(resume) == 1 and resume[0]["step"] == max(saved), resume
    got = [(r["step"], r["loss"], r["lr"]) for r in latest_by_step(records, "step")]
    want = [(r["step"], r["loss"], r["lr"]) for r in latest_by_step(read_metrics(ref_dir), "step")]
    assert [s for s, _, _ in got] == list(range(1, STEPS + 1))
    assert [v for row in got for v in row] == pytest.approx([v for row in want for v in row], rel=1e-6, abs=1e-7)
    final = {r["step"]: r["val_accuracy"] for r in records if r.get("kind") == "eval"}
    final_ref = {r["step"]: r["val_accuracy"] for r in read_metrics(ref_dir) if r.get("kind") == "eval"}
    assert final[STEPS] == pytest.approx(final_ref[STEPS])
    a, b = assert_same_final_weights(run_dir, ref_dir, rtol=1e-6, atol=1e-7)
    assert a["step"] == b["step"] == STEPS


@pytest.mark.timeout(60)
def test_kill9_during_save_leaves_a_good_checkpoint(tmp_path):
    d = tmp_path / "ck"
    for attempt in range(3):
        kill_a_save_in_flight(d, 30)
        found = ckpt.load_latest(d)
        assert found is not None
        path, state = found
        assert state["step"] == int(path.name[5:14])
        assert torch.equal(state["w"], torch.full((4_000_000,), float(state["step"])))
    # leftovers are temporary files only, never a torn ckpt-*.pt
    for f in ckpt.list_checkpoints(d):
        torch.load(f, weights_only=False)


def _workers_with(seed: str) -> list[int]:
    """pids of train.py workers (argv[1] is train.py; not the agent, whose command line also names it)."""
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                argv = open(f"/proc/{d}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if len(argv) > 1 and argv[1].endswith(b"train.py") and seed.encode() in argv:
                found.append(int(d))
    return sorted(found)


@pytest.mark.timeout(240)
def test_podrun_launch_max_restarts_resumes_from_the_newest_snapshot(tmp_path):
    """podrun launch --max-restarts 1: kill -9 one worker mid-run; the launcher restarts the run and
    train.py resumes from the newest snapshot (newer than the newest checkpoint: the agent's teardown after the
    failure keeps them for the restart) under the same run directory and finishes. Under --keep-checkpoints 1
    the one checkpoint left at the end is the final one."""
    from pathlib import Path

    seed = str(40000 + os.getpid() % 10000)   # marks this test's workers for pgrep
    run_id = f"mr-{os.getpid()}"                # its snapshots' directory in /dev/shm is this test's alone
    train_args = ["--data", "digits", "--image-size", "8", "--steps", "40", "--checkpoint-every", "5",
                  "--keep-checkpoints", "1", "--seed", seed, "--quiet"]
    root = Path(__file__).resolve().parents[2]
    run_dir = tmp_path / "runs" / run_id
    t0 = time.time()
    with started("launch", "--max-restarts", "1", "--global-batch", "32", "--master-port", free_port(2),
                 "--runs-dir", tmp_path / "runs", "--run-id", run_id, root / "recipes" / "resnet18_cifar10",
                 *train_args, cwd=tmp_path, env=outside_env(), merge=True) as launcher:
        began = process_start(launcher.pid)
        wait_for_step(run_dir, 12, [launcher], timeout=120)
        pids = _workers_with(seed)
        assert len(pids) == 2, pids
        os.kill(int(pids[-1]), signal.SIGKILL)
        out, _ = launcher.communicate(timeout=150)
        t1 = time.time()
    assert launcher.returncode == 0, out[-3000:]
    # the run's account adds up to its span; the restart and the steps redone after the crash are failure
    acc = assert_adds_up(run_dir, (t0, t1), began)
    assert acc["seconds"]["failure"] > 0 and len(acc["attempts"]) == 2 and acc["attempts"][1]["goodput"] > 0
    records = read_metrics(run_dir)
    resume = [r for r in records if r.get("event") == "resume"]
    # the snapshots of the last updates outlive the agent's teardown: the restart resumes from the newest one
    # (that of step 12, or of 11 when 12's was still being written at the kill), past the newest checkpoint
    # (10: a multiple of 5), and its record says so and why
    assert len(resume) == 1 and resume[0]["step"] >= 11, out[-2000:]
    assert resume[0]["source"] == "snapshot" and "newer than the newest good checkpoint" in resume[0]["why"], resume
    assert not Path(f"/dev/shm/podrun-{run_id}").exists()          # read by the restart, dropped at the end
    assert [r["step"] for r in latest_by_step(records, "step")] == list(range(1, 41))
    assert [r for r in records if r.get("event") == "end"][-1]["step"] == 40
    assert [p.name for p in ckpt.list_checkpoints(run_dir / "checkpoints")] == ["ckpt-000000040.pt"]
    # the end block names the one checkpoint kept and the run's directory once, in its report line
    end = out.strip().splitlines()[-2:]
    assert end[0].endswith("in checkpoints/: ckpt-000000040.pt") and f"report: podrun report {run_dir} " in end[1], \
        out[-1000:]
