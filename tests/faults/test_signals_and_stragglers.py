"""A run ends with a summary whatever ends it: SIGHUP (terminal closed) like SIGTERM, and a straggler that
hangs after another rank finished (--straggler-timeout), named by rank."""
from __future__ import annotations

import signal

import pytest

from tests.launch.helpers import end, local_pids, marker, podrun, podrun_popen, summary, wait_output, wait_until
from tests.ports import free_port

pytestmark = pytest.mark.timeout(120)


def test_sighup_ends_the_run_like_sigterm_with_a_message_and_summary(tmp_path):
    m = marker()
    p = podrun_popen("launch", "--devices-per-host", "2", "--grace", "1", "--master-port", str(free_port(2)),
                     "--runs-dir", str(tmp_path / "runs"), "--", "sh", "-c", f"echo up $RANK; sleep 60 # {m}")
    try:
        wait_output(p, "up", 30)
        assert wait_until(lambda: len(local_pids(f"sleep 60 # {m}")) >= 2, 10)
        p.send_signal(signal.SIGHUP)
        p.wait(timeout=20)
        err = p.stderr.read()
        assert p.returncode == 128 + signal.SIGHUP, err
        assert "ending the run on every host: received SIGHUP" in err and "interrupted (exit 129)" in err, err
        s = summary(tmp_path / "runs")
        assert s["status"] == "interrupted" and s["exit_code"] == 129
        assert wait_until(lambda: local_pids(m) == [], 5), local_pids(m)
    finally:
        end(p)


def test_straggler_timeout_ends_the_run_naming_the_hung_ranks(tmp_path):
    """Rank 0 exits 0, ranks 1 and 2 hang: 2 s later they are ended and the run fails with 124 naming them."""
    m = marker()
    cp = podrun("launch", "--devices-per-host", "3", "--straggler-timeout", "2", "--grace", "1",
                "--master-port", str(free_port(2)), "--runs-dir", str(tmp_path / "runs"), "--",
                "sh", "-c", f"[ $RANK = 0 ] && exit 0; sleep 60 # {m}")
    assert cp.returncode == 124, cp.stderr
    assert "ranks 1, 2 still running 2 s after rank 0 exited 0 (--straggler-timeout)" in cp.stderr, cp.stderr
    s = summary(tmp_path / "runs")
    # ended by podrun (a signal), not by the end of their 60 s sleep
    assert all(s["instances"][0]["workers"][r] > 128 for r in ("1", "2")), s["instances"]
    assert s["status"] == "failed" and s["root_cause"]["local_rank"] == 1 and s["root_cause"]["exit_code"] == 124
    assert local_pids(m) == []


def test_without_straggler_timeout_a_slow_rank_is_waited_for(tmp_path):
    """The default is no bound: a rank finishing 3 s after the others is a success."""
    cp = podrun("launch", "--devices-per-host", "2", "--master-port", str(free_port(2)),
                "--runs-dir", str(tmp_path / "runs"), "--", "sh", "-c", "[ $RANK = 0 ] && exit 0; sleep 3; echo late")
    assert cp.returncode == 0 and "late" in cp.stdout, cp.stderr


def test_straggler_timeout_must_be_positive(tmp_path):
    for bad in ("0", "-1", "nan"):
        cp = podrun("launch", "--straggler-timeout", bad, "--runs-dir", str(tmp_path / "runs"), "--", "true")
        assert cp.returncode == 2 and "--straggler-timeout" in cp.stderr and "Traceback" not in cp.stderr, cp.stderr
