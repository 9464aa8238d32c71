"""`podrun report` on what a run directory really holds: a plain command's run (no metrics.jsonl), and a
metrics.jsonl with non-UTF-8 bytes or broken lines (skipped and counted, never a traceback)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from podrun.rundir.metrics import MetricsWriter
from tests.harness.podrun_proc import run_podrun
from tests.ports import free_port
from tests.train.train_procs import outside_env

# one worker runs the module under --dist loadgroup: its launch (``plain_run``) once, not once per worker drawing a test
pytestmark = pytest.mark.xdist_group("report_runs")


def _podrun(*args, cwd=None) -> subprocess.CompletedProcess:
    return run_podrun(*args, env=outside_env(), cwd=cwd, timeout=120)


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory) -> Path:
    """A real `podrun launch` of a plain command on this machine: 2 workers that exit 3, one restart."""
    tmp = tmp_path_factory.mktemp("plain")
    out = _podrun("launch", "--hosts", "localhost", "--devices-per-host", "2", "--max-restarts", "1",
                  "--master-port", str(free_port(2)), "--runs-dir", str(tmp / "runs"), "--run-id", "plain",
                  "--", "sh", "-c", "echo hello from $RANK; exit 3", cwd=tmp)
    assert out.returncode == 3, out.stdout + out.stderr
    run = tmp / "runs" / "plain"
    assert (run / "summary.json").is_file() and not (run / "metrics.jsonl").exists()
    return run


def test_report_of_a_plain_command_summarises_the_run(plain_run):
    out = _podrun("report", str(plain_run))
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert "run plain of a command (no training metrics): failed, exit code 3, 1 restart(s)" in text
    assert "command: sh -c 'echo hello from $RANK; exit 3' (transport local)" in text
    assert "plan: 1 host(s), 1 instance(s), 2 worker(s)" in text
    # no training steps: none of the training-only figures (a batch, goodput, start-up to the first step)
    assert "global batch" not in text and "goodput" not in text and "start-up" not in text, text
    assert "where the time went: " in text and "the command running" in text, text
    assert "attempt 0: failed, exit code 3 (exited with code 3)" in text
    assert "attempt 1: failed, exit code 3 (exited with code 3)" in text
    assert "root cause: instance 0 on localhost, local rank" in text and "hello from" in text
    assert "duration " in text and "instance 0 on localhost: failed, exit code 3" in text

    js = _podrun("report", str(plain_run), "--json")
    assert js.returncode == 0, js.stderr
    s = json.loads(js.stdout)
    assert s["kind"] == "command" and s["exit_code"] == 3 and s["restarts"] == 1
    assert [(a["restart_count"], a["exit_code"]) for a in s["attempts"]] == [(0, 3), (1, 3)]
    assert s["root_cause"]["exit_code"] == 3 and s["plan"]["replicas"] == 2
    assert isinstance(s["duration_s"], float) and s["duration_s"] > 0
    assert not (plain_run / "report.png").exists()


def _training_metrics(run_dir: Path, steps: int = 5) -> None:
    """metrics.jsonl as the runner writes it (its own writer), for a short run."""
    w = MetricsWriter(run_dir, console=False)
    w.write({"kind": "run", "event": "start", "step": 0, "world_size": 2, "instances": 1, "local_batch": 4,
             "grad_accum": 1, "global_batch": 8, "total_steps": steps, "device": "cpu"})
    for s in range(1, steps + 1):
        w.write({"kind": "step", "step": s, "epoch": 0, "loss": 2.0 / s, "accuracy": 0.1 * s, "lr": 0.1,
                 "images_per_sec": 100.0, "images_per_sec_instance": 100.0, "step_seconds": 0.08})
    w.write({"kind": "eval", "step": steps, "epoch": 0, "val_loss": 0.5, "val_accuracy": 0.8, "val_samples": 10})
    w.write({"kind": "run", "event": "end", "step": steps})
    w.close()


def test_podrun_runs_lists_the_runs_newest_first(tmp_path, plain_run):
    """`podrun runs` (and --json): every run under --runs-dir, newest first, with its id, status, steps, wall time,
    goodput and directory; a training run's steps from its metrics.jsonl."""
    import shutil

    runs = tmp_path / "runs"
    shutil.copytree(plain_run, runs / "plain")            # its files keep their times: the older run
    _training_metrics(runs / "trained")
    (runs / "not-a-run").mkdir()
    js = _podrun("runs", "--runs-dir", str(runs), "--json")
    assert js.returncode == 0, js.stderr
    rows = json.loads(js.stdout)
    assert [r["id"] for r in rows] == ["trained", "plain"], rows
    trained, plain = rows
    assert (trained["status"], trained["steps"], trained["dir"]) == ("no summary", 5, str(runs / "trained")), trained
    assert (plain["status"], plain["exit_code"], plain["steps"], plain["goodput"]) == ("failed", 3, None, None), plain
    assert isinstance(plain["wall_s"], float) and plain["wall_s"] > 0, plain
    text = _podrun("runs", "--runs-dir", str(runs)).stdout.splitlines()
    assert text[0].split() == ["id", "status", "steps", "wall", "goodput", "dir"], text
    assert text[1].split()[:2] == ["trained", "no"] and text[1].endswith(str(runs / "trained")), text
    assert text[2].startswith("plain ") and "failed (3)" in text[2] and text[2].endswith(str(runs / "plain")), text


