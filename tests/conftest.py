"""Shared pytest fixtures: real OpenSSH hosts (ssh_hosts, make_ssh_hosts), a real Slurm (slurm_cluster) and a
real Grid Engine (uge_cluster).

They fail (never skip) with a message naming the missing part. See tests/harness/ for the API.
"""
from __future__ import annotations

import pytest

from tests.harness import HarnessError, NetnsHosts


def _fail(what: str, err: Exception) -> None:
    pytest.fail(f"{what} could not be brought up: {err}", pytrace=False)


@pytest.fixture(scope="session")
def ssh_hosts():
    """4 OpenSSH hosts h1..h4 in network namespaces, shared by the session: do not break them
    (use make_ssh_hosts for fault tests)."""
    try:
        hosts = NetnsHosts(4)
    except HarnessError as e:
        _fail("ssh_hosts (4 OpenSSH hosts in network namespaces)", e)
    with hosts:
        yield hosts


@pytest.fixture
def make_ssh_hosts():
    """Factory: make_ssh_hosts(n=3, name_prefix="h", **kw) -> a fresh NetnsHosts (kw: bashrc=...),
    closed when the test ends: for tests that break hosts."""
    made: list[NetnsHosts] = []

    def make(n: int = 3, name_prefix: str = "h", **kw) -> NetnsHosts:
        try:
            hosts = NetnsHosts(n, name_prefix, **kw)
        except HarnessError as e:
            _fail(f"make_ssh_hosts({n}) (OpenSSH hosts in network namespaces)", e)
        made.append(hosts)
        return hosts

    yield make
    for hosts in reversed(made):
        hosts.close()


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real Slurm: slurmctld + slurmd node1..node3 in network namespaces, shared by the session.
    Pass slurm_cluster.env (it carries SLURM_CONF) to every Slurm command, or use slurm_cluster.run."""
    from tests.harness.slurm import SlurmCluster
    try:
        cluster = SlurmCluster(nodes=3)
    except HarnessError as e:
        _fail("slurm_cluster (slurmctld + 3 slurmd in network namespaces)", e)
    with cluster:
        yield cluster


@pytest.fixture(scope="session")
def uge_cluster():
    """A real Grid Engine cell: sge_qmaster on node1, sge_execd on node1..node3 (OpenSSH hosts in network
    namespaces), parallel environment "podrun" with one slot per host. Run its clients with uge_cluster.run
    (on node1, with SGE_ROOT/SGE_CELL/ports) or pass uge_cluster.env to uge_cluster.exec("node1", ...)."""
    from tests.harness.uge import GridEngineCluster
    try:
        cluster = GridEngineCluster(nodes=3)
    except HarnessError as e:
        _fail("uge_cluster (sge_qmaster + 3 sge_execd in network namespaces)", e)
    with cluster:
        yield cluster


def _hypothesis_seed_line(config) -> str:
    seed = config.getoption("hypothesis_seed", None)
    if seed is None:
        return ("hypothesis: random examples, a new set each run (.ci/run fixes a seed: "
                "PYTEST_ADDOPTS=--hypothesis-seed=N)")
    return (f"hypothesis seed {seed}: replay with PYTEST_ADDOPTS=--hypothesis-seed={seed} "
            f"python3 -m pytest -q tests/fuzz (docs/test-harness.md)")


def pytest_report_header(config):
    return _hypothesis_seed_line(config)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    terminalreporter.write_line(_hypothesis_seed_line(config))
