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
from podrun.proctl import proc_start


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
    # it says when it is in napping(): a dump asked between its registration (at start-up) and then would
    # show the start-up's frames (seen under load)
    p = subprocess.Popen([sys.executable, "-c", "import time\ndef napping():\n    print('napping', flush=True)\n"
                          "    time.sleep(60)\nnapping()"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "napping\n"      # EOF ('') when it could not start
        assert (w / f"{p.pid}.main").exists()
        got = stackdump.collect(str(tmp_path), [(0, p.pid)])
        assert got[0]["problem"] is None, got
        (proc,) = got[0]["procs"]
        assert proc["pid"] == p.pid and "napping" in proc["text"]
        assert proc["main"].startswith("0x")
        assert _still_running(p)
    finally:
        p.kill()
        p.wait()


# A worker whose exit goes on after Python's finalization (a library's C++ destructors, here a libc atexit function
# that reads its stdin): its main has returned, faulthandler's handler is gone, the process is still there.
EXITING = """
import ctypes, sys
libc = ctypes.CDLL(None)
libc.__cxa_atexit(libc.getchar, None, None)   # run by exit(), after Python's finalization: waits for stdin
print("done", flush=True)
"""


def _in_read_of_stdin(pid: int) -> bool:
    """Blocked in read(0, ...): /proc/PID/syscall names the system call (x86-64's read is 0) and its first argument."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            words = f.read().split()
    except OSError:
        return False
    return len(words) > 1 and words[0] == "0" and int(words[1], 16) == 0


def test_a_worker_that_asked_for_a_dump_while_it_exits_is_not_ended_by_it(tmp_path):
    """The dump signal arriving after the worker's Python finalization (the failure seen in CI: a healthy silent
    script, done, ended with exit 166 = 128 + the dump signal). At its exit the worker takes its registration back
    (the agent then asks it nothing) and ignores the signal; one sent anyway (the agent read the file before it
    went) leaves it to exit 0."""
    assert os.uname().machine == "x86_64", "this test reads x86-64's system call numbers from /proc/PID/syscall"
    w = tmp_path / "w0"
    w.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([stackdump.SITE_DIR, os.environ.get("PYTHONPATH", "")]),
           "PODRUN_STACK_DIR": str(w), "PODRUN_STACK_SIGNAL": str(stackdump.STACK_SIGNAL)}
    p = subprocess.Popen([sys.executable, "-c", EXITING], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline() == "done\n"
        deadline = time.monotonic() + 30
        while not _in_read_of_stdin(p.pid) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _in_read_of_stdin(p.pid), "the worker did not reach its C-level exit"
        assert not (w / f"{p.pid}.main").exists(), "the exiting worker is still registered for dumps"
        assert (w / f"{p.pid}.exit").exists(), "the exiting worker left no exit marker"
        got = stackdump.collect(str(tmp_path), [(0, p.pid)], wait=0.3)[0]
        assert got["exiting"] is True and got["problem"] == stackdump.EXITING and got["procs"] == [], got
        os.kill(p.pid, stackdump.STACK_SIGNAL)          # as an agent that read the file before it went
        p.stdin.close()                                  # getchar returns: the exit goes on
        assert p.wait(timeout=30) == 0, f"the dump signal ended the exiting worker (exit {p.returncode})"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
