"""podrun and its agent keep memory bounded whatever a worker writes: many lines, or one huge line."""
from __future__ import annotations

import pytest

from tests.faults.memory import podrun_output
from tests.launch.helpers import end
from tests.ports import free_port

pytestmark = pytest.mark.timeout(300)
BOUND_MB = 100


@pytest.mark.parametrize("mode", ["lines", "oneline"])
def test_peak_memory_stays_under_100_mb_for_100_mb_of_output(tmp_path, mode):
    r = podrun_output(tmp_path, 100, mode, free_port(2))
    assert r["podrun_mb"] < BOUND_MB and r["agent_mb"] < BOUND_MB, r
    log = r["log"].read_text()
    if mode == "oneline":      # cut at 64 KiB, and said so, with the count of what was dropped
        first, second = log.splitlines()[:2]
        assert first.startswith("y" * 65536 + " [podrun: line longer than 65536 bytes cut here")
        assert second == f"[podrun: dropped {100 * 2**20 - 65536} more bytes of the line cut above]"
    else:
        assert log.count("x" * 1023 + "\n") == 100 * 1024     # every line, whole


def _blocked_writing(pid: int) -> bool:
    """The process sleeps in the kernel's write (its reader reads nothing): a pipe's (podrun's stdout), or
    the agent's output socket of a worker (a full send buffer or a full receive queue)."""
    try:
        wchan = open(f"/proc/{pid}/wchan").read()
        return any(w in wchan for w in ("pipe_write", "sock_alloc_send_pskb", "unix_wait_for_peer"))
    except OSError:
        return False


def test_a_paused_console_holds_the_workers_back_but_loses_no_host(tmp_path):
    """Nobody reads podrun's stdout for longer than --keepalive (a terminal paused with Ctrl-S, a stuck
    pager) while a worker writes: the run waits, then finishes with every line; no host is called lost
    and no agent thinks its controller gone. The pause is counted from the moment podrun and the worker
    both block writing (the console full), and the worker is still held back when it ends."""
    import subprocess
    import sys
    import time

    from tests.launch.helpers import PODRUN, local_pids, marker, wait_until

    keepalive, m = 2.0, marker()
    p = subprocess.Popen([*PODRUN, "launch", "--devices-per-host", "1", "--keepalive", str(keepalive),
                          "--master-port", str(free_port(2)), "--runs-dir", str(tmp_path / "runs"), "--",
                          sys.executable, "-c",
                          "import sys\nfor i in range(20000): print('line', i, 'x' * 500)\nprint('last line')", m],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def worker():
        for pid in local_pids(m):
            if open(f"/proc/{pid}/cmdline", "rb").read().startswith(sys.executable.encode() + b"\0-c\0"):
                return pid
        return None

    try:
        assert wait_until(lambda: (w := worker()) and _blocked_writing(w) and _blocked_writing(p.pid), 120), \
            (p.poll(), worker())
        w = worker()
        time.sleep(4 * keepalive)        # the pause itself: 4 x --keepalive with the console full
        assert w in local_pids(m) and _blocked_writing(w), "the worker was not held back for the whole pause"
        out, err = p.communicate(timeout=120)
    finally:
        end(p)
    assert p.returncode == 0, err.decode()
    assert b"lost" not in err and out.count(b"x" * 500 + b"\n") == 20000 and out.endswith(b"last line\n")
