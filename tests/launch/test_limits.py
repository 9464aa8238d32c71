"""The controller's process limits against the run's size: too few open files for the hosts or workers is one
paragraph naming RLIMIT_NOFILE and `ulimit -n` (exit 2, nothing started), and a soft limit below the hard one is
raised so the run goes on. Real podrun under real limits (setrlimit before exec), real ssh hosts."""
from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from tests.launch.helpers import PODRUN, local_pids, marker, wait_until

pytestmark = pytest.mark.timeout(240)


def limited(soft: int, hard: int, args: list[str], timeout: float = 180) -> subprocess.CompletedProcess:
    """podrun ARGS with RLIMIT_NOFILE (soft, hard), as `ulimit -n` in its shell would leave it."""
    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return subprocess.run([*PODRUN, *args], capture_output=True, text=True, timeout=timeout, preexec_fn=limit)


def test_too_few_open_files_for_256_local_workers_is_refused_before_anything_starts(tmp_path):
    """ulimit -n 200 (soft and hard) and 256 workers here: refused at once, naming the limit and `ulimit -n`;
    no run directory, no worker started (today's agent got EMFILE part way, with some workers running)."""
    m = marker()
    cp = limited(200, 200, ["launch", "--devices-per-host", "256", "--runs-dir", str(tmp_path / "runs"), "--",
                            sys.executable, "-c", f"import time; time.sleep(30)  # {m}"])
    assert cp.returncode == 2, cp.stderr[-2000:]
    err = cp.stderr
    assert "RLIMIT_NOFILE is 200 (hard limit 200)" in err and "ulimit -n 1048" in err, err
    assert "256 worker(s) here" in err and "Traceback" not in err, err
    assert len([l for l in err.splitlines() if l.startswith("podrun: error:")]) == 1, err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    assert local_pids(m) == []


@pytest.mark.cluster
def test_too_few_open_files_for_the_hosts_over_ssh_is_one_paragraph_naming_ulimit(ssh_hosts, tmp_path):
    """4 ssh hosts under ulimit -n 20: one error naming RLIMIT_NOFILE and `ulimit -n`, exit 2, no host touched
    (today: a preflight failure per host blaming the OpenSSH client install)."""
    from tests.launch.test_ssh import leftovers, ssh_args

    m = marker()
    cp = limited(20, 20, [*ssh_args(ssh_hosts, tmp_path), "--", ssh_hosts.python, "-c",
                          f"print('ran')  # {m}"])
    assert cp.returncode == 2, cp.stderr[-2000:]
    assert "RLIMIT_NOFILE is 20 (hard limit 20)" in cp.stderr and "`ulimit -n " in cp.stderr, cp.stderr
    assert "4 host(s) x" in cp.stderr and "OpenSSH client installed" not in cp.stderr, cp.stderr
    assert "Traceback" not in cp.stderr and "ran" not in cp.stdout
    assert wait_until(lambda: not leftovers(ssh_hosts, m), 5)


@pytest.mark.cluster
def test_a_soft_limit_below_the_hard_one_is_raised_and_the_run_goes_on(ssh_hosts, tmp_path):
    """ulimit -Sn 20 (hard 4096) on 4 ssh hosts: podrun raises its soft limit, says so, and the run ends 0."""
    from tests.launch.test_ssh import ssh_args

    cp = limited(20, 4096, [*ssh_args(ssh_hosts, tmp_path), "--", ssh_hosts.python, "-c", "print('ran')"])
    assert cp.returncode == 0, cp.stderr[-2000:]
    assert "raised RLIMIT_NOFILE from 20 to 4096" in cp.stderr, cp.stderr
    assert cp.stdout.count("ran") == 4, cp.stdout
