"""`podrun report` on a real run directory, and every recipe's train.py runs end to end (tiny synthetic sizes)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from podrun.cli.main import main as podrun_main
from tests.train.train_procs import outside_env

ROOT = Path(__file__).resolve().parents[2]



@pytest.mark.timeout(120)
def test_every_recipe_train_py_runs_and_report_draws_it(tmp_path, capsys):
    procs = {}
    for recipe in ("efficientnet_b4", "resnet50", "vit_b16", "resnet18_cifar10"):
        args = ["--data", "synthetic", "--image-size", "32", "--global-batch", "2", "--steps", "2",
                "--synthetic-size", "8", "--run-dir", str(tmp_path / recipe), "--quiet"]
        procs[recipe] = subprocess.Popen([sys.executable, str(ROOT / "recipes" / recipe / "train.py"), *args],
                                         env=outside_env(OMP_NUM_THREADS="1"), stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True)
    for recipe, p in procs.items():
        out, _ = p.communicate(timeout=110)
        assert p.returncode == 0, f"{recipe}/train.py exited {p.returncode}:\n{out[-3000:]}"
        summary = json.loads((tmp_path / recipe / "train_summary.json").read_text())
        assert summary["steps"] == 2 and summary["global_batch"] == 2
        start = json.loads((tmp_path / recipe / "metrics.jsonl").read_text().splitlines()[0])
        # the recipe's hyperparameters reached the runner: LR scaled by its rule to global batch 2
        from podrun.specs import load_recipe

        r = load_recipe(str(ROOT / "recipes" / recipe))
        expect = r.lr.base * 2 / r.lr.reference_batch if r.lr.rule == "linear" else None
        if expect is not None:
            assert start["lr"] == pytest.approx(expect), recipe

    png = tmp_path / "curves.png"
    assert podrun_main(["report", str(tmp_path / "resnet50"), "-o", str(png)]) == 0
    text = capsys.readouterr().out
    assert "2/2 steps (finished)" in text and "global batch 2" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert podrun_main(["report", str(tmp_path / "vit_b16"), "--json", "--no-plot"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 2 and summary["finished"] and "final_val_accuracy" in summary


def test_report_errors(tmp_path, capsys):
    assert podrun_main(["report", str(tmp_path / "nope")]) == 2
    assert "no such run directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert podrun_main(["report", str(tmp_path / "empty")]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err


def test_bad_data_path_is_one_paragraph_exit_2(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "recipes" / "resnet18_cifar10" / "train.py"),
                          "--data", str(tmp_path / "missing"), "--run-dir", str(tmp_path / "r")],
                         env=outside_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "dataset path does not exist" in out.stderr and "Traceback" not in out.stderr
