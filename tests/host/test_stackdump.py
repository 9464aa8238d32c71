"""The agent's stack collection signals only the processes that registered for it: a registration left by a
process that ended names a pid another process may have taken since, and that process has no handler (the
dump signal's default action ends it: exit 166)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from podrun.host import stackdump
from podrun.wire.proctl import proc_start


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "60"])


def _still_running(p: subprocess.Popen) -> bool:
    time.sleep(0)                        # the signal, had one been sent, is delivered before collect returns
    try:
        p.wait(timeout=0.5)
    except subprocess.TimeoutExpired:
        return True
    return False


@pytest.mark.parametrize("left", ["another start time", "no start time"])
def test_a_registration_left_behind_under_a_pid_another_process_took_is_not_signalled(tmp_path, left):
    """What a registered process that ended left behind, its pid now taken by a process without the handler:
    a .main file naming another start time, or (an older file) none."""
    p = _sleeper()
    try:
        w = tmp_path / "w0"
        w.mkdir()
        start = f"{int(proc_start(p.pid)) - 1}\n" if left == "another start time" else ""
        (w / f"{p.pid}.main").write_text(f"{0x1234:#018x}\n{start}")
        got = stackdump.collect(str(tmp_path), [(0, p.pid)], wait=0.3)
        assert got[0]["procs"] == [] and got[0]["problem"] == stackdump.NOT_REGISTERED
        assert _still_running(p), f"the unregistered process was signalled (exit {p.returncode})"
    finally:
        p.kill()
        p.wait()


def test_a_registered_python_process_gives_its_stacks_and_goes_on(tmp_path):
    w = tmp_path / "w0"
    w.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([stackdump.SITE_DIR, os.environ.get("PYTHONPATH", "")]),
           "PODRUN_STACK_DIR": str(w), "PODRUN_STACK_SIGNAL": str(stackdump.STACK_SIGNAL)}
    p = subprocess.Popen([sys.executable, "-c", "import time\ndef napping():\n    time.sleep(60)\nnapping()"],
                         env=env)
    try:
        deadline = time.monotonic() + 30
        while not (w / f"{p.pid}.main").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        got = stackdump.collect(str(tmp_path), [(0, p.pid)])
        assert got[0]["problem"] is None, got
        (proc,) = got[0]["procs"]
        assert proc["pid"] == p.pid and "napping" in proc["text"]
        assert proc["main"].startswith("0x")
        assert _still_running(p)
    finally:
        p.kill()
        p.wait()
