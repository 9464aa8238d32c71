"""The runner's modules: config.json in the run directory, no import circle, the decomposition's checks."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
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


# torch (the costly part) imported once; each module then imported first in a child forked from that process,
# with no podrun module loaded yet: an import circle shows in the child whose module starts it
EACH_ON_ITS_OWN = textwrap.dedent("""
    import importlib, os, sys, traceback
    import torch
    assert not [m for m in sys.modules if m.startswith("podrun")]
    for module in sys.argv[1:]:
        pid = os.fork()
        if pid == 0:
            try:
                importlib.import_module(module)
                if module == "podrun.train.ipu":
                    print(module, "imports runner:", "podrun.train.runner" in sys.modules, flush=True)
            except BaseException:
                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        print(module, "exit", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
""")


def test_no_import_circle_and_config_without_torch():
    """ipu.py builds on config/setup/save, never on runner (which imports ipu): each imports on its own."""
    modules = ("podrun.train.ipu", "podrun.train.loop", "podrun.train.save", "podrun.train.setup",
               "podrun.train.runner", "podrun.train.config")
    out = subprocess.run([sys.executable, "-c", EACH_ON_ITS_OWN, *modules], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines() == ["podrun.train.ipu imports runner: False",
                                       *(f"{m} exit 0" for m in modules)], out.stdout + out.stderr
    out = subprocess.run([sys.executable, "-c", "import sys, podrun.train.config; print('torch' in sys.modules)"],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


TEARDOWN = '''
import gc, json, sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, sys.argv[2])
from tests.train.worker import tiny_gn_net
from podrun.train import TrainConfig, train

destroy, alive = dist.destroy_process_group, []

def spy(*args, **kwargs):  # how many DDP wrappers still exist when the process group goes
    alive.append(sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects()))
    return destroy(*args, **kwargs)

dist.destroy_process_group = spy
torch.set_num_threads(1)
train(TrainConfig(model=tiny_gn_net, **json.loads(sys.argv[1])))
print("ALIVE", alive, flush=True)
'''


def test_the_ddp_wrapper_is_freed_before_the_process_group_is_destroyed(tmp_path):
    """Freed after it, gloo's destructors hung rank 0 at exit (seen on a resumed 3-worker run)."""
    from pathlib import Path

    from tests.train.train_procs import start_workers, wait_all

    script = tmp_path / "teardown.py"
    script.write_text(TEARDOWN)
    opts = dict(data="synthetic", synthetic_size=16, image_size=8, num_classes=10, steps=2, global_batch=4,
                eval_every=0, console=False, run_dir=str(tmp_path / "run"))
    root = str(Path(__file__).resolve().parents[2])
    outs = wait_all(start_workers(2, {}, script=script, argv=[json.dumps(opts), root]), timeout=240)
    assert all("ALIVE [0]" in out for out in outs), outs
