"""Tests of the SlurmCluster harness: a real slurmctld and slurmd per network namespace, real jobs."""
from __future__ import annotations

import os
import sys

import pytest

from tests.harness.common import NETNS_DIR, pid_from_file
from tests.harness.slurm import SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(90)]


def test_three_node_batch_job_runs_srun_on_every_node(slurm_cluster):
    sl = slurm_cluster
    assert sl.nodes == ["node1", "node2", "node3"]
    assert sl.env["SLURM_CONF"] == sl.slurm_conf and os.path.exists(sl.slurm_conf)
    job = sl.sbatch(["-N3", "-o", f"{sl.jobs_dir}/%j.out", "--wrap", "srun hostname"])
    info = sl.wait_job(job)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), info
    out = (sl.jobs_dir / f"{job}.out").read_text().split()
    assert sorted(out) == ["node1", "node2", "node3"]


def test_nodes_run_the_session_python_with_podrun_and_reach_each_other(slurm_cluster):
    sl = slurm_cluster
    code = ("import podrun, socket, os; s = socket.create_connection((%r, %d), timeout=2); "
            "print(socket.gethostname(), os.environ['SLURM_PROCID'], socket.gethostbyname('node3'))"
            % (sl.address("node2"), sl.port + 1))
    # srun straight from a node's namespace (srun from the root namespace is not reachable from nodes)
    cp = sl.exec("node1", ["srun", "-N3", "--ntasks-per-node=1", sys.executable, "-c", code], env=sl.env,
                 timeout=60)
    assert cp.returncode == 0, cp.stderr
    lines = sorted(cp.stdout.splitlines())
    assert lines == [f"node{i} {i - 1} {sl.address('node3')}" for i in (1, 2, 3)]
    assert sl.processes("node2", r"^slurmd -N node2")


def test_second_cluster_beside_the_first_runs_jobs_and_tears_down_cleanly(slurm_cluster):
    other = SlurmCluster(nodes=2)
    try:
        assert other.slot != slurm_cluster.slot and other.port != slurm_cluster.port
        job = other.sbatch(["-N2", "-o", f"{other.jobs_dir}/%j.out", "--wrap", "srun hostname"])
        assert other.wait_job(job)["JobState"] == "COMPLETED"
        assert sorted((other.jobs_dir / f"{job}.out").read_text().split()) == ["node1", "node2"]
        other.crash("node2")  # a dead node comes back
        assert other.processes("node2") == []
        other.revive("node2")
        assert other.processes("node2", r"^slurmd -N node2")
        ctld = pid_from_file(other.run_dir / "slurmctld.pid", "slurmctld")
        slurmd = [pid_from_file(other.run_dir / f"slurmd-{n}.pid", "slurmd") for n in other.nodes]
        assert ctld and all(slurmd)
    finally:
        other.close()
    other.close()
    assert not [p for p in NETNS_DIR.glob(f"prs{other.slot}-*")]
    assert not os.path.exists(f"/sys/class/net/psb{other.slot}")
    assert not any(os.path.exists(f"/proc/{p}/ns/net") for p in [ctld, *slurmd])
    assert not other.run_dir.exists()
    # the first cluster is untouched
    job = slurm_cluster.sbatch(["-N1", "--wrap", "true", "-o", "/dev/null"])
    assert slurm_cluster.wait_job(job)["JobState"] == "COMPLETED"
