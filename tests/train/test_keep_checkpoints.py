"""--keep-checkpoints N: the newest N checkpoints are kept (default 2), the newest is never removed while the run
goes on, 0 removes them when the run finishes, and the run's last line says where they are and names
`podrun report <run dir>`; `podrun report` with no argument reports the newest run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from podrun.errors import PodrunError
from podrun.train import checkpoint as ckpt
from podrun.train.config import TrainConfig
from podrun.rundir.metrics import StepLog
from tests.harness.podrun_proc import PODRUN, run_podrun
from tests.ports import free_port
from tests.train.train_procs import outside_env

ROOT = Path(__file__).resolve().parents[2]


def _steps(d: Path) -> list[int]:
    return [int(p.name[5:14]) for p in ckpt.list_checkpoints(d)]


def test_save_keeps_the_newest_n_and_never_the_newest_for_0(tmp_path):
    d = tmp_path / "c"
    for step in (1, 2, 3, 4):
        ckpt.save({"step": step, "w": torch.full((8,), float(step))}, d, step, keep=2)
    assert _steps(d) == [3, 4]
    ckpt.save({"step": 5}, d, 5, keep=1)
    assert _steps(d) == [5]
    ckpt.save({"step": 6}, d, 6, keep=0)          # 0 during the run: the newest stays, for a restart
    assert _steps(d) == [6]
    path, state = ckpt.load_latest(d)
    assert path.name == "ckpt-000000006.pt" and state["step"] == 6


def test_finish_keeps_n_and_says_where_and_0_removes_them(tmp_path):
    d = tmp_path / "c"
    for step in (1, 2, 3):
        ckpt.save({"step": step}, d, step, keep=3)
    where = ckpt.finish(d, 2)
    assert where["checkpoints"] == ["ckpt-000000002.pt", "ckpt-000000003.pt"]
    assert where["checkpoint_dir"] == str(d) and where["keep_checkpoints"] == 2
    assert where["checkpoint_bytes"] == sum(p.stat().st_size for p in ckpt.list_checkpoints(d)) > 0
    gone = ckpt.finish(d, 0)
    assert gone["checkpoints"] == [] and gone["checkpoint_bytes"] == 0 and _steps(d) == []


@pytest.mark.parametrize("bad", [-1, True, 1.5])
def test_a_negative_or_non_integer_keep_is_refused_exit_2(tmp_path, bad):
    with pytest.raises(PodrunError) as e:
        ckpt.save({"step": 1}, tmp_path, 1, keep=bad)
    assert e.value.exit_code == 2 and "--keep-checkpoints" in e.value.message
    assert not list(tmp_path.iterdir())           # refused before anything is written


def test_default_is_two():
    assert TrainConfig().keep_checkpoints == 2


def _launch(tmp_path: Path, run_id: str, *train_args: str) -> subprocess.CompletedProcess:
    return run_podrun("launch", "--global-batch", "32", "--master-port", free_port(2), "--runs-dir", tmp_path / "runs",
                      "--run-id", run_id, ROOT / "recipes" / "resnet18_cifar10", "--data", "digits", "--image-size",
                      "8", "--steps", "6", "--checkpoint-every", "2", "--quiet", *train_args, cwd=tmp_path,
                      env=outside_env(), timeout=200)


def _end_block(stderr: str) -> str:
    """The run's end block on the console: its "finished" line and the lines under it."""
    lines = stderr.strip().splitlines()
    return "\n".join(lines[max(i for i, line in enumerate(lines) if "finished: exit 0" in line):])


@pytest.mark.timeout(420)
def test_launch_keep_0_and_the_last_line_then_report_with_no_argument(tmp_path):
    """Two real 2-worker runs of the digits recipe: --keep-checkpoints 0 leaves no checkpoint and its last
    line says so; a second run with --keep-checkpoints 1 keeps one, its last line names it and
    `podrun report <run dir>`, and `podrun report` with no argument reports that newest run."""
    zero = _launch(tmp_path, "zero", "--keep-checkpoints", "0")
    assert zero.returncode == 0, zero.stdout[-2000:] + zero.stderr[-2000:]
    run0 = tmp_path / "runs" / "zero"
    assert not list((run0 / "checkpoints").glob("ckpt-*.pt"))
    last0 = _end_block(zero.stderr)
    assert "finished: exit 0" in last0 and "\n  no checkpoint kept (--keep-checkpoints 0)\n" in last0, last0
    assert f"\n  report: podrun report {run0} (" in last0, last0

    one = _launch(tmp_path, "one", "--keep-checkpoints", "1")
    assert one.returncode == 0, one.stdout[-2000:] + one.stderr[-2000:]
    run1 = tmp_path / "runs" / "one"
    assert _steps(run1 / "checkpoints") == [6]
    last1 = _end_block(one.stderr)
    assert "1 checkpoint(s) (" in last1 and "--keep-checkpoints 1) in checkpoints/: ckpt-000000006.pt" in last1, last1
    assert f"\n  report: podrun report {run1} (" in last1, last1
    end = StepLog.read(run1).end
    assert end["checkpoints"] == ["ckpt-000000006.pt"] and end["keep_checkpoints"] == 1

    newest = subprocess.run([*PODRUN, "report", "--no-plot", "--json"], cwd=tmp_path,
                            env=outside_env(), capture_output=True, text=True, timeout=120)
    assert newest.returncode == 0, newest.stderr
    s = json.loads(newest.stdout)
    assert s["run_dir"] == os.path.join("runs", "one") and s["steps"] == 6 and s["finished"] is True


def test_report_with_no_argument_and_no_runs_is_exit_2(tmp_path):
    out = subprocess.run([*PODRUN, "report"], cwd=tmp_path, env=outside_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "--runs-dir runs: no such directory" in out.stderr, out.stderr
    (tmp_path / "runs" / "empty").mkdir(parents=True)
    out = subprocess.run([*PODRUN, "report", "--runs-dir", "runs"], cwd=tmp_path,
                         env=outside_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "holds no run" in out.stderr, out.stderr


def test_train_py_refuses_a_negative_keep_exit_2(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "recipes" / "resnet18_cifar10" / "train.py"), "--data",
                          "digits", "--image-size", "8", "--steps", "1", "--keep-checkpoints", "-1",
                          "--run-dir", str(tmp_path / "r"), "--quiet"], cwd=tmp_path, env=outside_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "--keep-checkpoints -1: must be a whole number >= 0" in out.stderr, out.stderr
    assert not (tmp_path / "r" / "checkpoints").exists()
