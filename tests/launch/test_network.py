"""The networks real clusters have (issue 18), on real namespace topologies (tests/harness): a bastion that
alone is reachable (ProxyJump), hosts whose own name resolves to 127.0.1.1 (Debian), and both ssh clients."""
from __future__ import annotations

import json
import sys
import time

import pytest

from tests.launch.helpers import ALLREDUCE, marker, podrun, podrun_popen, summary, wait_output, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]
_port = iter(range(29900, 30100, 2))


def net_args(hosts, tmp_path, *extra, client="openssh", n=None):
    names = hosts.hosts[:n] if n else hosts.hosts
    return ["launch", "--hosts", ",".join(names), "--devices-per-host", "1", "--transport", "ssh",
            "--ssh-config", hosts.ssh_config_path, "--ssh-client", client, "--python", hosts.python,
            "--runs-dir", str(tmp_path / "runs"), "--master-port", str(next(_port)), *extra]


def leftovers(hosts, m):
    return {h: hosts.processes(h, m) for h in hosts.hosts if hosts.processes(h, m)}


# -- B4: a host's own name resolves to 127.0.1.1 ---------------------------------------------------------

@pytest.mark.torch
def test_gloo_all_reduce_across_hosts_whose_own_name_is_127_0_1_1(make_ssh_hosts, tmp_path):
    """Debian's /etc/hosts on every host (its own name -> 127.0.1.1): gloo would bind and advertise loopback
    on every host; podrun's agent sets GLOO_SOCKET_IFNAME to the interface on the route to the master, so
    the all-reduce across hosts completes."""
    hosts = make_ssh_hosts(2, loopback_hostname=True)
    assert hosts.exec("h1", ["getent", "hosts", "h1"]).stdout.split()[0] == "127.0.1.1"
    dump = tmp_path / "env"
    dump.mkdir()
    cp = podrun(*net_args(hosts, tmp_path), "--", sys.executable, ALLREDUCE, "--dump", str(dump), timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert cp.stdout.count("sum=3") == 2, cp.stdout
    for rank in (0, 1):
        env = json.loads((dump / f"env-{rank}.json").read_text())
        assert env["GLOO_SOCKET_IFNAME"] == "eth0", env.get("GLOO_SOCKET_IFNAME")


def test_gloo_interface_is_left_alone_where_the_hostname_resolves_elsewhere(ssh_hosts, tmp_path):
    """On hosts whose name resolves to their own address, gloo's default stands: no GLOO_SOCKET_IFNAME."""
    cp = podrun(*net_args(ssh_hosts, tmp_path, n=2), "--", "sh", "-c", "echo ifname=${GLOO_SOCKET_IFNAME:-unset}")
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.count("ifname=unset") == 2, cp.stdout


def test_master_addr_on_loopback_at_a_worker_fails_preflight_naming_both_hosts(make_ssh_hosts, tmp_path):
    """--master-addr h2 with Debian hosts: h2 resolves it to 127.0.1.1, h1 to h2's address; the workers on
    h2 would wait for rank 0 (on h1) on h2 itself. Preflight fails in seconds naming h2, h1 and both
    resolutions, exit 2, nothing started."""
    hosts = make_ssh_hosts(2, loopback_hostname=True)
    m = marker()
    t0 = time.monotonic()
    cp = podrun(*net_args(hosts, tmp_path, "--master-addr", "h2"), "--", "sh", "-c", f"sleep 30 # {m}")
    took = time.monotonic() - t0
    assert cp.returncode == 2, cp.stdout + cp.stderr
    err = cp.stderr
    assert "h2: MASTER_ADDR h2 resolves to 127.0.1.1 (loopback) on h2" in err, err
    assert f"to {hosts.address('h2')} elsewhere" in err and "not on h1" in err, err
    assert "Traceback" not in err and took < 30, took
    assert not leftovers(hosts, m)
    assert summary(tmp_path / "runs")["status"] == "preflight_failed"


# -- A1: a bastion that alone is reachable (ProxyJump) ----------------------------------------------------

@pytest.mark.torch
def test_launch_through_a_bastion_with_proxyjump(make_ssh_hosts, tmp_path):
    """The compute hosts are reachable only from the bastion (ssh config: ProxyJump bastion). Preflight,
    launch and a gloo all-reduce across them work through it; the paramiko client, which cannot follow
    ProxyJump, is refused at preflight with a message naming the directive and the way out."""
    hosts = make_ssh_hosts(3, bastion=True)
    direct = hosts.exec("bastion", ["true"])     # the harness: the bastion is up; the compute hosts are walled off
    assert direct.returncode == 0
    cp = podrun(*net_args(hosts, tmp_path), "--", sys.executable, ALLREDUCE, timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    for i, h in enumerate(hosts.hosts):
        assert f"[{i} {h}] ALLREDUCE rank={i} world=3 local_rank=0 host={h} sum=6" in cp.stdout, cp.stdout
    cp = podrun(*net_args(hosts, tmp_path, client="paramiko"), "--", "true")
    assert cp.returncode == 2, cp.stderr
    assert "h1: the ssh config gives h1 a proxyjump, which the paramiko ssh client does not follow" in cp.stderr
    assert "Traceback" not in cp.stderr


def test_bastion_fail_fast_and_lost_host_leave_nothing_behind(make_ssh_hosts, tmp_path):
    """Through the bastion: a worker exiting 3 ends the run with 3 and every process everywhere; a compute
    host cut off mid-run is named as lost within seconds and its agent ends its workers itself."""
    hosts = make_ssh_hosts(3, bastion=True)
    m = marker()
    cp = podrun(*net_args(hosts, tmp_path), "--", "sh", "-c",
                f"echo up $RANK; sleep 1; [ $RANK = 2 ] && exit 3; sleep 60 # {m}")
    assert cp.returncode == 3, cp.stderr
    assert "root cause: instance 2 on h3" in cp.stderr, cp.stderr
    assert wait_until(lambda: not leftovers(hosts, m), 5), leftovers(hosts, m)

    m = marker()
    p = podrun_popen(*net_args(hosts, tmp_path, "--keepalive", "3"), "--", "sh", "-c", f"echo up $RANK; sleep 60 # {m}")
    try:
        for _ in range(3):
            wait_output(p, "up", 30)
        t0 = time.monotonic()
        hosts.isolate("h2")
        p.wait(timeout=30)
        took = time.monotonic() - t0
        err = p.stderr.read()
        assert p.returncode == 255 and "instance 1 on h2" in err and "lost" in err, err
        assert took < 12, took
        assert wait_until(lambda: not {h: v for h, v in leftovers(hosts, m).items() if h != "h2"}, 5)
        assert wait_until(lambda: not hosts.processes("h2", m), 10), hosts.processes("h2", m)
    finally:
        if p.poll() is None:
            p.kill()


def test_unreachable_compute_host_behind_the_bastion_fails_preflight_naming_it(make_ssh_hosts, tmp_path):
    hosts = make_ssh_hosts(2, bastion=True)
    hosts.stop_sshd("h2")
    cp = podrun(*net_args(hosts, tmp_path), "--", "true")
    assert cp.returncode == 2, cp.stderr
    assert "h2: unreachable: cannot connect to root@" in cp.stderr and "via bastion" in cp.stderr, cp.stderr
    assert "h1:" not in cp.stderr and "Traceback" not in cp.stderr
