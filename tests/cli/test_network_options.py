"""The network options and fields at the boundary (no hosts): --data-interface, the cluster spec's
data_interface, --ssh-client, IPv6 addresses with brackets, and what --dry-run says about MASTER_ADDR."""
from __future__ import annotations

import pytest

from podrun.errors import SpecError
from tests.harness.podrun_proc import run_podrun

def run(*args):
    return run_podrun(*args, timeout=60)


def test_data_interface_sets_both_socket_names_and_dry_run_says_where_master_addr_comes_from(tmp_path):
    cp = run("launch", "--hosts", "n1,n2", "--devices-per-host", "1", "--data-interface", "ib0", "--dry-run",
             "--runs-dir", str(tmp_path), "--", "true")
    assert cp.returncode == 0, cp.stderr
    # set for every agent through its stdin (--env-stdin), as --env is: never on the host's command line
    assert "\nGLOO_SOCKET_IFNAME=ib0\nNCCL_SOCKET_IFNAME=ib0\n" in cp.stdout and " --env-stdin -- true" in cp.stdout
    assert "# MASTER_ADDR n1: n1's address on ib0 (--data-interface), asked from n1 when the run starts" in cp.stdout
    cp = run("launch", "--hosts", "n1,n2", "--devices-per-host", "1", "--dry-run", "--runs-dir", str(tmp_path),
             "--", "true")
    assert "# MASTER_ADDR n1: the host of instance 0 (n1); each host resolves it" in cp.stdout
    assert "GLOO_SOCKET_IFNAME" in cp.stdout and "--env-stdin" not in cp.stdout    # the note only, not set
    assert "every agent's --env" not in cp.stdout


@pytest.mark.parametrize("bad", ["a b", "eth0/1", "x" * 16, ""])
def test_a_bad_data_interface_is_exit_2_naming_the_option(tmp_path, bad):
    cp = run("launch", "--hosts", "n1,n2", "--data-interface", bad, "--dry-run", "--", "true")
    assert cp.returncode == 2 and "--data-interface" in cp.stderr and "Traceback" not in cp.stderr, cp.stderr
    assert "is not a network interface name" in cp.stderr, cp.stderr


def test_cluster_spec_data_interface_is_checked_and_given_to_the_launch(tmp_path):
    from podrun.specs import load_cluster

    base = open("cluster_specs/abci.yaml").read()
    good = tmp_path / "good.yaml"
    good.write_text(base + "data_interface: ib0\n")
    assert load_cluster(str(good)).data_interface == "ib0"
    bad = tmp_path / "bad.yaml"
    bad.write_text(base + "data_interface: 'ib 0'\n")
    with pytest.raises(SpecError, match=r"bad.yaml: field 'data_interface' 'ib 0' is not a network interface name"):
        load_cluster(str(bad))
    cp = run("launch", "--cluster", str(good), "--hosts", "n1,n2", "--devices-per-host", "1", "--dry-run",
             "--runs-dir", str(tmp_path / "runs"), "--", "true")
    assert cp.returncode == 0, cp.stderr
    assert "\nGLOO_SOCKET_IFNAME=ib0\nNCCL_SOCKET_IFNAME=ib0\n" in cp.stdout


@pytest.mark.parametrize("opt,value", [("--hosts", "[fd00::2]:22,[fd00::3]:22"), ("--master-addr", "[fd00::2]")])
def test_ipv6_addresses_in_brackets_are_refused_with_the_way_to_write_them(tmp_path, opt, value):
    args = ["launch", "--devices-per-host", "1", "--dry-run", "--runs-dir", str(tmp_path)]
    args += [opt, value] if opt == "--hosts" else ["--hosts", "fd00::2,fd00::3", opt, value]
    cp = run(*args, "--", "true")
    assert cp.returncode == 2, cp.stderr
    assert f"{opt}: '[fd00::2]" in cp.stderr and "without brackets or a port (e.g. fd00::2)" in cp.stderr
    assert "Traceback" not in cp.stderr


def test_ssh_client_choice_is_checked():
    cp = run("launch", "--hosts", "n1,n2", "--ssh-client", "putty", "--dry-run", "--", "true")
    assert cp.returncode == 2 and "--ssh-client" in cp.stderr and "'putty' is not one of" in cp.stderr


def test_master_addr_is_the_address_ssh_reaches_the_master_by_when_the_config_gives_one(tmp_path):
    """An ssh config whose HostName for n1 is an IP address: MASTER_ADDR is that address and --dry-run says
    why; a HostName that is a name (or none) leaves MASTER_ADDR the host as written."""
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host n1\n  HostName 192.0.2.10\nHost n2\n  HostName n2.example\n")
    base = ["launch", "--devices-per-host", "1", "--dry-run", "--runs-dir", str(tmp_path / "runs"),
            "--ssh-config", str(cfg)]
    for client in ("openssh", "paramiko"):
        cp = run(*base, "--hosts", "n1,n2", "--ssh-client", client, "--", "true")
        assert cp.returncode == 0, cp.stderr
        assert "# MASTER_ADDR 192.0.2.10: the address podrun's ssh reaches n1 by (its HostName" in cp.stdout
        assert cp.stdout.count("MASTER_ADDR=192.0.2.10") == 2 and "--master-addr 192.0.2.10" in cp.stdout
        cp = run(*base, "--hosts", "n2,n1", "--ssh-client", client, "--", "true")
        assert "MASTER_ADDR=n2" in cp.stdout and "# MASTER_ADDR n2: the host of instance 0" in cp.stdout
