"""Tests of the NetnsHosts harness: real sshd hosts in network namespaces, real OpenSSH and paramiko clients."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import paramiko
import pytest

from tests.harness import HarnessError, NetnsHosts, check_prerequisites
from tests.harness.common import NETNS_DIR, SlotLock, pids_in_netns
from tests.harness.netns import KIND, _cleanup_slot

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def three():
    with NetnsHosts(3) as hosts:
        yield hosts


def ssh(hosts, host, *cmd, config=None, timeout=20):
    return subprocess.run(hosts.ssh_argv(host, *cmd, config=config), capture_output=True, text=True,
                          timeout=timeout)


def probe(hosts, from_host, addr, port=22, timeout=1.0):
    """From inside from_host, try a TCP connect: 'open', 'refused', 'timeout' or 'unreachable'."""
    cp = hosts.exec(from_host, ["timeout", str(timeout), "bash", "-c", f"exec 3<>/dev/tcp/{addr}/{port}"])
    if cp.returncode == 0:
        return "open"
    if cp.returncode == 124:
        return "timeout"
    return "refused" if "refused" in cp.stderr else "unreachable"


def test_each_host_answers_openssh_with_its_own_hostname_under_strict_host_key_checking(three):
    assert three.hosts == ["h1", "h2", "h3"]
    assert len(set(three.addresses.values())) == 3
    cfg = open(three.ssh_config_path).read()
    assert "StrictHostKeyChecking yes" in cfg and three.known_hosts_path in cfg
    for h in three.hosts:
        cp = ssh(three, h, "hostname")
        assert cp.returncode == 0, cp.stderr
        assert cp.stdout.strip() == h
    # by IP too: the known_hosts file lists every address
    cp = subprocess.run(["ssh", "-F", three.ssh_config_path, three.address("h2"), "hostname"],
                        capture_output=True, text=True, timeout=20)
    assert (cp.returncode, cp.stdout.strip()) == (0, "h2"), cp.stderr


def test_openssh_refuses_unknown_and_wrong_host_keys_and_unauthorised_client_key(three):
    cp = ssh(three, "h1", "true", config=three.ssh_config_unknown_path)
    assert cp.returncode == 255 and "Host key verification failed" in cp.stderr, cp.stderr
    cp = ssh(three, "h1", "true", config=three.ssh_config_wrong_host_key_path)
    assert cp.returncode == 255 and "Host key verification failed" in cp.stderr, cp.stderr
    cp = subprocess.run(["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                         "-o", f"IdentityFile={three.wrong_key_path}", "-o", "StrictHostKeyChecking=yes",
                         "-o", f"UserKnownHostsFile={three.known_hosts_path}",
                         f"root@{three.address('h1')}", "true"], capture_output=True, text=True, timeout=20)
    assert cp.returncode == 255 and "Permission denied" in cp.stderr, cp.stderr


def _paramiko(hosts, host, known_hosts, key):
    c = paramiko.SSHClient()
    c.load_host_keys(known_hosts)
    c.set_missing_host_key_policy(paramiko.RejectPolicy())
    c.connect(hosts.address(host), username="root", key_filename=key, look_for_keys=False,
              allow_agent=False, timeout=5, banner_timeout=5, auth_timeout=5)
    return c


def test_paramiko_checks_host_keys_against_the_known_hosts_file(three):
    c = _paramiko(three, "h3", three.known_hosts_path, three.key_path)
    try:
        _, out, _ = c.exec_command("hostname")
        assert out.read().decode().strip() == "h3"
    finally:
        c.close()
    with pytest.raises(paramiko.BadHostKeyException):
        _paramiko(three, "h3", three.known_hosts_wrong_path, three.key_path).close()
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        _paramiko(three, "h3", "/dev/null", three.key_path).close()
    with pytest.raises(paramiko.AuthenticationException):
        _paramiko(three, "h3", three.known_hosts_path, three.wrong_key_path).close()


def test_remote_path_puts_the_session_python_first_and_bare_hosts_have_none(three):
    cp = ssh(three, "h1", "command -v python; echo $PATH")
    which, path = cp.stdout.split()
    assert os.path.dirname(which) == os.path.dirname(sys.executable)
    assert path.split(":")[1:] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".split(":")
    bare = NetnsHosts(1, bashrc="")
    with bare:
        cp = ssh(bare, "h1", "echo $PATH")
        assert cp.stdout.strip() == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", cp.stderr


def test_hosts_resolve_each_other_and_the_controller_by_name(three):
    for h in three.hosts:
        out = three.exec(h, ["getent", "hosts", "h1", "h2", "h3", "controller"]).stdout.splitlines()
        assert [line.split()[0] for line in out] == [three.address("h1"), three.address("h2"), three.address("h3"),
                             three.controller_address]
    # ssh from one host to another by name (shared filesystem: the same config works inside)
    cp = three.exec("h1", ["ssh", "-F", three.ssh_config_path, "h2", "hostname"])
    assert (cp.returncode, cp.stdout.strip()) == (0, "h2"), cp.stderr
    cp = three.exec("h2", ["ip", "-4", "-o", "addr", "show", "dev", "eth0"])
    assert three.address("h2") + "/24" in cp.stdout
    assert probe(three, "h3", three.controller_address, 9) == "refused"  # reachable, nothing listens


def test_processes_finds_a_remote_process_and_crash_kills_it_and_is_seen_from_another_host(make_ssh_hosts):
    hosts = make_ssh_hosts(3)
    marker = "podrun-harness-marker-%d" % os.getpid()
    p = subprocess.Popen(hosts.ssh_argv("h2", f"exec -a {marker} sleep 300"), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        found = None
        deadline = time.monotonic() + 60     # a hang guard: ssh's start on a loaded machine takes seconds
        while not found and time.monotonic() < deadline:
            found = hosts.processes("h2", marker)
            time.sleep(0.02)
        assert found and marker in found[0][1]
        assert hosts.processes("h1", marker) == []
        assert found[0][0] in hosts.pids("h2")
        assert probe(hosts, "h1", hosts.address("h2")) == "open"
        hosts.crash("h2")
        assert hosts.processes("h2", marker) == [] and hosts.pids("h2") == []
        assert p.wait(timeout=10) == 255  # the ssh client lost its connection
        assert probe(hosts, "h1", hosts.address("h2")) == "refused"  # host up, nothing listens: RST
        assert hosts.exec("h2", ["hostname"]).stdout.strip() == "h2"  # the console still works
        hosts.revive("h2")
        assert ssh(hosts, "h2", "hostname").stdout.strip() == "h2"
    finally:
        p.kill()
        p.wait()


def test_isolate_poweroff_freeze_and_stop_sshd_are_seen_from_another_host(make_ssh_hosts):
    hosts = make_ssh_hosts(3)
    hosts.isolate("h3")
    assert probe(hosts, "h1", hosts.address("h3"), timeout=0.5) == "timeout"  # silence, not RST
    assert hosts.processes("h3", "sshd")  # processes keep running
    hosts.heal("h3")
    assert probe(hosts, "h1", hosts.address("h3")) == "open"

    hosts.stop_sshd("h2")
    assert probe(hosts, "h1", hosts.address("h2")) == "refused"
    hosts.revive("h2")
    assert ssh(hosts, "h2", "hostname").stdout.strip() == "h2"

    hosts.freeze("h2")
    try:  # the kernel still accepts TCP, but sshd never sends its banner
        cp = hosts.exec("h1", ["timeout", "1", "bash", "-c",
                               f"exec 3<>/dev/tcp/{hosts.address('h2')}/22; echo connected; head -c 4 <&3"])
        assert (cp.returncode, cp.stdout.strip()) == (124, "connected")
    finally:
        hosts.thaw("h2")
    assert ssh(hosts, "h2", "hostname").stdout.strip() == "h2"

    hosts.partition(["h1"], ["h2"])
    assert probe(hosts, "h1", hosts.address("h2"), timeout=0.5) != "open"
    assert probe(hosts, "h3", hosts.address("h2")) == "open"
    hosts.unpartition(["h1"], ["h2"])
    assert probe(hosts, "h1", hosts.address("h2")) == "open"

    hosts.poweroff("h1")
    assert hosts.pids("h1") == []
    assert probe(hosts, "h3", hosts.address("h1"), timeout=0.5) == "timeout"


def _leftovers(slot):
    ns = sorted(p.name for p in NETNS_DIR.glob(f"prh{slot}-*")) if NETNS_DIR.is_dir() else []
    links = sorted(n for n in os.listdir("/sys/class/net") if n == f"prb{slot}" or n.startswith(f"prv{slot}-"))
    return ns, links


def test_teardown_leaves_no_netns_bridge_veth_or_process_and_is_idempotent():
    hosts = NetnsHosts(2)
    slot, netns = hosts.slot, [hosts.fabric.node(h).netns for h in hosts.hosts]
    sshd = [hosts.sshd_pid(h) for h in hosts.hosts]
    assert _leftovers(slot) != ([], [])
    hosts.close()
    hosts.close()
    assert _leftovers(slot) == ([], [])
    assert not any(os.path.exists(f"/proc/{p}/ns/net") for p in sshd)
    assert not any((NETNS_DIR / n).exists() for n in netns)
    assert not hosts.run_dir.exists()
    lock = SlotLock.try_acquire(KIND, slot)  # the slot is free again
    assert lock is not None
    lock.release()


def test_two_instances_at_once_do_not_collide():
    with NetnsHosts(2) as a, NetnsHosts(2) as b:
        assert a.slot != b.slot and a.controller_address != b.controller_address
        assert set(a.addresses.values()).isdisjoint(b.addresses.values())
        for hs in (a, b):
            cp = ssh(hs, "h1", "hostname -I")
            assert cp.returncode == 0 and cp.stdout.split() == [hs.address("h1")], cp.stderr
        # a's h1 is not b's h1: a's known_hosts does not accept b's host key
        cp = subprocess.run(["ssh", "-F", a.ssh_config_path, "-o", f"HostName={b.address('h1')}", "h1", "true"],
                            capture_output=True, text=True, timeout=20)
        assert cp.returncode == 255 and "Host key verification failed" in cp.stderr


def test_stale_slot_left_by_a_killed_session_is_torn_down_before_reuse():
    code = ("import os,signal; from tests.harness import NetnsHosts\n"
            "h=NetnsHosts(1); print(h.slot, h.sshd_pid('h1'), flush=True); os.kill(os.getpid(), signal.SIGKILL)")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert cp.returncode == -signal.SIGKILL, cp.stderr
    slot, sshd = map(int, cp.stdout.split())
    assert pids_in_netns(f"prh{slot}-h1")  # the leftovers are there
    lock = SlotLock.try_acquire(KIND, slot)
    assert lock is not None, "the dead session's slot lock should be free"
    try:
        _cleanup_slot(slot)
        assert _leftovers(slot) == ([], [])
        assert not os.path.exists(f"/proc/{sshd}/ns/net")
    finally:
        lock.release()


def test_session_fixture_gives_four_hosts(ssh_hosts):
    assert ssh_hosts.hosts == ["h1", "h2", "h3", "h4"]
    assert ssh(ssh_hosts, "h4", "hostname").stdout.strip() == "h4"


def test_missing_part_is_named_with_its_apt_package():
    with pytest.raises(HarnessError, match=r"no-such-sshd-xyz \(apt-get install -y openssh-server\)"):
        check_prerequisites([("ip", "iproute2"), ("/usr/sbin/no-such-sshd-xyz", "openssh-server")])
