"""A one-rank NCCL process group through `podrun launch` (the local transport, a real controller, agent and worker):
the env contract as a torchrun user reads it, the device bound by LOCAL_RANK, CUDA_VISIBLE_DEVICES left as given."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.gpu.needs import cuda_or_twin

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "scripts" / "one_rank.py"


def test_one_rank_nccl_group_through_podrun_launch(tmp_path):
    """The worker sees RANK 0, LOCAL_RANK 0, WORLD_SIZE 1 and the CUDA_VISIBLE_DEVICES podrun was started with
    (podrun leaves it to the host, docs/launch.md); podrun's device rule put it on cuda:LOCAL_RANK; the group is
    NCCL and its all-reduce ran on that device (gloo on the CPU twin)."""
    device = cuda_or_twin()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") or "0"
    out = tmp_path / "seen.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible,
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    cp = subprocess.run([sys.executable, "-m", "podrun", "launch", "--nproc-per-node", "1", "--runs-dir",
                         str(tmp_path / "runs"), "--", sys.executable, str(SCRIPT), str(out), device],
                        capture_output=True, text=True, timeout=180, cwd=tmp_path, env=env)
    assert cp.returncode == 0, (cp.stdout[-2000:], cp.stderr[-3000:])
    seen = json.loads(out.read_text())
    assert (seen["RANK"], seen["LOCAL_RANK"], seen["WORLD_SIZE"], seen["LOCAL_WORLD_SIZE"]) == ("0", "0", "1", "1")
    assert seen["CUDA_VISIBLE_DEVICES"] == visible, seen
    assert seen["world"] == 1 and seen["sum"] == [1.0, 2.0, 3.0, 4.0], seen
    if device == "cuda":
        assert seen["backend"] == "nccl" and seen["nccl"], seen
        assert seen["current_device"] == 0 and seen["tensor_device"] == "cuda:0", seen
    else:
        assert seen["backend"] == "gloo" and seen["tensor_device"] == "cpu", seen
