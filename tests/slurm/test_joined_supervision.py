"""Supervision of agents that srun starts and that join the controller, on a real Slurm (the session's cluster):
a node cut off is named as the root cause and the run re-plans on the nodes left, in a new step whose agents join
again (--elastic); the step's srun killed ends every agent's workers, and is the root cause."""
from __future__ import annotations

import os
import shlex
import signal
import sys
from pathlib import Path

import pytest

from tests.harness.podrun_proc import PODRUN
from tests.launch.helpers import local_pids, marker, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.cluster, pytest.mark.torch]
LOOP = str(Path(__file__).parents[1] / "faults" / "scripts" / "allreduce_loop.py")


def _ups(out: Path) -> int:
    return sum(1 for line in out.read_text().splitlines() if "] up " in line) if out.exists() else 0


@pytest.mark.timeout(240)
def test_a_node_cut_off_is_the_root_cause_and_an_elastic_run_goes_on_in_a_new_step(slurm_cluster, tmp_path):
    """node2's link is cut while the three nodes' agents (one srun step, joined over TCP) all-reduce: node2 is named
    lost after the 2 s bound, not the nodes whose agents srun's step ends next; the run re-plans to node1 and node3
    with the same global batch, a new step whose agents join again, and the job ends 0. The allocation survives
    the node's loss (sbatch --no-kill, which docs/elastic.md asks of an elastic job)."""
    sl = slurm_cluster
    out, m = tmp_path / "job.out", marker()
    launch = [*PODRUN, "launch", "--transport", "srun", "--devices-per-host", "1", "--keepalive", "2", "--elastic",
              "2", "--global-batch", "6", "--runs-dir", str(tmp_path / "runs"), "--", sys.executable, LOOP,
              "--seconds", "300", m]
    job = sl.sbatch(["-N3", "--no-kill", f"--output={out}", f"--chdir={tmp_path}", "--wrap", shlex.join(launch)])
    try:
        assert wait_until(lambda: _ups(out) == 3, 120, 0.1), out.read_text() if out.exists() else "no output"
        sl.isolate("node2")
        info = sl.wait_job(job, timeout=150)
    finally:
        sl.run(["scancel", job], check=False)
        sl.revive("node2")
    text = out.read_text()
    assert info["ExitCode"] == "0:0", text
    assert "instance 1 on node2: lost (no heartbeat for 2 s" in text, text
    assert "elastic: dropping node2 (host node2 lost" in text and "re-planned 3 -> 2 hosts" in text, text
    done = [line for line in text.splitlines() if " done " in line and "world 2" in line]
    assert sorted(line.split("]")[0] for line in done) == ["[0 node1", "[1 node3"], text


@pytest.mark.timeout(150)
def test_the_steps_srun_killed_ends_every_agents_workers_and_is_the_root_cause(slurm_cluster, tmp_path):
    """The srun that started the joined agents is killed (-9) while they run: every worker on both nodes ends, and
    the run ends with srun's exit code, its root cause srun's end (not the workers' SIGTERM exits, nor none)."""
    sl = slurm_cluster
    out, m = tmp_path / "job.out", marker()
    launch = [*PODRUN, "launch", "--transport", "srun", "--devices-per-host", "1", "--runs-dir",
              str(tmp_path / "runs"), "--", "sh", "-c", f"echo up $RANK; sleep 300 # {m}"]
    job = sl.sbatch(["-N2", f"--output={out}", f"--chdir={tmp_path}", "--wrap", shlex.join(launch)])
    try:
        assert wait_until(lambda: _ups(out) == 2, 90, 0.1), out.read_text() if out.exists() else "no output"
        (srun,) = [p for p in local_pids(str(tmp_path / "runs")) if _comm(p) == "srun" and _comm(_ppid(p)) != "srun"]
        os.kill(srun, signal.SIGKILL)
        info = sl.wait_job(job, timeout=60)
        gone = wait_until(lambda: local_pids(m) == [], 30, 0.1)
    finally:
        sl.run(["scancel", job], check=False)
    text = out.read_text()
    assert gone, local_pids(m)
    assert info["ExitCode"] == "137:0", text
    cause = next((line for line in text.splitlines() if "root cause: instance " in line), text)
    assert "srun, the launcher of the agents, exited by signal SIGKILL (exit code 137) while the run went on" \
        in cause, text


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0
