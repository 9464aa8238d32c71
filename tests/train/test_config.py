"""The runner's modules: config.json in the run directory, no import circle, the decomposition's checks."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields

import pytest

from podrun.runtime.env import WorkerInfo, read_worker_info
from podrun.train.config import CONFIG_FILE, TrainConfig, TrainError, config_dict, decompose, write_config


def tiny_model():  # a callable model is written as its name
    raise AssertionError("never built here")


def test_config_json_holds_the_config_and_what_it_resolved_to(tmp_path):
    cfg = TrainConfig(model=tiny_model, data="digits", global_batch=24, steps=7, betas=(0.8, 0.9), seed=4)
    p = write_config(tmp_path / "run", cfg, {"world_size": 3, "local_batch": 8, "grad_accum": 1, "global_batch": 24})
    assert p == tmp_path / "run" / CONFIG_FILE
    data = json.loads(p.read_text())
    assert data["resolved"] == {"world_size": 3, "local_batch": 8, "grad_accum": 1, "global_batch": 24}
    assert data["config"]["model"] == "tiny_model"
    assert set(data["config"]) == {f.name for f in fields(TrainConfig)}
    # every field but the callable model comes back as it was given
    back = TrainConfig(**{**data["config"], "model": tiny_model, "betas": tuple(data["config"]["betas"])})
    assert back == cfg
    assert config_dict(TrainConfig(model="resnet18"))["model"] == "resnet18"
    assert not list((tmp_path / "run").glob("*.tmp"))


def _info() -> WorkerInfo:
    """A worker launched without podrun's batch variables (the decomposition comes from the config)."""
    return read_worker_info({})


@pytest.mark.parametrize("given,message", [
    (dict(local_batch=0, global_batch=8), "local batch 0 must be at least 1"),
    (dict(grad_accum=0, global_batch=8), "GA 0 must be at least 1"),
    (dict(global_batch=0), "global batch 0 must be at least 1"),
])
def test_a_zero_in_the_decomposition_is_an_error_not_a_default(given, message):
    with pytest.raises(TrainError, match=message):
        decompose(TrainConfig(**given), _info(), replicas=2)


def test_decompose_resolves_the_same_global_batch_on_4_and_3_replicas():
    cfg = TrainConfig(global_batch=24)
    assert decompose(cfg, _info(), replicas=4) == (6, 1, 24)
    assert decompose(cfg, _info(), replicas=3) == (8, 1, 24)
    assert decompose(TrainConfig(global_batch=24, grad_accum=2), _info(), replicas=3) == (4, 2, 24)


def test_no_import_circle_and_config_without_torch():
    """ipu.py builds on config/setup/save, never on runner (which imports ipu): each imports on its own."""
    for module in ("podrun.train.ipu", "podrun.train.loop", "podrun.train.save", "podrun.train.setup",
                   "podrun.train.runner"):
        out = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"{module}: {out.stderr}"
    code = ("import sys, podrun.train.ipu; print('podrun.train.runner' in sys.modules); "
            "import podrun.train.config")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
    out = subprocess.run([sys.executable, "-c", "import sys, podrun.train.config; print('torch' in sys.modules)"],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
