"""The zygote's watcher (podrun.host.zygote): when the run's controller is dead on this machine it kills the zygote
and then removes the run's zygote directory and stale control socket, even when the zygote dies at once (real
processes: a small stand-in zygote that imports nothing heavy, so its death is as quick as a process's can be)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from podrun.rundir.layout import CONTROL_PID, CONTROL_SOCKET
from tests.launch.helpers import wait_until

pytestmark = pytest.mark.timeout(120)

STAND_IN = """
import os, sys, time
from podrun.host import zygote
path = sys.argv[1]
lock = os.open(path[:-5] + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
zygote._start_watcher(path, lock)
print("up", flush=True)
time.sleep(60)
"""


DEAD_CONTROLLER = """
import os, sys
from podrun.launch.control import claim
from podrun.wire import unixsock
claim(sys.argv[1])
unixsock.bind(os.path.join(sys.argv[1], "control.sock"))
"""


def _dead_run(run_dir) -> str:
    """A run directory whose controller was killed: a process recorded itself in control.pid and listened on
    control.sock as a controller does, then ended without cleaning up; zygote/ holds the host's socket path."""
    run_dir.mkdir()
    subprocess.run([sys.executable, "-c", DEAD_CONTROLLER, str(run_dir)], check=True, timeout=60)
    assert (run_dir / CONTROL_PID).exists() and (run_dir / CONTROL_SOCKET).exists()
    (run_dir / "zygote").mkdir(mode=0o700)
    return str(run_dir / "zygote" / "h.sock")


@pytest.mark.parametrize("attempt", range(12))
def test_the_watcher_cleans_up_after_killing_a_zygote_that_dies_at_once(tmp_path, attempt):
    """The watcher gets SIGKILL when its zygote dies (so it never outlives it); it must still finish the clean-up
    it starts by killing the zygote. Repeated: the race is lost only now and then."""
    run_dir = tmp_path / "run"
    path = _dead_run(run_dir)
    zyg = subprocess.Popen([sys.executable, "-c", STAND_IN, path], stdout=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: zyg.poll() is not None, 10), "the watcher never killed its zygote"
        assert zyg.returncode == -9, zyg.returncode
        assert wait_until(lambda: not (run_dir / "zygote").exists() and not (run_dir / CONTROL_SOCKET).exists(), 5), \
            sorted(os.listdir(run_dir))
        assert not (run_dir / CONTROL_PID).exists()
    finally:
        if zyg.poll() is None:
            zyg.kill()
