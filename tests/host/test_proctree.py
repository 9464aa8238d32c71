"""The agent's view of its children (podrun.host.proctree): the kernel's per-thread children lists give the same
children as a scan of every process on the host, with real processes started from two threads."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

from podrun.host import proctree


def test_listed_children_are_the_scanned_children_from_every_thread_zombies_included():
    """Children started by the main thread and by another thread (the kernel lists a child under the thread that
    forked it), one of them ended and not reaped (a zombie): the per-thread lists and the scan of /proc both find
    each of them, the zombie as a zombie (each answer's parent is checked in its stat by _children)."""
    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])]
    box = []
    t = threading.Thread(target=lambda: box.append(subprocess.Popen(["sleep", "60"])))
    t.start()
    t.join()
    sleepers += box
    zombie = subprocess.Popen(["true"])
    try:
        os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)       # ended, left unreaped
        listed = proctree._listed_children(os.getpid())
        assert listed is not None, "this kernel has no /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN)"
        scanned = proctree._scanned_children(os.getpid())
        mine = {p.pid for p in sleepers} | {zombie.pid}
        # this process's other children (a test runner's) may start, end or change state between the reads:
        # the two answers are compared on the children this test made
        assert {pid for pid, _ in listed if pid in mine} == mine == {pid for pid, _ in scanned if pid in mine}
        for answer in (listed, scanned, proctree._children(os.getpid())):
            states = dict(answer)
            assert states[zombie.pid] == "Z" and all(states[p.pid] in ("S", "R", "D") for p in sleepers), answer
    finally:
        for p in sleepers:
            p.kill()
            p.wait()
        zombie.wait()
