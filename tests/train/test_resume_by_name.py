"""`podrun resume RUN`: a real launch of the digits recipe interrupted mid-run, resumed by name into its own run
directory from its newest checkpoint with its own recorded arguments; every attempt in summary.json and
`podrun report`; refused while a live process holds the run."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from podrun.rundir.metrics import latest_by_step, read_metrics
from tests.ports import free_port
from tests.train.train_procs import outside_env, wait_for_step

ROOT = Path(__file__).resolve().parents[2]


def _podrun(*args, cwd, **kw):
    return subprocess.Popen([sys.executable, "-m", "podrun", *args], cwd=cwd, env=outside_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kw)


@pytest.mark.timeout(400)
def test_an_interrupted_launch_resumes_by_name(tmp_path):
    run_id = f"byname-{os.getpid()}"
    runs, run_dir = tmp_path / "runs", tmp_path / "runs" / run_id
    launcher = _podrun("launch", "--global-batch", "32", "--master-port", str(free_port(2)), "--runs-dir", "runs",
                       "--run-id", run_id, str(ROOT / "recipes" / "resnet18_cifar10"), "--data", "digits",
                       "--image-size", "8", "--steps", "16", "--checkpoint-every", "4", "--keep-checkpoints", "1",
                       "--quiet", cwd=tmp_path)
    try:
        wait_for_step(run_dir, 6, [launcher], timeout=200)
        launcher.send_signal(signal.SIGINT)
        out, _ = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 130, out[-3000:]
    assert not any(r.get("event") == "end" for r in read_metrics(run_dir))

    # while a live process holds the run directory (here: a train.py-like holder of its writer lock), refused
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from podrun.rundir.lock import DirLock
        DirLock({str(run_dir)!r}, "someone", "run directory").acquire()
        print("held", flush=True)
        time.sleep(600)
    """)], env=outside_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        refused = _podrun("resume", run_id, "--runs-dir", str(runs), cwd="/")
        out, _ = refused.communicate(timeout=60)
        assert refused.returncode == 2, out
        assert "is held by a training process: run someone on host" in out and f"(pid {holder.pid})" in out, out
    finally:
        holder.kill()
        holder.wait()

    resumed = _podrun("resume", run_id, "--runs-dir", str(runs), cwd="/")   # from elsewhere: runs in the run's cwd
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
    report = subprocess.run([sys.executable, "-m", "podrun", "report", str(run_dir), "--no-plot"], env=outside_env(), cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    assert "attempt 0: interrupted, exit code 130" in report.stdout, report.stdout
    assert "resume 1 attempt 0: ok, exit code 0" in report.stdout, report.stdout
    assert f"resumed at step {resume[0]['step']} from" in report.stdout, report.stdout


def test_resume_of_a_run_without_a_launch_record_is_exit_2(tmp_path):
    (tmp_path / "runs" / "plain").mkdir(parents=True)
    r = subprocess.run([sys.executable, "-m", "podrun", "resume", "plain", "--runs-dir", str(tmp_path / "runs")],
                       env=outside_env(), capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2 and "no launch.json" in r.stderr and "Traceback" not in r.stderr, r.stderr
