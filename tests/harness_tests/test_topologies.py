"""Tests of the harness's real-cluster topologies (NetnsHosts keyword arguments): each property the launch
tests rely on, checked with plain OpenSSH and sockets."""
from __future__ import annotations

import ipaddress
import os
import subprocess
import sys

import pytest

from tests.harness import NetnsHosts
from tests.harness.common import tcp_open

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def ssh(config, host, *cmd, timeout=40, env=None):
    return subprocess.run(["ssh", "-F", config, host, *cmd], capture_output=True, text=True, timeout=timeout,
                          env=env)


def connects(hosts, src, addr, port=22):
    code = f"import socket; socket.create_connection(({addr!r}, {port}), 2).close()"
    return hosts.exec(src, [sys.executable, "-c", code], timeout=20).returncode == 0


def answers(hosts, src, addr):
    """Whether addr answers TCP from src at all (a refused connection counts: sshd listens on eth0 only)."""
    code = (f"import socket\ntry:\n socket.create_connection(({addr!r}, 22), 2).close()\n"
            f"except ConnectionRefusedError:\n pass")
    return hosts.exec(src, [sys.executable, "-c", code], timeout=20).returncode == 0


def test_bastion_alone_is_reachable_and_proxyjump_gets_through():
    with NetnsHosts(2, bastion=True) as hosts:
        assert hosts.hosts == ["h1", "h2"] and hosts.bastion == "bastion"
        assert tcp_open(hosts.address("bastion"), 22, 2)
        assert not tcp_open(hosts.address("h1"), 22, 2)                    # walled off from the controller
        assert connects(hosts, "bastion", hosts.address("h1")) and connects(hosts, "h2", hosts.address("h1"))
        cp = ssh(hosts.ssh_config_path, "h2", "echo $SSH_CONNECTION")
        assert cp.returncode == 0 and cp.stdout.split()[0] == hosts.address("bastion"), cp.stderr
    assert not os.path.exists(f"/sys/class/net/prb{hosts.slot}")


def test_debian_hosts_file_maps_each_hosts_own_name_to_127_0_1_1():
    with NetnsHosts(2, loopback_hostname=True) as hosts:
        seen = {h: hosts.exec(h, ["getent", "hosts", "h1", "h2"]).stdout.split() for h in hosts.hosts}
        assert seen["h1"] == ["127.0.1.1", "h1", hosts.address("h2"), "h2"]
        assert seen["h2"] == [hosts.address("h1"), "h1", "127.0.1.1", "h2"]


def test_certificates_are_required_and_accepted_and_the_agent_holds_the_encrypted_key(tmp_path):
    with NetnsHosts(1, ca=True) as hosts:
        assert ssh(hosts.ssh_config_ca_path, "h1", "hostname").stdout.strip() == "h1"
        # the same key without its certificate is refused: only the CA lets it in
        bare = tmp_path / "id"
        bare.write_bytes(open(hosts.ca_key_path, "rb").read())
        bare.chmod(0o600)
        cfg = tmp_path / "cfg"
        cfg.write_text(open(hosts.ssh_config_ca_path).read().replace(hosts.ca_key_path, str(bare)))
        assert "Permission denied" in ssh(str(cfg), "h1", "true").stderr
        # known_hosts holds no host key, only the host CA: a host key without its certificate is unknown
        assert "@cert-authority" in open(hosts.known_hosts_ca_path).read()
        sock = hosts.ssh_agent()
        env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
        assert ssh(hosts.ssh_config_agent_path, "h1", "true", env=env).returncode == 255
        assert ssh(hosts.ssh_config_agent_path, "h1", "hostname", env={**env, "SSH_AUTH_SOCK": sock}).stdout == "h1\n"


def test_data_network_is_shared_by_the_hosts_not_the_controller_and_can_be_cut_alone():
    with NetnsHosts(2, data_network=True) as hosts:
        d1 = hosts.data_addresses["h1"]
        assert d1.startswith("10.203.") and answers(hosts, "h2", d1)
        assert not tcp_open(d1, 22, 1)                      # the controller has no route to the data network
        hosts.data_link("h2", False)
        assert not answers(hosts, "h2", d1) and connects(hosts, "h2", hosts.address("h1"))


def test_ipv6_addresses_answer_ssh():
    with NetnsHosts(1, ipv6=True) as hosts:
        a = hosts.addresses6["h1"]
        assert ssh(hosts.ssh_config_path, a, "hostname").stdout == "h1\n"


def test_ipv6_only_hosts_have_no_ipv4_answer_ssh_over_ipv6_and_refuse_other_subnets():
    """ipv6_only=True: the hosts' addresses, names and ssh are IPv6; a host has no IPv4 address but loopback and
    no route out (an address of another subnet, of either family, is refused at once, nothing is sent), and the
    controller refuses the slot's /48 beyond the bridge's /64 instead of sending it along its default route."""
    with NetnsHosts(2, ipv6_only=True) as hosts:
        a1, a2 = hosts.address("h1"), hosts.address("h2")
        assert a1.startswith("fd00:200:") and ":" in a2
        assert ssh(hosts.ssh_config_path, "h1", "hostname").stdout == "h1\n"
        assert ssh(hosts.ssh_config_path, "h2", "echo $SSH_CONNECTION").stdout.split()[2] == a2
        assert hosts.exec("h1", ["ip", "-4", "-o", "addr", "show", "scope", "global"]).stdout == ""
        assert hosts.exec("h1", ["getent", "ahosts", "h2"]).stdout.split()[0] == a2
        assert connects(hosts, "h1", a2)
        for family, other in (("-6", "fd00:999::1"), ("-4", "10.99.0.1")):
            assert "unreachable default" in hosts.exec("h1", ["ip", family, "route", "show"]).stdout
            cp = hosts.exec("h1", ["ip", family, "route", "get", other])
            assert cp.returncode != 0 and "No route to host" in cp.stderr, cp.stderr
        bridge = ipaddress.IPv6Network(f"{a1}/64", strict=False)
        beyond = str(bridge.network_address + (1 << 64) + 1)  # the next /64: in the slot's /48, off the bridge
        cp = subprocess.run(["ip", "-6", "route", "get", beyond], capture_output=True, text=True)
        assert cp.returncode != 0 or cp.stdout.startswith("unreachable"), cp.stdout
    cp = subprocess.run(["ip", "-6", "route", "show", "type", "unreachable"], capture_output=True, text=True)
    assert str(ipaddress.IPv6Network(f"{a1}/48", strict=False)) not in cp.stdout     # removed at teardown
