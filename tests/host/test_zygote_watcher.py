"""The zygote's watcher (podrun.host.zygote): when the run's controller is dead on this machine it kills the zygote
and then removes the run's zygote directory and stale control socket, even when the zygote dies at once (real
processes: a small stand-in zygote that imports nothing heavy, so its death is as quick as a process's can be)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from podrun.wire.owner import OWNER_NAME, SOCKET_NAME, boot_id
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


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _dead_run(run_dir) -> str:
    """A run directory whose controller was killed: control.pid names a dead process of this boot, control.sock
    is a socket no one listens on, zygote/ holds the host's socket path."""
    run_dir.mkdir()
    (run_dir / OWNER_NAME).write_text(f"{boot_id()} {_dead_pid()}\n")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(run_dir / SOCKET_NAME))
    s.close()
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
        assert wait_until(lambda: not (run_dir / "zygote").exists() and not (run_dir / SOCKET_NAME).exists(), 5), \
            sorted(os.listdir(run_dir))
        assert not (run_dir / OWNER_NAME).exists()
    finally:
        if zyg.poll() is None:
            zyg.kill()
