"""A base install (a login node or a laptop without podrun's train and metrics extras): a real interpreter with every
package of this one but torch, matplotlib, prometheus_client and tensorboard. What needs them says so in one paragraph
with the pip command, never a traceback: `podrun calibrate` stops before anything starts, `podrun report` prints its
summary without curves, `podrun launch --metrics-port --tensorboard` runs without its endpoint and files."""
from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

from podrun.rundir.metrics import MetricsWriter

ROOT = Path(__file__).resolve().parents[2]
LEFT_OUT = ("torch", "functorch", "torchgen", "matplotlib", "mpl_toolkits", "prometheus_client", "tensorboard")


@pytest.fixture(scope="module")
def base_python(tmp_path_factory) -> str:
    """A venv (no pip, no system site-packages) that sees this interpreter's packages but LEFT_OUT, and the checkout."""
    root = tmp_path_factory.mktemp("base")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=120)
    shown = root / "packages"
    shown.mkdir()
    for place in [*site.getsitepackages(), site.getusersitepackages()]:
        for entry in sorted(Path(place).iterdir()) if Path(place).is_dir() else ():
            if not entry.name.startswith(LEFT_OUT) and not (shown / entry.name).exists():
                (shown / entry.name).symlink_to(entry)
    (venv_site,) = (root / "venv").glob("lib/python3*/site-packages")
    (venv_site / "base.pth").write_text(f"{ROOT}\n{shown}\n")
    return str(root / "venv" / "bin" / "python")


def _podrun(python: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([python, "-m", "podrun", *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env=env)


def test_calibrate_and_report_name_what_is_missing(base_python, tmp_path):
    assert subprocess.run([base_python, "-c", "import torch"], capture_output=True).returncode != 0, "torch is seen"
    cp = _podrun(base_python, "calibrate", "--device-memory", "1", str(ROOT / "recipes" / "resnet18_cifar10"),
                 cwd=tmp_path)
    assert cp.returncode == 2 and "Traceback" not in cp.stderr, cp.stderr
    assert f"{base_python} cannot import torch" in cp.stderr and "pip install 'podrun[train]'" in cp.stderr, cp.stderr
    assert not list(tmp_path.glob("runs/*/instance-*.log")), "a worker started"

    w = MetricsWriter(tmp_path / "run", console=False)
    w.write({"kind": "run", "event": "start", "step": 0, "world_size": 1, "instances": 1, "local_batch": 8,
             "grad_accum": 1, "global_batch": 8, "total_steps": 2, "device": "cpu"})
    for s in (1, 2):
        w.write({"kind": "step", "step": s, "epoch": 0, "loss": 1.0 / s, "accuracy": 0.5, "lr": 0.1,
                 "images_per_sec": 100.0, "images_per_sec_instance": 100.0, "step_seconds": 0.08})
    w.write({"kind": "run", "event": "end", "step": 2})
    w.close()
    cp = _podrun(base_python, "report", str(tmp_path / "run"), cwd=tmp_path)
    assert cp.returncode == 0 and "Traceback" not in cp.stderr, cp.stdout + cp.stderr
    assert "2/2 steps" in cp.stdout and "curves not drawn: matplotlib is not installed" in cp.stdout, cp.stdout
    assert not (tmp_path / "run" / "report.png").exists()


def test_a_launch_with_live_views_runs_without_the_metrics_extra(base_python, tmp_path):
    """--metrics-port and --tensorboard without prometheus_client and tensorboard: one line each, and the run goes
    on (exit 0, its output, no target file, no TensorBoard directory)."""
    cp = _podrun(base_python, "launch", "--runs-dir", str(tmp_path / "runs"), "--run-id", "r", "--metrics-port", "0",
                 "--tensorboard", "--", base_python, "-c", "print('ran')", cwd=tmp_path)
    assert cp.returncode == 0 and "Traceback" not in cp.stderr, cp.stdout + cp.stderr
    assert "ran" in cp.stdout, cp.stdout
    assert "podrun: --metrics-port needs prometheus_client (pip install 'podrun[metrics]'); the run goes on without " \
           "its metrics endpoint" in cp.stderr, cp.stderr
    assert "podrun: --tensorboard needs tensorboard (pip install 'podrun[metrics]')" in cp.stderr, cp.stderr
    assert not (tmp_path / "runs" / "r" / "prometheus-targets.json").exists()
    assert not (tmp_path / "runs" / "r" / "tensorboard").exists()
