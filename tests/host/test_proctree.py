"""The agent's view of its children (podrun.host.proctree): the kernel's per-thread children lists give the same
children as a scan of every process on the host, with real processes started from two threads."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

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



REUSED_PID = """
import os, signal, subprocess, sys
from podrun.proctl import signal_led_group
HOLD = "import os, signal, sys, time; signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1]); print(os.getpid(), flush=True); time.sleep(60)"

def pending(pid):
    with open(f"/proc/{pid}/status") as f:
        return [int(x.split()[1], 16) for x in f if x.startswith("ShdPnd:")][0] & (1 << (signal.SIGUSR1 - 1)) != 0

# a leader that ended, reaped, whose group lives on through the child it left (SIGUSR1 blocked: the signal stays
# pending, to be read back)
leader = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {HOLD!r}])"],
                          start_new_session=True, stdout=subprocess.PIPE, text=True)
member = int(leader.stdout.readline())
leader.wait()
signal_led_group(leader, signal.SIGUSR1)
# a leader that ended, reaped, its group empty; the next process is given its pid (ns_last_pid: this namespace's)
gone = subprocess.Popen(["true"], start_new_session=True)
gone.wait()
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(str(gone.pid - 1))
later = subprocess.Popen([sys.executable, "-c", HOLD], start_new_session=True, stdout=subprocess.PIPE, text=True)
assert int(later.stdout.readline()) == later.pid == gone.pid, (later.pid, gone.pid)
signal_led_group(gone, signal.SIGUSR1)
print(pending(member), pending(later.pid), flush=True)
"""


def test_a_reaped_leaders_group_is_signalled_through_its_members_never_a_later_process_given_its_pid():
    """The controller's last-resort SIGKILL of an agent's, ssh client's or launcher's group, and an agent's signal to
    its workers' groups (proctl.signal_led_group), after the leader was reaped: in a pid namespace of its own (so that the kernel gives a chosen pid next,
    through ns_last_pid), a group kept alive by a member is signalled, and a later process given a reaped, empty
    group's pid is not. The signal is blocked in both and read back as pending: no wait on the clock."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", REUSED_PID],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.split() == ["True", "False"], out.stdout + out.stderr
