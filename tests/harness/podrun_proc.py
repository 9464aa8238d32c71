"""Runs, ends and checks a podrun process for the tests: `python -m podrun ARGS` run to its end or started and
ended, the ssh launch's command line and the processes a run left on its hosts."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

PODRUN = [sys.executable, "-m", "podrun"]


def run_podrun(*args, cwd=None, env: dict | None = None, timeout: float = 90, check_exit: int | None = None,
               merge: bool = False, stdin=None) -> subprocess.CompletedProcess:
    """Run podrun ARGS to its end, its output as text (stderr into stdout when merge); env is the whole
    environment (None: this process's). check_exit: fail the test, showing the output, on another exit code."""
    cp = subprocess.run([*PODRUN, *map(str, args)], cwd=cwd, env=env, timeout=timeout, stdin=stdin, text=True,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merge else subprocess.PIPE)
    if check_exit is not None:
        assert cp.returncode == check_exit, f"exit {cp.returncode}, not {check_exit}:\n{cp.stdout}{cp.stderr or ''}"
    return cp


def with_env(**extra: str) -> dict:
    """This process's environment with extra's names set: for run_podrun's env."""
    return {**os.environ, **extra}


def start_podrun(*args, cwd=None, env: dict | None = None, merge: bool = False) -> subprocess.Popen:
    """Start podrun ARGS, its stdout and stderr (or both merged into stdout) piped as text."""
    return subprocess.Popen([*PODRUN, *map(str, args)], cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merge else subprocess.PIPE)


def end(proc: subprocess.Popen) -> None:
    """End a podrun (or any process) a test started, if it is still running: the one teardown of the tests' runs."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)


@contextmanager
def started(*args, **kw):
    """start_podrun(ARGS) for a with block; the process is ended when the block leaves, however it leaves."""
    proc = start_podrun(*args, **kw)
    try:
        yield proc
    finally:
        end(proc)


def ssh_launch_args(hosts, runs: Path, port: int, *extra: str, config: str | None = None, names=None,
                    client: str = "auto", devices: int = 1) -> list[str]:
    """`launch` over the ssh transport to the harness's hosts (names: a subset), its runs under runs."""
    return ["launch", "--hosts", ",".join(names or hosts.hosts), "--devices-per-host", str(devices),
            "--transport", "ssh", "--ssh-config", config or hosts.ssh_config_path, "--ssh-client", client,
            "--python", hosts.python, "--runs-dir", str(runs), "--master-port", str(port), *extra]


def leftovers(hosts, marker: str, names=None) -> dict:
    """{host: its processes whose command line holds marker}, for the hosts (or names) that have any."""
    return {h: hosts.processes(h, marker) for h in (names or hosts.hosts) if hosts.processes(h, marker)}