BROKEN = [b"\xff\xfe\x00 not utf-8 \xc3\x28\n",
          b'{"kind": "step", "step": "three", "epoch": 0, "loss": 1.0, "accuracy": 0.5, "images_per_sec": 1}\n',
          b'{"kind": "eval", "step": 2, "val_loss": null, "val_accuracy": 0.5}\n',
          b"[1, 2, 3]\n",
          b'{"kind": "step", "step": 9, "epo']          # torn last line


def test_report_skips_unreadable_metrics_lines_and_says_how_many(tmp_path):
    run = tmp_path / "run"
    _training_metrics(run)
    with open(run / "metrics.jsonl", "ab") as f:
        f.write(b"".join(BROKEN[:-1]))
        f.write(b'{"kind": "step", "step": 6, "epoch": 0, "loss": 0.3, "accuracy": 0.7, "lr": 0.1, '
                b'"images_per_sec": 100.0, "step_seconds": 0.08}\n')
        f.write(BROKEN[-1])
    out = _podrun("report", str(run), "--no-plot")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    assert "6/5 steps" in out.stdout
    assert "note: skipped 5 unreadable line(s) of" in out.stdout
    js = json.loads(_podrun("report", str(run), "--no-plot", "--json").stdout)
    assert js["kind"] == "training" and js["skipped_lines"] == 5 and js["steps"] == 6
    assert js["final_val_accuracy"] == 0.8


def test_report_of_metrics_with_nothing_readable_is_exit_2(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_bytes(b"".join(BROKEN))
    out = _podrun("report", str(run))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    assert "metrics.jsonl: none of its lines could be read (5 skipped" in out.stderr


def test_report_of_a_command_run_with_broken_metrics_reports_the_run(tmp_path, plain_run):
    """A training that never wrote a readable step, launched by podrun: the launcher's record is still reported."""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("summary.json", "plan.json"):
        (run / name).write_bytes((plain_run / name).read_bytes())
    (run / "metrics.jsonl").write_bytes(BROKEN[0])
    out = _podrun("report", str(run))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "exit code 3" in out.stdout and "note: skipped 1 unreadable line(s)" in out.stdout
    assert "records no training step" in out.stdout


def test_report_names_an_unreadable_summary(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_bytes(b"\xff{not json")
    out = _podrun("report", str(run))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    assert "summary.json: unreadable (UnicodeDecodeError)" in out.stderr


def test_report_marks_an_elastic_replan_on_the_curves(tmp_path):
    """A training run that lost a host: the re-plan summary.json records is in the report and on the curves."""
    run = tmp_path / "run"
    _training_metrics(run, steps=8)
    replan = {"restart": 1, "hosts_lost": ["h3"], "spares_used": [], "at_step": 4, "lost_at": 1.0,
              "old": {"hosts": ["h1", "h2", "h3", "h4"], "replicas": 4, "local_batch": 1, "grad_accum": 3,
                      "global_batch": 12},
              "new": {"hosts": ["h1", "h2", "h4"], "replicas": 3, "local_batch": 1, "grad_accum": 4,
                      "global_batch": 12},
              "skipped": [], "restarted_after_s": 1.0, "training_after_s": 12.5}
    (run / "summary.json").write_text(json.dumps({"run_id": "r", "status": "ok", "exit_code": 0,
                                                  "elastic": {"min_hosts": 3, "replans": [replan]}}))
    out = _podrun("report", str(run), "-o", str(tmp_path / "curves.png"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert ("re-plan after step 4: lost h3, 4 -> 3 hosts (local batch 1 x GA 3 -> 1 x GA 4), global batch 12; "
            "training again 12.5s after the loss") in out.stdout
    (run / "summary.json").write_text(json.dumps({"run_id": "r", "status": "ok", "exit_code": 0}))
    plain = _podrun("report", str(run), "-o", str(tmp_path / "plain.png"))
    assert plain.returncode == 0 and "re-plan" not in plain.stdout
    # the marked picture differs from the unmarked one (the red line and its label are drawn)
    assert (tmp_path / "curves.png").read_bytes() != (tmp_path / "plain.png").read_bytes()
    js = json.loads(_podrun("report", str(run), "--no-plot", "--json").stdout)
    assert js["replans"] == []


def test_report_says_where_a_replan_resumed_from(tmp_path):
    """summary.json's re-plan entry names the snapshot (or checkpoint) the next attempt resumed from: the report
    line and its --json say it."""
    run = tmp_path / "run"
    _training_metrics(run, steps=8)
    replan = {"restart": 1, "hosts_lost": ["h1"], "spares_used": [], "at_step": 5, "lost_at": 1.0,
              "old": {"hosts": ["h1", "h2"], "replicas": 2, "local_batch": 2, "grad_accum": 1, "global_batch": 4},
              "new": {"hosts": ["h2", "h3"], "replicas": 2, "local_batch": 2, "grad_accum": 1, "global_batch": 4},
              "skipped": [], "restarted_after_s": 1.0, "training_after_s": 3.0,
              "resumed_from": {"step": 5, "source": "snapshot", "from_rank": 1}}
    (run / "summary.json").write_text(json.dumps({"run_id": "r", "status": "ok", "exit_code": 0,
                                                  "elastic": {"min_hosts": 2, "replans": [replan]}}))
    out = _podrun("report", str(run), "--no-plot")
    assert out.returncode == 0, out.stdout + out.stderr
    assert ("global batch 4; resumed from the snapshot of step 5 (rank 1); training again 3.0s after the loss"
            in out.stdout), out.stdout
    js = json.loads(_podrun("report", str(run), "--no-plot", "--json").stdout)
    assert js["replans"][0]["resumed_from"] == {"step": 5, "source": "snapshot", "from_rank": 1}
