"""Tests of the GridEngineCluster harness: a real sge_qmaster and an sge_execd per network namespace, real jobs."""
from __future__ import annotations

import os

import pytest

from tests.harness.common import NETNS_DIR, cmdline
from tests.harness.uge import PE, QUEUE, GridEngineCluster

pytestmark = [pytest.mark.uge, pytest.mark.timeout(120)]


def test_every_host_resolves_every_other_both_ways_as_grid_engine_does(uge_cluster):
    """Grid Engine's own resolver (its gethostbyname / gethostbyaddr tools) on every node: each
    node's name gives its address and the address gives the name back."""
    ge = uge_cluster
    for node in ge.nodes:
        for other, addr in ge.addresses.items():
            cp = ge.exec(node, ["/usr/lib/gridengine/gethostbyname", "-name", other], env=ge.env)
            assert cp.returncode == 0 and cp.stdout.strip() == other, (node, other, cp.stdout, cp.stderr)
            cp = ge.exec(node, ["/usr/lib/gridengine/gethostbyaddr", addr], env=ge.env)
            assert f"Hostname: {other}" in cp.stdout, (node, addr, cp.stdout, cp.stderr)


def test_pe_job_lists_one_line_per_host_and_runs_with_the_cells_bare_env(uge_cluster):
    """The job's TMP is under the cell's own folder: in /tmp (shared by the machine's cells), another cell's job of
    the same id would remove it at its end while this one runs."""
    ge = uge_cluster
    script = ge.jobs_dir / "pe.sh"
    script.write_text("#!/bin/bash\ncat \"$PE_HOSTFILE\"\necho \"ROOT=$SGE_ROOT TMP=$TMP PATH=$PATH\"\nhostname\n"
                      "test -d \"$TMP\" || exit 5\nexit 4\n")
    job = ge.qsub(["-pe", PE, "3", "-o", str(ge.jobs_dir), "-j", "y", str(script)])
    acct = ge.wait_job(job)
    assert acct["exit_status"] == "4" and acct["granted_pe"] == PE and acct["slots"] == "3", acct
    out = (ge.jobs_dir / f"pe.sh.o{job}").read_text().splitlines()
    assert sorted(line.split()[0] for line in out[:3]) == ge.nodes
    assert all(line.split()[1] == "1" for line in out[:3])          # allocation_rule 1: one slot per host
    assert out[3].startswith(f"ROOT={ge.sge_root} TMP={ge.tmp_dir}/{job}.1.{QUEUE} ") and "/root/.pyenv" not in out[3]
    assert out[4] == acct["hostname"] == out[0].split()[0]            # the job runs on the first host


def test_second_cell_beside_the_first_runs_jobs_and_tears_down_cleanly(uge_cluster):
    other = GridEngineCluster(nodes=2)
    try:
        assert other.slot != uge_cluster.slot and other.sge_root != uge_cluster.sge_root
        job = other.qsub(["-pe", PE, "2", "-o", "/dev/null", "-j", "y", "-b", "y", "/bin/true"])
        assert other.wait_job(job)["exit_status"] == "0"
        daemons = [p for n in other.nodes for p, _ in other.processes(n, r"sge_qmaster|sge_execd")]
        assert len(daemons) == 3, daemons                               # one qmaster, two execds
    finally:
        other.close()
    other.close()
    assert not list(NETNS_DIR.glob(f"prh{other.slot}-*"))
    assert not any(cmdline(p) for p in daemons)
    assert not other.run_dir.exists()
    # the first cell is untouched
    job = uge_cluster.qsub(["-pe", PE, "1", "-o", "/dev/null", "-j", "y", "-b", "y", "/bin/true"])
    assert uge_cluster.wait_job(job)["exit_status"] == "0"
    assert not os.path.exists("/var/lib/gridengine/podrun")            # no cell in the machine's SGE_ROOT
