"""Identical seeds give equal weights on every worker without a broadcast; a worker that differs stops the run."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.ports import free_port
from tests.train.train_procs import WORKER, worker_env


@pytest.mark.timeout(90)
def test_different_seeds_fail_loudly(tmp_path):
    port = free_port()
    procs = []
    for rank in range(2):
        opts = dict(data="synthetic", image_size=8, num_classes=3, steps=2, global_batch=4, seed=rank,
                    run_dir=str(tmp_path / "r"), console=False, synthetic_size=16)
        procs.append(subprocess.Popen([sys.executable, str(WORKER), json.dumps(opts)], env=worker_env(rank, 2, port),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=80)[0] for p in procs]
    assert [p.returncode for p in procs] == [1, 1], outs
    assert all("workers start with different weights" in o and "--seed" in o for o in outs), outs
    assert all("Traceback" not in o for o in outs)


def test_runtime_and_report_do_not_import_torch():
    code = ("import sys, podrun.runtime, podrun.train, podrun.rundir.metrics, podrun.rundir.report, "
            "podrun.cli.report_cmd; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
