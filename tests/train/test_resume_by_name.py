"""`podrun resume RUN`: a real launch of the digits recipe interrupted mid-run, resumed by name into its own run
directory from its newest checkpoint with its own recorded arguments; every attempt in summary.json and
`podrun report`; refused while a live process holds the run."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from podrun.rundir.metrics import latest_by_step, read_metrics
from tests.harness.podrun_proc import run_podrun, started
from tests.ports import free_port
from tests.train.train_procs import lock_holder, outside_env, wait_for_step

ROOT = Path(__file__).resolve().parents[2]


def _podrun(*args, cwd):
    return started(*args, cwd=cwd, env=outside_env(), merge=True)


@pytest.mark.timeout(400)
def test_an_interrupted_launch_resumes_by_name(tmp_path):
    run_id = f"byname-{os.getpid()}"
    runs, run_dir = tmp_path / "runs", tmp_path / "runs" / run_id
    with _podrun("launch", "--global-batch", "32", "--master-port", free_port(2), "--runs-dir", "runs", "--run-id",
                 run_id, ROOT / "recipes" / "resnet18_cifar10", "--data", "digits", "--image-size", "8", "--steps",
                 "16", "--checkpoint-every", "4", "--keep-checkpoints", "1", "--quiet", cwd=tmp_path) as launcher:
        wait_for_step(run_dir, 6, [launcher], timeout=200)
        launcher.send_signal(signal.SIGINT)
        out, _ = launcher.communicate(timeout=120)
    assert launcher.returncode == 130, out[-3000:]
    assert not any(r.get("event") == "end" for r in read_metrics(run_dir))

    # while a live process holds the run directory (here: a train.py-like holder of its writer lock), refused
    with lock_holder(run_dir, "someone") as holder:
        with _podrun("resume", run_id, "--runs-dir", runs, cwd="/") as refused:
            out, _ = refused.communicate(timeout=60)
        assert refused.returncode == 2, out
        assert "is held by a training process: run someone on host" in out and f"(pid {holder.pid})" in out, out

    with _podrun("resume", run_id, "--runs-dir", runs, cwd="/") as resumed:   # from elsewhere: in the run's cwd
        out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out[-3000:]
    records = read_metrics(run_dir)
    resume = [r for r in records if r.get("event") == "resume"]
    assert len(resume) == 1 and resume[0]["step"] >= 4 and resume[0]["step"] % 4 == 0, resume
    assert resume[0]["source"] == "checkpoint" and "newest good checkpoint" in resume[0]["why"]
    assert [r["step"] for r in latest_by_step(records, "step")] == list(range(1, 17))
    assert [r for r in records if r.get("event") == "end"][-1]["step"] == 16
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [(a["launch"], a["restart_count"], a["status"]) for a in summary["attempts"]] == \
        [(0, 0, "interrupted"), (1, 0, "ok")], summary["attempts"]
    report = run_podrun("report", run_dir, "--no-plot", env=outside_env(), cwd=tmp_path, timeout=120)
    assert report.returncode == 0, report.stderr
    assert "attempt 0: interrupted, exit code 130" in report.stdout, report.stdout
    assert "resume 1 attempt 0: ok, exit code 0" in report.stdout, report.stdout
    assert f"resumed at step {resume[0]['step']} from" in report.stdout, report.stdout


def test_resume_of_a_run_without_a_launch_record_is_exit_2(tmp_path):
    (tmp_path / "runs" / "plain").mkdir(parents=True)
    r = run_podrun("resume", "plain", "--runs-dir", tmp_path / "runs", env=outside_env(), timeout=60, cwd=tmp_path)
    assert r.returncode == 2 and "no launch.json" in r.stderr and "Traceback" not in r.stderr, r.stderr
