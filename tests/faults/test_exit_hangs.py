"""Workers at their exit: warm restarts of the DDP tutorial's ending never hang (a gloo group freed with the GIL
held, podrun.host.zygote_child), and a worker that hangs after its program returned is ended and named within
seconds (podrun.host.agent's exit watch)."""
from __future__ import annotations

import re
import sys
import time
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


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "forked"])
def test_a_worker_hung_in_an_atexit_handler_is_ended_and_named_within_seconds(tmp_path, warm):
    """Rank 1 prints its last line, then its atexit handler blocks on a lock: its agent ends it EXIT_HANG_S (10 s)
    after its exit began, with its stack in the instance log, and the root cause names it, long before the hang
    window. ``forked``: in a restart whose workers the zygote forks (their exit is the zygote's finish)."""
    from podrun.wire.protocol import EXIT_HANG_S

    runs = tmp_path / "runs"
    more = ["--max-restarts", "1"] if warm else []
    args = ["--fail-first", str(runs / "*" / "zygote" / "*.sock")] if warm else []
    t0 = time.monotonic()
    r = podrun("launch", "--nproc-per-node", "2", "--runs-dir", str(runs), *more, "--", sys.executable,
               str(SCRIPTS / "atexit_hang.py"), *args, timeout=150)
    took = time.monotonic() - t0
    assert r.returncode == 137, (r.returncode, r.stderr[-3000:])
    assert "rank 1: last line" in r.stdout
    assert re.search(r"root cause: instance 0 on \S+, local rank 1: hung at exit after its last line", r.stderr), \
        r.stderr[-3000:]
    log = (run_dir(runs) / "instance-0.log").read_text()
    assert "local rank 1 hung at exit" in log and "in wait_for_the_lock" in log, log[-3000:]
    assert ("local rank 1 forked by the zygote" in log) is warm, log[-3000:]
    if not warm:
        assert took < EXIT_HANG_S + 30, took
