"""Shared pytest fixtures: real OpenSSH hosts (ssh_hosts, make_ssh_hosts), a real Slurm (slurm_cluster) and a
real Grid Engine (uge_cluster); and how the suite runs concurrently (pytest-xdist workers, groups, serial tests).

They fail (never skip) with a message naming the missing part. See tests/harness/ for the API.
"""
from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

import pytest

from tests.harness import HarnessError, NetnsHosts

# Every torch process the suite starts (workers on the namespace hosts, the local transport's, calibration
# probes) waits with its OpenMP threads asleep, not spinning: the suite oversubscribes the cores (every
# namespace host believes it has them all, and several tests run at once), and libgomp's default spin after
# each parallel region then takes CPU the other processes need (docs/test-harness.md, "Where the time goes").
# The harness's hosts export it too (tests.harness.netns.default_bashrc).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# The suite starts some 1500 Python processes that import podrun from this checkout (controllers, agents, zygotes,
# workers), and each xdist worker collects the test modules: where the environment sets PYTHONDONTWRITEBYTECODE
# (this machine kind does), none of them may cache bytecode, so each compiled again what no process without it had
# cached: tests/launch/test_local.py took 14 % more CPU alone, collecting the suite twice as long (docs/test-harness.md).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# No property test is bound to the wall clock: hypothesis's default deadline (200 ms an example) fails a test whose
# example a loaded machine runs slowly (DeadlineExceeded, or Flaky when the replay is fast), whatever the code does.
try:
    from hypothesis import settings
except ImportError:         # a lent GPU's image has no hypothesis: bench.gpu_check runs tests/gpu, which uses none
    pass
else:
    settings.register_profile("podrun", deadline=None)
    settings.load_profile("podrun")


def _fail(what: str, err: Exception) -> None:
    pytest.fail(f"{what} could not be brought up: {err}", pytrace=False)


@pytest.fixture(autouse=True)
def _forget_secret_values():
    """The secret values one test's in-process launch registered (podrun.redaction.remember_secret) are not hidden
    in the next test's text."""
    yield
    from podrun.redaction import forget_secrets

    forget_secrets()


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
    yield from _session_cluster(SlurmCluster, "slurm_cluster (slurmctld + 3 slurmd in network namespaces)")


@pytest.fixture(scope="session")
def uge_cluster():
    """A real Grid Engine cell: sge_qmaster on node1, sge_execd on node1..node3 (OpenSSH hosts in network
    namespaces), parallel environment "podrun" with one slot per host. Run its clients with uge_cluster.run
    (on node1, with SGE_ROOT/SGE_CELL/ports) or pass uge_cluster.env to uge_cluster.exec("node1", ...)."""
    from tests.harness.uge import GridEngineCluster
    yield from _session_cluster(GridEngineCluster, "uge_cluster (sge_qmaster + 3 sge_execd in network namespaces)")


def _session_cluster(cluster_type, what: str):
    """A 3-node cluster_type for the session's fixture (what names it in the failure when it cannot start)."""
    try:
        cluster = cluster_type(nodes=3)
    except HarnessError as e:
        _fail(what, e)
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


# --------------------------------------------------------------------------- running concurrently (pytest-xdist)
#
# pyproject's addopts run the suite with `-n auto --dist loadgroup`: `auto` is the count below, each worker a
# process of its own with its own session fixtures (the harness gives each its own slot: hosts, bridge, subnet).
# Groups (one worker runs a group's tests one after another):
# - the tests that use the Slurm or the Grid Engine cluster, one group each, so one worker brings each up;
# - the modules whose tests train torch on several namespace hosts at once (4 workers, their zygotes, restarts:
#   tens of CPU seconds each): one at a time, beside the lighter tests, on a machine of few cores;
# - the modules that start hundreds of workers or 16 hosts at once (many_ranks): one at a time too.
# A test marked `serial` runs with no other test running (the run's other workers wait for it).

WORKERS_PER_CORE = 1.5    # much of a test's time is waiting (heartbeats, hang windows, sshd, daemons), not CPU
GIB_PER_WORKER = 3        # a worker's torch runs: up to 4 hosts x (worker + zygote) of ~300 MB each
CLUSTER_GROUPS = {"slurm_cluster": "slurm_cluster", "uge_cluster": "uge_cluster"}   # fixture -> xdist group
HEAVY_GROUP = "torch_on_hosts"
HEAVY_MODULES = ("tests/elastic/test_snapshot_ssh.py", "tests/elastic/test_warm.py", "tests/elastic/test_elastic_ssh.py",
                 "tests/elastic/test_snapshot_security.py", "tests/faults/test_lost_host_detection.py",
                 "tests/calibrate/test_calibrate_ssh.py")
MANY_GROUP = "many_ranks"  # hundreds of light workers, or 16 hosts, at once: one such module at a time
MANY_MODULES = ("tests/launch/test_scale_supervision.py", "tests/elastic/test_elastic_256.py",
                "tests/launch/test_scale.py", "tests/calibrate/test_calibrate_local.py")


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        pass
    return None


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: WORKERS_PER_CORE per core, at most one per GIB_PER_WORKER of memory, at least 2;
    PYTEST_XDIST_AUTO_NUM_WORKERS overrides it."""
    forced = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "").strip()
    if forced.isdigit():
        return int(forced)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n = int(WORKERS_PER_CORE * cores + 0.5)
    mem = _memory_gib()
    if mem is not None:
        n = min(n, int(mem // GIB_PER_WORKER))
    return max(2, n)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Serial tests last (when the other workers have little left to wait for them); under --dist loadgroup,
    the groups above (before xdist reads them; a serial test is in none)."""
    items.sort(key=lambda item: item.get_closest_marker("serial") is not None)      # stable: order kept otherwise
    if not getattr(config.option, "loadgroup", False):      # set by xdist in its workers under --dist loadgroup
        return
    for item in items:
        if item.get_closest_marker("serial") is not None:
            continue
        groups = [g for f, g in CLUSTER_GROUPS.items() if f in getattr(item, "fixturenames", ())]
        module = item.nodeid.split("::")[0]
        if not groups and module in HEAVY_MODULES:
            groups = [HEAVY_GROUP]
        elif not groups and module in MANY_MODULES:
            groups = [MANY_GROUP]
        for group in groups:
            item.add_marker(pytest.mark.xdist_group(group))


def _lock(path: Path, mode: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, mode)
    return fd


def _unlock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under xdist, a `serial` test holds the run's room alone; every other test shares it. Two flock files in
    the run's base temp directory (shared by its workers, private to the run): ``gate`` is taken by a serial
    test first and held while it waits, so no new test slips in ahead of it; ``room`` is exclusive for it and
    shared for the others. Outermost wrapper: the wait is outside pytest-timeout's clock and the durations."""
    workerinput = getattr(item.config, "workerinput", None)
    factory = getattr(item.config, "_tmp_path_factory", None)
    if workerinput is None or factory is None:
        yield
        return
    where = factory.getbasetemp().parent        # <run's basetemp>/popen-gwN -> <run's basetemp>
    gate, room = where / "serial-gate.lock", where / "serial-room.lock"
    if item.get_closest_marker("serial") is not None:
        g = _lock(gate, fcntl.LOCK_EX)
        r = _lock(room, fcntl.LOCK_EX)
        try:
            yield
        finally:
            _unlock(r)
            _unlock(g)
    else:
        g = _lock(gate, fcntl.LOCK_EX)
        r = _lock(room, fcntl.LOCK_SH)
        _unlock(g)
        try:
            yield
        finally:
            _unlock(r)
