"""podrun at 16 real hosts (the scale benchmark's small size, kept in the suite): 16 OpenSSH hosts and a 16-node
Slurm in network namespaces, 2 ranks per host; every rank runs, teardown leaves nothing on any host, and a host
that never answers among the 16 is named by preflight with nothing started anywhere."""
from __future__ import annotations

import shlex
import time

import pytest

from tests.harness import HarnessError, NetnsHosts
from tests.harness.podrun_proc import leftovers, ssh_launch_args
from tests.launch.helpers import PODRUN, marker, podrun, summary

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]
N, K = 16, 2
_port = iter(range(30400, 30600, 4))


@pytest.fixture(scope="module")
def hosts16():
    try:
        hosts = NetnsHosts(N)
    except HarnessError as e:
        pytest.fail(f"16 OpenSSH hosts could not be brought up: {e}", pytrace=False)
    with hosts:
        yield hosts


def _worker(out, m: str) -> list[str]:
    """Each rank writes out/rank-<RANK> holding its host name, then ends; ``m`` marks its processes."""
    return ["sh", "-c", f'hostname > {shlex.quote(str(out))}/rank-"$RANK" # {m}']


def _ranks(out) -> dict[int, str]:
    return {int(p.name.split("-")[1]): p.read_text().strip() for p in out.glob("rank-*")}


def _ssh_launch(hosts, tmp_path, client: str, *extra) -> list[str]:
    return ssh_launch_args(hosts, tmp_path / "runs", next(_port), *extra, client=client, devices=K)


@pytest.mark.parametrize("client", ["openssh", "paramiko"])
def test_16_hosts_over_ssh_every_rank_runs_and_nothing_is_left(hosts16, tmp_path, client):
    out, m = tmp_path / "out", marker()
    out.mkdir()
    cp = podrun(*_ssh_launch(hosts16, tmp_path, client), "--", *_worker(out, m), timeout=240)
    assert cp.returncode == 0, cp.stderr[-3000:]
    ranks = _ranks(out)
    assert ranks == {r: hosts16.hosts[r // K] for r in range(N * K)}, ranks
    assert not leftovers(hosts16, m)
    assert not leftovers(hosts16, "podrun.host.agent")


@pytest.mark.parametrize("client", ["openssh", "paramiko"])
def test_a_host_that_never_answers_among_16_is_named_and_nothing_starts(hosts16, tmp_path, client):
    """h7's link is down (its packets dropped: no refusal, no reset): preflight names h7, and only h7, within the
    probe timeout; no rank ran and no agent is left on any of the other 15 hosts."""
    from podrun.launch.transports.ssh_common import PROBE_TIMEOUT

    out, m = tmp_path / "out", marker()
    out.mkdir()
    hosts16.isolate("h7")
    try:
        t0 = time.monotonic()
        cp = podrun(*_ssh_launch(hosts16, tmp_path, client), "--", *_worker(out, m), timeout=240)
        took = time.monotonic() - t0
    finally:
        hosts16.heal("h7")
    assert cp.returncode == 2, cp.stderr[-3000:]
    assert "h7: unreachable" in cp.stderr and "Traceback" not in cp.stderr, cp.stderr[-3000:]
    named = {h for h in hosts16.hosts if f"{h}:" in cp.stderr}
    assert named == {"h7"}, cp.stderr[-3000:]
    assert took < PROBE_TIMEOUT, took
    assert not _ranks(out)
    assert not leftovers(hosts16, m) and not leftovers(hosts16, "podrun.host.agent")
    assert summary(tmp_path / "runs")["status"] == "preflight_failed"


@pytest.mark.slurm
def test_16_nodes_over_srun_every_rank_runs_and_nothing_is_left(tmp_path):
    from tests.harness import SlurmCluster

    out, m = tmp_path / "out", marker()
    out.mkdir()
    try:
        sl = SlurmCluster(nodes=N, cpus_per_node=K)
    except HarnessError as e:
        pytest.fail(f"a 16-node Slurm could not be brought up: {e}", pytrace=False)
    with sl:
        launch = [*PODRUN, "launch", "--transport", "srun", "--nodes", str(N), "--devices-per-host", str(K),
                  "--runs-dir", str(tmp_path / "runs"), "--", *_worker(out, m)]
        job = sl.sbatch([f"-N{N}", f"--ntasks-per-node={K}", f"--output={tmp_path}/job.out", f"--chdir={tmp_path}",
                         "--wrap", shlex.join(launch)])
        info = sl.wait_job(job, timeout=240)
        text = (tmp_path / "job.out").read_text()
        assert info["ExitCode"] == "0:0", text[-3000:]
        ranks = _ranks(out)
        assert ranks == {r: sl.nodes[r // K] for r in range(N * K)}, ranks
        assert not {n: sl.processes(n, m) for n in sl.nodes if sl.processes(n, m)}
