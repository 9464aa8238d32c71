"""Supervision at 256 ranks: a hang at one rank found within the window + 2 s and shown in one short block, `podrun
stack` of 256 ranks, the progress line, and a failure that 255 ranks follow. Real agents and workers (light Python
processes, no torch), over ssh to the namespace hosts of tests/harness or on this machine."""
from __future__ import annotations

import json
import os
import sys
import time

import pytest

from tests.launch.helpers import SCRIPTS, end, marker, podrun, podrun_popen, run_dir, summary, wait_output, wait_until

pytestmark = [pytest.mark.timeout(300)]
LIGHT = str(SCRIPTS / "light_ranks.py")
RANKS = 256
WINDOW = 3.0
HANG_EXIT = 125


def report_lines(err: str, first: str) -> list[str]:
    """podrun's own lines on stderr from the one containing ``first`` to the end (the workers' lines left out)."""
    lines = [l for l in err.splitlines() if not l.startswith("[")]
    starts = [i for i, l in enumerate(lines) if first in l]
    assert starts, err[-3000:]
    return lines[starts[0]:]


@pytest.mark.cluster
def test_one_hung_rank_of_256_on_4_hosts_is_found_within_the_window_and_shown_in_one_short_block(ssh_hosts, tmp_path):
    """4 hosts x 64 workers over ssh; rank 200 stalls, the other 255 wait. Found within the window + 2 s; the
    stacks merged in two groups, rank 200's first, the others as ranges; the whole report (the notices, the
    stacks, the root cause) at most 20 lines; every rank's stack written."""
    from tests.launch.test_ssh import leftovers, ssh_args

    m = marker()
    args = ssh_args(ssh_hosts, tmp_path, n=4)
    args[args.index("--devices-per-host") + 1] = str(RANKS // 4)
    cp = podrun(*args, "--hang-timeout", str(WINDOW), "--keepalive", "10", "--", ssh_hosts.python, LIGHT, "hang",
                str(tmp_path), "200", m, timeout=240)    # --keepalive: no false loss of a host under load
    assert cp.returncode == HANG_EXIT, cp.stderr[-3000:]
    report = report_lines(cp.stderr, "no progress from any rank")
    assert len(report) <= 20, "\n".join(report)
    block = "\n".join(report)
    host = ssh_hosts.hosts[200 // (RANKS // 4)]
    odd = block.index("rank 200: stall (light_ranks.py:")
    assert odd < block.index("ranks 0-199, 201-255: wait_for_peer (light_ranks.py:"), block
    assert f"the odd rank out: rank 200 on {host}" in block, block
    s = summary(tmp_path / "runs")
    assert s["hang"]["found_s"] <= WINDOW + 2, s["hang"]
    print(f"hang at rank 200 of {RANKS}: found {s['hang']['found_s']} s after the last progress (window {WINDOW} s), "
          f"report {len(report)} lines")
    assert [g["ranks"] for g in s["hang"]["groups"]] == [[200], [r for r in range(RANKS) if r != 200]]
    assert len(list((run_dir(tmp_path / "runs") / "stacks").glob("rank-*.txt"))) == RANKS
    assert wait_until(lambda: not leftovers(ssh_hosts, m, ssh_hosts.hosts[:4]), 20)


def test_podrun_stack_of_256_ranks_answers_with_every_rank_grouped(tmp_path):
    """256 workers on this machine: `podrun stack` shows every rank's stack (none missing) in one group with
    its ranks as a range, within the controller's wait for stacks, and the run goes on to exit 0."""
    runs = tmp_path / "runs"
    release = tmp_path / "release"
    os.mkfifo(release)
    released = None
    p = podrun_popen("launch", "--devices-per-host", str(RANKS), "--runs-dir", str(runs), "--hang-timeout", "off",
                     "--", sys.executable, LIGHT, "wait", str(tmp_path))
    try:
        wait_output(p, "up rank", 120)
        assert wait_until(lambda: (run_dir(runs) / "instance-0.log").exists() and
                          (run_dir(runs) / "instance-0.log").read_text().count("up rank") == RANKS, 120)
        t0 = time.monotonic()
        cp = podrun("stack", "--runs-dir", str(runs), "--json", timeout=60)
        took = time.monotonic() - t0
        assert cp.returncode == 0, cp.stderr
        reply = json.loads(cp.stdout)
        assert reply["ranks"] == RANKS
        assert [g["ranks"] for g in reply["groups"]] == [list(range(RANKS))], \
            [(g["ranks"][:3], g["summary"], g["workers"][0]["problem"]) for g in reply["groups"]]
        assert reply["lines"][0].startswith(f"ranks 0-{RANKS - 1}: wait_for_peer (light_ranks.py:"), reply["lines"]
        text = podrun("stack", "--runs-dir", str(runs), timeout=60)
        assert text.returncode == 0 and f"ranks 0-{RANKS - 1}: " in text.stdout, text.stdout + text.stderr
        released = os.open(release, os.O_WRONLY | os.O_NONBLOCK)   # every rank is blocked opening it to read
        out, err = p.communicate(timeout=120)
    finally:
        end(p)
        if released is not None:
            os.close(released)
    assert p.returncode == 0, err[-2000:]
    print(f"podrun stack of {RANKS} ranks: {took:.2f} s")


def test_the_progress_line_stays_one_line_per_report_at_256_ranks(tmp_path):
    """256 workers each report 6 steps through podrun.runtime: the plain console shows the run's progress lines
    (the first, the last), not one per rank."""
    cp = podrun("launch", "--devices-per-host", str(RANKS), "--runs-dir", str(tmp_path / "runs"), "--",
                sys.executable, LIGHT, "progress", str(tmp_path), "6", timeout=240)
    assert cp.returncode == 0, cp.stderr[-2000:]
    lines = [l for l in cp.stderr.splitlines() if l.startswith("podrun: progress:")]
    assert 1 <= len(lines) <= 3, lines
    assert lines[-1].startswith("podrun: progress: step 6/6 (100%)"), lines


@pytest.mark.cluster
def test_one_failure_that_255_ranks_follow_names_the_first_and_sums_up_the_rest_in_one_line(ssh_hosts, tmp_path):
    """4 hosts x 64 workers over ssh: rank 39 exits 3 once every rank is up; the other 255 see it and exit 1 (or
    are ended by the teardown). The root cause names rank 39's instance, host, local rank, exit code and its
    own last lines; the followers take one line, by exit code with their ranks as ranges; the block stays short."""
    from tests.launch.test_ssh import leftovers, ssh_args

    m = marker()
    args = ssh_args(ssh_hosts, tmp_path, n=4)
    args[args.index("--devices-per-host") + 1] = str(RANKS // 4)
    cp = podrun(*args, "--keepalive", "10", "--", ssh_hosts.python, LIGHT, "fail", str(tmp_path), "39", m,
                timeout=240)                   # --keepalive: no false loss of a host ending 64 workers under load
    assert cp.returncode == 3, cp.stderr[-3000:]
    host = ssh_hosts.hosts[0]
    block = report_lines(cp.stderr, "root cause:")
    text = "\n".join(block)
    assert len(block) <= 20, text
    assert f"root cause: instance 0 on {host}, local rank 39: exited with code 3" in block[0], text
    assert "rank 39 own failure line 2" in text, text
    (follow,) = [l for l in block if "other ranks on 4 hosts ended" in l]
    assert follow.strip().startswith("then 255 other ranks on 4 hosts ended: "), follow
    assert " (ranks 0-" in follow and "rank 39" not in follow, follow     # exit 1, or ended by the teardown
    rc = summary(tmp_path / "runs")["root_cause"]
    assert (rc["instance"], rc["local_rank"], rc["exit_code"]) == (0, 39, 3), rc
    assert rc["followers"]["count"] == RANKS - 1 and rc["followers"]["hosts"] == 4, rc["followers"]
    assert sorted(r for g in rc["followers"]["by_code"] for r in g["ranks"]) == [r for r in range(RANKS) if r != 39]
    assert wait_until(lambda: not leftovers(ssh_hosts, m, ssh_hosts.hosts[:4]), 20)
