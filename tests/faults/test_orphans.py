"""Nothing outlives a run: kill -9 of podrun, setsid daemons and orphans of the workers, locally and over ssh."""
from __future__ import annotations

import os
import signal
import sys

import pytest

from tests.launch.helpers import end, local_pids, marker, podrun, podrun_popen, start_copies, wait_output, wait_until
from tests.ports import free_port

pytestmark = pytest.mark.timeout(120)


def grandchild(m: str) -> str:
    """A shell line starting a process that is not the worker itself (its cmdline carries the marker m)."""
    return f"{sys.executable} -c 'import time; time.sleep(300)' {m}"


def daemon(m: str, flag: str) -> str:
    """A shell line starting a process that says it started (it creates ``flag``), then sleeps; its cmdline
    carries the marker m."""
    return f"{sys.executable} -c 'import pathlib, sys, time; pathlib.Path(sys.argv[1]).touch(); time.sleep(300)' {flag} {m}"


def started(flags: str) -> str:
    """A shell line that waits until every file in ``flags`` (a shell word list) exists."""
    return f"for f in {flags}; do while [ ! -e $f ]; do sleep 0.05; done; done"


def sleepers(m: str) -> list[int]:
    """The pids of grandchild(m) processes (the shells that start them carry m too, quoted)."""
    return local_pids(f"time.sleep(300) {m}")


def test_kill_9_of_podrun_leaves_no_worker_descendant(tmp_path):
    """The issue's case: `sh -c 'sleep; true'` workers (the sleep is a grandchild), podrun killed with -9."""
    m = marker()
    p = podrun_popen("launch", "--hosts", "localhost", "--devices-per-host", "2", "--grace", "1",
                     "--master-port", str(free_port(2)), "--runs-dir", str(tmp_path / "runs"), "--",
                     "sh", "-c", f"echo up; {grandchild(m)}; true")
    try:
        wait_output(p, "up", 30)
        wait_output(p, "up", 30)
        assert wait_until(lambda: len(sleepers(m)) == 2, 10), local_pids(m)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
        assert wait_until(lambda: local_pids(m) == [], 10), local_pids(m)
    finally:
        end(p)


def test_daemons_of_a_successful_run_are_ended(tmp_path):
    """A worker starts a setsid daemon and a double-forked one, waits until both run, then exits 0: neither
    outlives the run."""
    m = marker()
    a, b = f"{tmp_path}/setsid-$RANK", f"{tmp_path}/forked-$RANK"
    cp = podrun("launch", "--devices-per-host", "2", "--master-port", str(free_port(2)),
                "--runs-dir", str(tmp_path / "runs"), "--", "sh", "-c",
                f"setsid {daemon(m, a)} >/dev/null 2>&1 & ( {daemon(m, b)} >/dev/null 2>&1 & ); "
                f"{started(f'{a} {b}')}; echo ok")
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.count("ok") == 2
    assert len(list(tmp_path.glob("setsid-*")) + list(tmp_path.glob("forked-*"))) == 4   # all four daemons ran
    assert wait_until(lambda: local_pids(m) == [], 5), local_pids(m)


def test_sigterm_of_the_local_agent_ends_the_daemons(tmp_path):
    """The agent, signalled directly (as on a controller's death), ends the daemons it had adopted."""
    m = marker()
    p = podrun_popen("launch", "--devices-per-host", "1", "--grace", "1", "--master-port", str(free_port(2)),
                     "--runs-dir", str(tmp_path / "runs"), "--", "sh", "-c",
                     f"setsid {grandchild(m)} >/dev/null 2>&1 & echo up; sleep 300")
    try:
        wait_output(p, "up", 30)
        assert wait_until(lambda: len(sleepers(m)) == 1, 10), local_pids(m)
        agents = local_pids("podrun.host.agent")
        agents = [a for a in agents if str(tmp_path) in open(f"/proc/{a}/cmdline").read()]
        assert len(agents) == 1, agents
        import os

        os.kill(agents[0], signal.SIGTERM)
        p.wait(timeout=15)
        assert wait_until(lambda: local_pids(m) == [], 5), local_pids(m)
    finally:
        end(p)


@pytest.mark.cluster
@pytest.mark.parametrize("joined", [False, True], ids=["started", "joined"])
def test_kill_9_of_podrun_over_ssh_leaves_nothing_on_any_host(ssh_hosts, tmp_path, joined):
    """kill -9 of the controller: each remote agent sees its channel close and ends its workers, their
    grandchildren and their setsid daemons, on every host. ``joined``: one podrun per node, a copy started in each
    host's namespaces (as pdsh would), copy 1's agent joined to copy 0 over TCP: its connection's end is its
    controller's loss."""
    m = marker()
    names = ssh_hosts.hosts[:2]
    args = ("--devices-per-host", "2", "--grace", "1", "--runs-dir", str(tmp_path / "runs"), "--master-port",
            str(free_port(2)), "--", "sh", "-c",
            f"setsid {grandchild(m)} >/dev/null 2>&1 & echo up; {grandchild(m)}; true")
    if joined:
        p, others = start_copies("launch", *args, hosts=ssh_hosts)
    else:
        p, others = podrun_popen("launch", "--hosts", ",".join(names), "--transport", "ssh", "--ssh-config",
                                 ssh_hosts.ssh_config_path, "--python", ssh_hosts.python, *args), []
    left = lambda: {h: ssh_hosts.processes(h, m) for h in names if ssh_hosts.processes(h, m)}  # noqa: E731
    try:
        for _ in range(4):
            wait_output(p, "up", 60)
        assert wait_until(lambda: all(len(ssh_hosts.processes(h, rf"time\.sleep\(300\) {m}")) == 4 for h in names),
                          10), left()
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
        assert wait_until(lambda: not left(), 15), left()
    finally:
        for x in (p, *others):
            end(x)


