"""Workers at their exit: warm restarts of the DDP tutorial's ending never hang (a gloo group freed with the GIL
held, podrun.host.zygote_child), and a worker that hangs after its program returned is ended and named within
seconds (podrun.host.agent's exit watch)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.launch.helpers import podrun, run_dir

SCRIPTS = Path(__file__).parent / "scripts"
RESTARTS = 20


@pytest.mark.torch
@pytest.mark.timeout(420)
def test_twenty_warm_restarts_of_the_tutorial_ending_never_hang(tmp_path):
    """20 restarts in one launch, 2 ranks each forked by the zygote once it listens: every rank frees its DDP model
    after destroy_process_group(); before the fix a forked rank deadlocked there within about 10 attempts."""
    r = podrun("launch", "--nproc-per-node", "2", "--max-restarts", str(RESTARTS), "--runs-dir", str(tmp_path / "runs"),
               "--", sys.executable, str(SCRIPTS / "ddp_exit.py"), "--dir", str(tmp_path), "--attempts", str(RESTARTS),
               timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.glob("hang-*")) == []
    assert r.stdout.count("ended") == RESTARTS + 1, r.stdout
    warm = (run_dir(tmp_path / "runs") / "instance-0.log").read_text().count("local rank 1 forked by the zygote")
    assert warm >= RESTARTS // 2, f"only {warm} attempts forked by the zygote"
