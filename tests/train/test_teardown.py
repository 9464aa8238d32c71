"""The runner frees its DDP wrapper before it destroys the process group (torch 2.13's gloo aborts a worker at
exit, "terminate called without an active exception", when DDP's work outlives the group)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.ports import free_port

pytestmark = [pytest.mark.torch]
ROOT = Path(__file__).resolve().parents[2]


def test_no_ddp_wrapper_is_alive_when_the_runner_destroys_the_process_group(tmp_path):
    """Two real gloo ranks with the garbage collector off: the wrapper sits in a reference cycle after the
    loop returns, so without the runner's own collection it is still alive at destroy (1 per rank)."""
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "train" / "ddp_at_destroy.py"), str(r), "2", port,
                               str(tmp_path / "run")], cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
        assert "ddp alive at destroy: 0" in out, (out, err[-2000:])