@pytest.mark.cluster
def test_kill_9_of_the_launcher_of_joined_agents_ends_them_and_is_the_root_cause(ssh_hosts, tmp_path):
    """--transport mpirun: mpirun starts one agent per host, which joins the controller over TCP. mpirun killed -9
    (as by the job's end or a user): Open MPI's daemons end the agents, which end their workers and grandchildren on
    both hosts; the run ends with mpirun's exit code, the root cause naming mpirun's end (not the workers' SIGTERM
    exits that follow, nor no cause at all)."""
    m = marker()
    names = ssh_hosts.hosts[:2]
    p = podrun_popen("launch", "--hosts", ",".join(names), "--devices-per-host", "2", "--transport", "mpirun",
                     "--ssh-config", ssh_hosts.ssh_config_path, "--grace", "1", "--runs-dir", str(tmp_path / "runs"),
                     "--master-port", str(free_port(2)), "--", "sh", "-c", f"echo up; {grandchild(m)}; true",
                     cwd=str(tmp_path))
    left = lambda: {h: ssh_hosts.processes(h, m) for h in names if ssh_hosts.processes(h, m)}  # noqa: E731
    try:
        for _ in range(4):
            wait_output(p, "up", 60)
        children = open(f"/proc/{p.pid}/task/{p.pid}/children").read().split()
        (mpirun,) = [int(c) for c in children if open(f"/proc/{c}/comm").read().strip() in ("mpirun", "prterun")]
        os.kill(mpirun, signal.SIGKILL)
        _, err = p.communicate(timeout=60)
        assert wait_until(lambda: not left(), 15), left()
    finally:
        end(p)
    assert p.returncode == 137, err
    cause = next((line for line in err.splitlines() if "root cause: instance " in line), err)
    assert "mpirun, the launcher of the agents, exited by signal SIGKILL (exit code 137) while the run went on" \
        in cause, err


@pytest.mark.cluster
def test_setsid_daemon_over_ssh_is_ended_after_a_successful_run(ssh_hosts, tmp_path):
    m = marker()
    names = ssh_hosts.hosts[:2]
    cp = podrun("launch", "--hosts", ",".join(names), "--devices-per-host", "1", "--transport", "ssh",
                "--ssh-config", ssh_hosts.ssh_config_path, "--python", ssh_hosts.python,
                "--runs-dir", str(tmp_path / "runs"), "--master-port", str(free_port(2)), "--",
                "sh", "-c", f"setsid {daemon(m, f'{tmp_path}/setsid-$RANK')} >/dev/null 2>&1 & "
                f"{started(f'{tmp_path}/setsid-$RANK')}; echo ok")
    assert cp.returncode == 0, cp.stderr
    assert len(list(tmp_path.glob("setsid-*"))) == 2           # the daemon ran on both hosts
    left = lambda: {h: ssh_hosts.processes(h, m) for h in names if ssh_hosts.processes(h, m)}  # noqa: E731
    assert wait_until(lambda: not left(), 5), left()


def _instance_log(runs) -> str:
    logs = list(runs.glob("*/instance-0.log"))
    assert len(logs) == 1, logs
    return logs[0].read_text()


def test_a_plain_run_logs_no_leftover_nor_store_note(tmp_path):
    """podrun's own store host is no leftover of the workers, and ending it is no failure to host the store:
    a plain 2-worker run (short, so the store host may still be importing torch when it ends) says neither."""
    for i in range(3):
        runs = tmp_path / f"runs{i}"
        cp = podrun("launch", "--devices-per-host", "2", "--master-port", str(free_port(2)),
                    "--runs-dir", str(runs), "--", "sh", "-c", "echo ok")
        assert cp.returncode == 0, cp.stderr
        log = _instance_log(runs)
        assert "ok" in log, log
        assert "leftover" not in log and "leftover" not in cp.stderr, log
        assert "cannot host the store" not in log and "cannot host the store" not in cp.stderr, log


def test_a_real_leftover_is_named_in_the_note(tmp_path):
    """A worker that leaves a setsid daemon behind: the note names that process (pid and command line)."""
    m = marker()
    flag = f"{tmp_path}/daemon-up"
    cp = podrun("launch", "--devices-per-host", "2", "--master-port", str(free_port(2)),
                "--runs-dir", str(tmp_path / "runs"), "--", "sh", "-c",
                f"if [ $RANK = 0 ]; then setsid {daemon(m, flag)} >/dev/null 2>&1 & {started(flag)}; fi; echo ok")
    assert cp.returncode == 0, cp.stderr
    log = _instance_log(tmp_path / "runs")
    notes = [l for l in log.splitlines() if "leftover" in l]
    assert len(notes) == 1 and "ended 1 leftover process(es) the workers left behind: pid " in notes[0], log
    assert m in notes[0] and "time.sleep(300)" in notes[0], notes
    assert wait_until(lambda: local_pids(m) == [], 5), local_pids(m)
