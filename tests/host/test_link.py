"""The agent's link to its controller at the agent's end (podrun.host.link.ControllerLink.link_close), in a real
process over a real pipe that the test, as a slow controller, leaves full.

An agent whose heartbeat (or output) thread was blocked on that pipe when the agent ended left with the line
unwritten, or, when the interpreter's exit found the thread holding stdout's lock, aborted ("Fatal Python error:
_enter_buffered_busy ..."; lines such as these were once seen in an instance log in CI, under load). The agent now
waits for that line before it exits, so it reaches the controller whole; when its controller reads no more within
the bound, it leaves with os._exit instead of the interpreter's flush. Both tests fail on an agent that just exits.
"""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

NOTE_BYTES = len(b"@podrun 0 0 note " + b"x" * 100 + b"\n")      # one of the notes that fill the pipe

AGENT = f"NOTE_BYTES = {NOTE_BYTES}\n" + """
import os, signal, subprocess, sys, threading
from podrun.host.link import ControllerLink

class Agent(ControllerLink):
    index, local_ranks, agent_rank, run_dir = 0, [0], 0, None
    def request_stop(self, *a):
        pass

def fill(a):                  # most of the pipe the controller does not read yet (64 KiB)
    for i in range(60000 // NOTE_BYTES):
        a.emit(None, "note", "x" * 100)
"""

CHILD = AGENT + """
a = Agent()
a.link_init(None, 0.005, False, 600.0)
fill(a)
threading.Thread(target=a._heartbeat, daemon=True).start()   # its heartbeats fill the rest, then block
while not any("pipe_write" in open(f"/proc/self/task/{t}/wchan").read() for t in os.listdir("/proc/self/task")):
    pass                                            # (pipe_write, anon_pipe_write): the agent's end comes now
print("main done", file=sys.stderr, flush=True)
if not a.link_close(float(sys.argv[1])):
    sys.stderr.flush()
    os._exit(3)
"""


def _start(timeout: float) -> subprocess.Popen:
    """The agent stand-in, once a heartbeat of it is stuck in its write to the full pipe and its end has begun."""
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(timeout)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stderr.readline() == b"main done\n"
    return p


@pytest.mark.timeout(120)
def test_the_agent_waits_for_its_last_line_to_a_slow_controller_and_exits_cleanly():
    p = _start(timeout=60)
    deadline = time.monotonic() + 1.0                # it must not exit (or abort) while its line waits
    while time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.02)
    assert p.poll() is None, p.stderr.read().decode()
    out, err = p.communicate(timeout=30)             # the controller reads at last
    assert p.returncode == 0, err.decode()
    assert b"Fatal Python error" not in err, err.decode()
    lines = out.decode().splitlines()
    assert sum(1 for x in lines if " note " in x) == 60000 // NOTE_BYTES
    assert lines[-1].startswith("@podrun 0 0 hb "), lines[-3:]       # the blocked heartbeat, whole, last


@pytest.mark.timeout(120)
def test_an_agent_whose_controller_reads_no_more_leaves_within_its_bound_without_aborting():
    p = _start(timeout=0.5)
    rc = p.wait(timeout=30)                          # the pipe is never read: it leaves on its own
    err = p.stderr.read()
    assert rc == 3, err.decode()
    assert b"Fatal Python error" not in err, err.decode()
    p.stdout.close()


SIGNALLED = AGENT + """
a = Agent()
a.link_init(None, 600.0, False, 600.0)
signal.signal(signal.SIGCHLD, lambda *_: os.write(2, b"signalled\\n"))   # as the agent's: it wakes its loop
worker = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)   # its SIGCHLD comes to
fill(a)                                                                   # the thread that started it

def the_worker_exits():                             # once the long line waits in its write, the pipe full
    while "pipe_write" not in open(f"/proc/self/task/{os.getpid()}/wchan").read():
        pass
    worker.stdin.close()
threading.Thread(target=the_worker_exits, daemon=True).start()
a.emit(None, "note", "y" * 20000)
a.emit(None, "note", "after")
"""


@pytest.mark.timeout(120)
def test_a_line_whose_write_a_signal_interrupts_reaches_the_controller_whole():
    """Under PYTHONUNBUFFERED (CI's environment, and what a user may export) the agent's stdout is a raw file,
    whose write() may take only part of a line: a signal handled while the write waits on the full pipe (the
    agent's SIGCHLD when a worker exits) ends the write with what the pipe took so far. The rest of that line
    must follow it, not be dropped (the controller then read half a line glued to the next)."""
    import os

    p = subprocess.Popen([sys.executable, "-c", SIGNALLED], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert p.stderr.readline() == b"signalled\n"     # the controller reads once the signal cut the write short
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert lines[-2:] == ["@podrun 0 0 note " + "y" * 20000, "@podrun 0 0 note after"], \
        [(len(x), x[:30], x[-30:]) for x in lines[-2:]]



def test_a_heartbeat_waiting_unread_in_the_inbox_is_no_silence():
    """An agent whose stdin reader has not run for longer than the bound (a loaded host) while the controller's
    heartbeat waits in the pipe: the silence check finds it waiting and does not stop the agent; with the pipe empty
    it stops it (controller lost). A real pipe; the reader thread is never started."""
    import os

    from podrun.host.link import ControllerLink

    class Agent(ControllerLink):
        index, local_ranks, agent_rank, run_dir, stop = 0, [0], 0, None, None

        def request_stop(self, kind, message, *a, **kw):
            self.stopped = message

    r, w = os.pipe()
    try:
        a = Agent()
        a.link_init(None, 0.25, True, 1.0)
        a.inbox, a.got_stdin, a.stopped = r, True, None
        a.last_stdin = time.monotonic() - 5.0          # the reader last ran 5 s ago
        os.write(w, b".")                              # the controller's heartbeat came meanwhile
        a._check_stdin_silence()
        assert a.stopped is None
        os.read(r, 1)                                  # nothing waits: a silence
        a._check_stdin_silence()
        assert a.stopped is not None and "no heartbeat on its connection for 1 s" in a.stopped, a.stopped
    finally:
        os.close(r)
        os.close(w)
