"""IPv6-only hosts (issue 18, B6) on the harness's ``ipv6_only`` topology: hosts with no IPv4 address but loopback,
names that resolve to IPv6 addresses, ssh over IPv6, and a route that refuses anything outside the test's subnet."""
from __future__ import annotations

import json
import sys

import pytest

from tests.launch.helpers import ALLREDUCE, podrun

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]
_port = iter(range(30100, 30200, 2))


def v6_args(hosts, tmp_path, *extra, hosts_arg=None, client="openssh"):
    return ["launch", "--hosts", hosts_arg or ",".join(hosts.hosts), "--devices-per-host", "1", "--transport", "ssh",
            "--ssh-config", hosts.ssh_config_path, "--ssh-client", client, "--python", hosts.python,
            "--runs-dir", str(tmp_path / "runs"), *extra]


def assert_ipv6_only(hosts):
    """The topology itself: no IPv4 address on any host but loopback; names resolve to the IPv6 addresses."""
    for h in hosts.hosts:
        v4 = hosts.exec(h, ["ip", "-4", "-o", "addr", "show", "scope", "global"])
        assert v4.returncode == 0 and v4.stdout.strip() == "", v4.stdout
        other = hosts.hosts[-1] if h != hosts.hosts[-1] else hosts.hosts[0]
        assert hosts.exec(h, ["getent", "ahosts", other]).stdout.split()[0] == hosts.address(other)
        assert ":" in hosts.address(other)


@pytest.mark.torch
def test_gloo_all_reduce_on_ipv6_only_hosts_given_by_address(make_ssh_hosts, tmp_path):
    """Three IPv6-only hosts given to --hosts by their IPv6 addresses, the rendezvous as torchrun writes it
    (--rdzv-endpoint [ADDR]:PORT): --dry-run names MASTER_ADDR (h1's IPv6 address, unbracketed) and where it
    comes from; the run (ssh, preflight, the agent store, gloo) completes the all-reduce on every host."""
    hosts = make_ssh_hosts(3, ipv6_only=True)
    assert_ipv6_only(hosts)
    v6 = [hosts.address(h) for h in hosts.hosts]
    port = next(_port)
    args = v6_args(hosts, tmp_path, "--rdzv-endpoint", f"[{v6[0]}]:{port}", hosts_arg=",".join(v6))
    cp = podrun(*args, "--dry-run", "--", sys.executable, ALLREDUCE)
    assert cp.returncode == 0, cp.stderr
    assert f"# MASTER_ADDR {v6[0]}: the host of instance 0 ({v6[0]}), an IP address;" in cp.stdout, cp.stdout
    assert cp.stdout.count(f"MASTER_ADDR={v6[0]}\n") == 3 and f"MASTER_PORT={port}\n" in cp.stdout, cp.stdout
    dump = tmp_path / "env"
    dump.mkdir()
    cp = podrun(*args, "--", sys.executable, ALLREDUCE, "--dump", str(dump), timeout=150)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    for i, h in enumerate(hosts.hosts):
        assert f"[{i} {v6[i]}] ALLREDUCE rank={i} world=3 local_rank=0 host={h} sum=6" in cp.stdout, cp.stdout
    env = json.loads((dump / "env-2.json").read_text())
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == (v6[0], str(port))
    assert "GLOO_SOCKET_IFNAME" not in env      # the hosts' names resolve to their own IPv6 address: gloo's default


@pytest.mark.torch
def test_data_interface_on_ipv6_only_hosts_gives_the_ipv6_address(make_ssh_hosts, tmp_path):
    """--data-interface eth0 on IPv6-only hosts, through the paramiko client: the master host's address on eth0 is
    its IPv6 one, which becomes MASTER_ADDR (--dry-run says it is asked from the host), GLOO_SOCKET_IFNAME is eth0
    everywhere and gloo binds eth0's global IPv6 address (not its link-local one): the all-reduce completes."""
    hosts = make_ssh_hosts(2, ipv6_only=True)
    args = v6_args(hosts, tmp_path, "--data-interface", "eth0", "--master-port", str(next(_port)), client="paramiko")
    cp = podrun(*args, "--dry-run", "--", "true")
    assert cp.returncode == 0 and "h1's address on eth0 (--data-interface), asked from h1" in cp.stdout, cp.stdout
    dump = tmp_path / "env"
    dump.mkdir()
    cp = podrun(*args, "--", sys.executable, ALLREDUCE, "--dump", str(dump), timeout=150)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert cp.stdout.count("sum=3") == 2, cp.stdout
    for rank in (0, 1):
        env = json.loads((dump / f"env-{rank}.json").read_text())
        assert env["MASTER_ADDR"] == hosts.address("h1"), env["MASTER_ADDR"]
        assert env["GLOO_SOCKET_IFNAME"] == "eth0"


@pytest.mark.torch
def test_debian_own_name_on_ipv6_only_hosts_gets_the_interface_on_the_route_to_the_master(make_ssh_hosts, tmp_path):
    """IPv6-only hosts whose own name resolves to 127.0.1.1 (Debian's /etc/hosts): gloo would bind and advertise
    loopback; the agent sets GLOO_SOCKET_IFNAME to the interface on the IPv6 route to MASTER_ADDR (h1's IPv6
    address, from the ssh config's HostName), on every host, and the all-reduce completes."""
    hosts = make_ssh_hosts(2, ipv6_only=True, loopback_hostname=True)
    assert hosts.exec("h2", ["getent", "hosts", "h2"]).stdout.split()[0] == "127.0.1.1"
    dump = tmp_path / "env"
    dump.mkdir()
    cp = podrun(*v6_args(hosts, tmp_path, "--master-port", str(next(_port))), "--", sys.executable, ALLREDUCE,
                "--dump", str(dump), timeout=150)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert cp.stdout.count("sum=3") == 2, cp.stdout
    for rank in (0, 1):
        env = json.loads((dump / f"env-{rank}.json").read_text())
        assert env["MASTER_ADDR"] == hosts.address("h1") and env["GLOO_SOCKET_IFNAME"] == "eth0", env
