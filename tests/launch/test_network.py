"""The networks real clusters have (issue 18), on real namespace topologies (tests/harness): a bastion that
alone is reachable (ProxyJump), hosts whose own name resolves to 127.0.1.1 (Debian), and both ssh clients."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.podrun_proc import leftovers, ssh_launch_args, started  # noqa: F401 - leftovers: imported from here
from tests.launch.helpers import ALLREDUCE, end, marker, podrun, podrun_popen, run_dir, summary, wait_output, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]
_port = iter(range(29900, 30100, 2))


def net_args(hosts, tmp_path, *extra, client="openssh", n=None):
    return ssh_launch_args(hosts, tmp_path / "runs", next(_port), *extra, names=hosts.hosts[:n] if n else None,
                           client=client)


def elastic_over_eth1(hosts, tmp_path, spares: str) -> list[str]:
    """net_args on h1,h2 with --data-interface eth1, --elastic 2 and the spares, one restart."""
    args = net_args(hosts, tmp_path, "--data-interface", "eth1", "--keepalive", "2", "--elastic", "2",
                    "--spare-hosts", spares, "--max-restarts", "1")
    args[args.index("--hosts") + 1] = "h1,h2"
    return args


def cut_h1_when_up(hosts, args: list[str], *command: str, up: str) -> tuple[subprocess.Popen, list[str], str, str]:
    """Launch args -- command; once both instances said up, cut h1 off; (the launch, what was read until each up,
    its stdout and stderr from there)."""
    with started(*args, "--", *command) as p:
        seen = [wait_output(p, up, 60) for _ in range(2)]
        hosts.isolate("h1")
        out, err = p.communicate(timeout=150)
    return p, seen, out, err


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
    cp = podrun(*net_args(hosts, tmp_path, "--master-addr", "h2"), "--", "sh", "-c", f"sleep 30 # {m}")
    assert cp.returncode == 2, cp.stdout + cp.stderr
    err = cp.stderr
    assert "h2: MASTER_ADDR h2 resolves to 127.0.1.1 (loopback) on h2" in err, err
    assert f"to {hosts.address('h2')} elsewhere" in err and "not on h1" in err, err
    assert "Traceback" not in err
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


def test_proxyjump_chains_and_proxyjump_none_as_openssh_reads_them(make_ssh_hosts, tmp_path):
    """ProxyJump with a list of hops, and ProxyJump none. h2 is walled off from the bastion too, so only the
    chain bastion,h1 reaches it: with that chain the run spans h1 and h2 (a gloo all-reduce), without it h2
    fails preflight. A Host block whose first ProxyJump is none is tried directly, and the compute host,
    which cannot answer the controller, fails preflight naming it."""
    hosts = make_ssh_hosts(3, bastion=True)
    hosts.partition(["bastion"], ["h2"])
    text = Path(hosts.ssh_config_path).read_text()
    chain = tmp_path / "chain_config"
    chain.write_text(text.replace("Host h2\n", "Host h2\n  ProxyJump bastion,h1\n", 1))
    args = net_args(hosts, tmp_path, n=2)
    args[args.index("--ssh-config") + 1] = str(chain)
    cp = podrun(*args, "--", sys.executable, ALLREDUCE, timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "[1 h2] ALLREDUCE rank=1 world=2 local_rank=0 host=h2 sum=3" in cp.stdout, cp.stdout
    cp = podrun(*net_args(hosts, tmp_path, n=2), "--", "true", timeout=120)
    assert cp.returncode == 2 and "h2: " in cp.stderr and "h1: " not in cp.stderr, cp.stderr
    none = tmp_path / "none_config"
    none.write_text(text.replace("Host h3\n", "Host h3\n  ProxyJump none\n", 1))
    args = net_args(hosts, tmp_path)
    args[args.index("--ssh-config") + 1] = str(none)
    args[args.index("--hosts") + 1] = "h1,h3"
    cp = podrun(*args, "--", "true", timeout=120)
    assert cp.returncode == 2 and "h3: " in cp.stderr and "h1: " not in cp.stderr, cp.stderr
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
        hosts.isolate("h2")
        p.wait(timeout=50)          # a hang guard below the workers' 60 s sleep, which would end the run too
        err = p.stderr.read()
        assert p.returncode == 255 and "instance 1 on h2" in err and "lost" in err, err
        latest = max((d for d in (tmp_path / "runs").iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime)
        s = json.loads((latest / "summary.json").read_text())
        gap = {x["host"]: x["max_heartbeat_gap_s"] for x in s["instances"]}["h2"]
        assert gap >= s["heartbeat"]["bound_s"] == 3.0, s["instances"]     # declared once the bound had passed
        assert wait_until(lambda: not {h: v for h, v in leftovers(hosts, m).items() if h != "h2"}, 5)
        assert wait_until(lambda: not hosts.processes("h2", m), 10), hosts.processes("h2", m)
    finally:
        end(p)


def test_unreachable_compute_host_behind_the_bastion_fails_preflight_naming_it(make_ssh_hosts, tmp_path):
    hosts = make_ssh_hosts(2, bastion=True)
    hosts.stop_sshd("h2")
    cp = podrun(*net_args(hosts, tmp_path), "--", "true")
    assert cp.returncode == 2, cp.stderr
    assert "h2: unreachable: cannot connect to root@" in cp.stderr and "via bastion" in cp.stderr, cp.stderr
    assert "h1:" not in cp.stderr and "Traceback" not in cp.stderr


# -- A2: authentication as OpenSSH does it ---------------------------------------------------------------

def test_user_and_host_certificates_signed_by_cas_the_hosts_and_known_hosts_trust(make_ssh_hosts, tmp_path):
    """The hosts trust a user CA (TrustedUserCAKeys) and present host certificates; the client key is
    accepted only with its certificate beside it (id-cert.pub), and known_hosts holds one @cert-authority
    line, no host key. The OpenSSH client launches; paramiko, which checks neither, is refused at preflight."""
    hosts = make_ssh_hosts(2, ca=True)
    args = net_args(hosts, tmp_path)
    args[args.index("--ssh-config") + 1] = hosts.ssh_config_ca_path
    cp = podrun(*args, "--", "sh", "-c", "echo certified on $(hostname)")
    assert cp.returncode == 0, cp.stderr
    assert "[0 h1] certified on h1" in cp.stdout and "[1 h2] certified on h2" in cp.stdout, cp.stdout
    args[args.index("--ssh-client") + 1] = "paramiko"
    cp = podrun(*args, "--", "true")
    assert cp.returncode == 2 and "h1: " in cp.stderr and "Traceback" not in cp.stderr, cp.stderr


def test_encrypted_key_held_by_ssh_agent_through_identity_agent(make_ssh_hosts, tmp_path, monkeypatch):
    """The only key the hosts accept (besides the harness's own, which this config does not name) is
    encrypted and held by an ssh-agent; the config names the agent with IdentityAgent and SSH_AUTH_SOCK is
    unset. Without the agent's key the same config fails preflight naming authentication."""
    hosts = make_ssh_hosts(2, ca=True)
    sock = hosts.ssh_agent()
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    cfg = tmp_path / "ssh_config"
    text = open(hosts.ssh_config_agent_path).read()
    cfg.write_text(text.replace("Host *\n", f"Host *\n  IdentityAgent {sock}\n"))
    args = net_args(hosts, tmp_path)
    args[args.index("--ssh-config") + 1] = str(cfg)
    cp = podrun(*args, "--", "sh", "-c", "echo agent key on $(hostname)")
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.count("agent key on") == 2, cp.stdout
    cfg.write_text(text.replace("Host *\n", "Host *\n  IdentityAgent none\n"))
    cp = podrun(*args, "--", "true")
    assert cp.returncode == 2 and "h1: authentication failed for root@" in cp.stderr, cp.stderr


# -- B5: multi-homed hosts: management network for ssh, data network for collectives -------------------

@pytest.mark.torch
def test_data_interface_puts_the_master_address_and_gloo_on_the_data_network(make_ssh_hosts, tmp_path):
    """Two networks: ssh over the management one (eth0), the hosts also share a data one (eth1) the
    controller is not on. --data-interface eth1: MASTER_ADDR is h1's eth1 address, GLOO_SOCKET_IFNAME and
    NCCL_SOCKET_IFNAME are eth1 on every worker, and the all-reduce completes."""
    hosts = make_ssh_hosts(2, data_network=True)
    dump = tmp_path / "env"
    dump.mkdir()
    cp = podrun(*net_args(hosts, tmp_path, "--data-interface", "eth1"), "--", sys.executable, ALLREDUCE,
                "--dump", str(dump), timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert cp.stdout.count("sum=3") == 2, cp.stdout
    for rank in (0, 1):
        env = json.loads((dump / f"env-{rank}.json").read_text())
        assert env["MASTER_ADDR"] == hosts.data_addresses["h1"], env["MASTER_ADDR"]
        assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "eth1"


def test_a_worker_that_cannot_reach_rank_0_on_the_data_network_fails_preflight_in_seconds(make_ssh_hosts, tmp_path):
    """h2's data link is down (its management link, and so ssh, is up): preflight fails within seconds naming
    h2, h1, the address and eth1, exit 2, nothing started. An interface no host has is named per host."""
    hosts = make_ssh_hosts(2, data_network=True)
    hosts.data_link("h2", False)
    m = marker()
    cp = podrun(*net_args(hosts, tmp_path, "--data-interface", "eth1"), "--", "sh", "-c", f"sleep 30 # {m}")
    assert cp.returncode == 2, cp.stdout + cp.stderr
    want = f"h2: h2 cannot reach rank 0 on h1 at {hosts.data_addresses['h1']}:"
    assert want in cp.stderr and "over eth1 (from interface eth1:" in cp.stderr, cp.stderr
    assert "- h1:" not in cp.stderr and "Traceback" not in cp.stderr
    assert not leftovers(hosts, m)
    assert summary(tmp_path / "runs")["status"] == "preflight_failed"
    cp = podrun(*net_args(hosts, tmp_path, "--data-interface", "ib0"), "--", "true")
    assert cp.returncode == 2 and "h1: no interface ib0 with an IPv4 or global IPv6 address on the master host h1" in cp.stderr, cp.stderr
    assert "eth0, eth1, lo" in cp.stderr and "Traceback" not in cp.stderr


# -- B6: IPv6 addresses ------------------------------------------------------------------------------------

@pytest.mark.torch
def test_ipv6_addresses_as_hosts_and_master_addr(make_ssh_hosts, tmp_path):
    """Hosts given by their IPv6 addresses (sshd listens there, known_hosts lists them): ssh, preflight
    (resolution, reachability of rank 0), the store and the all-reduce work; MASTER_ADDR is the IPv6
    address of instance 0's host, unbracketed, as torch expects it."""
    hosts = make_ssh_hosts(2, ipv6=True)
    v6 = [hosts.addresses6[h] for h in hosts.hosts]
    dump = tmp_path / "env"
    dump.mkdir()
    args = net_args(hosts, tmp_path)
    args[args.index("--hosts") + 1] = ",".join(v6)
    cp = podrun(*args, "--", sys.executable, ALLREDUCE, "--dump", str(dump), timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert f"[0 {v6[0]}] ALLREDUCE rank=0 world=2 local_rank=0 host=h1 sum=3" in cp.stdout, cp.stdout
    assert json.loads((dump / "env-1.json").read_text())["MASTER_ADDR"] == v6[0]


def test_elastic_spare_takes_a_lost_hosts_place_through_the_bastion(make_ssh_hosts, tmp_path):
    """--elastic through the bastion: h2 is cut off, spare h4 (also behind the bastion) takes its place and
    the run ends 0 on h1, h4, h3."""
    hosts = make_ssh_hosts(4, bastion=True)
    m = marker()
    args = net_args(hosts, tmp_path, "--keepalive", "2", "--elastic", "3", "--spare-hosts", "h4", "--max-restarts", "1")
    args[args.index("--hosts") + 1] = "h1,h2,h3"
    # the first attempt waits until podrun ends it (the cut), the re-planned one ends at once
    p = podrun_popen(*args, "--", "sh", "-c",
                     f'echo "up $RANK of $WORLD_SIZE"; [ "$PODRUN_RESTART_COUNT" != 0 ] || sleep 600 # {m}')
    try:
        for _ in range(3):
            wait_output(p, "up", 60)
        hosts.isolate("h2")
        err = p.communicate(timeout=120)[1]
    finally:
        end(p)
    assert p.returncode == 0, err
    assert "elastic: dropping h2 (host h2 lost" in err and "spare h4 in its place" in err, err
    assert [x["host"] for x in summary(tmp_path / "runs")["instances"]] == ["h1", "h4", "h3"]


def test_include_match_exec_negated_patterns_and_proxycommand_tokens(make_ssh_hosts, tmp_path):
    """The ssh config as users write it: the main file only Includes another; ``Match host h* exec`` gives
    the compute hosts a ProxyCommand with %h %p %r tokens (through the bastion); ``Host * !bastion``
    carries their known_hosts. OpenSSH applies all of it; podrun launches through it."""
    hosts = make_ssh_hosts(2, bastion=True)
    base = open(hosts.ssh_config_path).read()
    blocks = base.split("Host ")
    common = "Host " + blocks[-1]                              # the "Host *" block: user, key, known hosts...
    addrs = "".join(f"Host {h}\n  HostName {hosts.address(h)}\n" for h in [*hosts.hosts, hosts.bastion])
    sub = tmp_path / "sub.conf"
    sub.write_text(
        addrs
        + f'Match host {",".join(hosts.address(h) for h in hosts.hosts)} exec "test -r {sub}"\n'
        + f"  ProxyCommand ssh -F {tmp_path / 'main.conf'} -l %r -W %h:%p {hosts.bastion}\n"
        + f"Host * !{hosts.bastion}\n  ConnectTimeout 7\n"
        + common)
    main = tmp_path / "main.conf"
    main.write_text(f"Include {sub}\n")
    args = net_args(hosts, tmp_path)
    args[args.index("--ssh-config") + 1] = str(main)
    cp = podrun(*args, "--", "sh", "-c", "echo via $(echo $SSH_CONNECTION | cut -d' ' -f1) on $(hostname)")
    assert cp.returncode == 0, cp.stderr
    for i, h in enumerate(hosts.hosts):
        assert f"[{i} {h}] via {hosts.address(hosts.bastion)} on {h}" in cp.stdout, cp.stdout


@pytest.mark.torch
def test_elastic_replan_that_moves_the_master_asks_the_new_master_for_its_data_address(make_ssh_hosts, tmp_path):
    """Two networks, --data-interface eth1, --elastic with spare h3; the management network does not join h2 and
    h3 (a blackhole between their eth0 addresses), so only eth1 carries their traffic. h1, instance 0's host, is
    cut mid-run: the re-plan puts h3 in its place as instance 0, and the next attempt's MASTER_ADDR is h3's eth1
    address (asked from h3, as at the start), in env.json and in the workers' env; its all-reduce completes over
    eth1 and the run ends 0. With h3's name as MASTER_ADDR, h2 could not reach rank 0 and the run would end."""
    hosts = make_ssh_hosts(3, data_network=True)
    hosts.partition(["h2"], ["h3"])
    dump = tmp_path / "env"
    dump.mkdir()
    m = marker()
    script = (f'if [ "$PODRUN_RESTART_COUNT" = 0 ]; then echo "up $RANK at $MASTER_ADDR"; exec sleep 60; fi; '
              f'exec "$0" {ALLREDUCE} --dump {dump} # {m}')
    args = elastic_over_eth1(hosts, tmp_path, "h3")
    cp = podrun(*args, "--dry-run", "--", "sh", "-c", script, sys.executable)
    assert cp.returncode == 0, cp.stderr
    assert "# MASTER_ADDR h1: h1's address on eth1 (--data-interface), asked from h1 when the run starts (an --elastic " \
           "re-plan that moves instance 0 asks its new host the same way)" in cp.stdout, cp.stdout
    p, seen, out, err = cut_h1_when_up(hosts, args, "sh", "-c", script, sys.executable, up="up")
    assert all(f"at {hosts.data_addresses['h1']}" in said for said in seen), seen
    assert p.returncode == 0, out + err
    assert "elastic: dropping h1 (host h1 lost" in err and "spare h3 in its place" in err, err
    assert "[0 h3] ALLREDUCE rank=0 world=2 local_rank=0 host=h3 sum=3 restart=1" in out, out
    rd = run_dir(tmp_path / "runs")
    assert [x["host"] for x in summary(tmp_path / "runs")["instances"]] == ["h3", "h2"]
    assert json.loads((rd / "plan-1.json").read_text())["placement"][0]["host"] == "h3"
    recorded = json.loads((rd / "env.json").read_text())
    assert recorded["restart_count"] == 1
    assert [i["workers"][0]["MASTER_ADDR"] for i in recorded["instances"]] == [hosts.data_addresses["h3"]] * 2
    for rank in (0, 1):
        env = json.loads((dump / f"env-{rank}.json").read_text())
        assert env["MASTER_ADDR"] == hosts.data_addresses["h3"] and env["GLOO_SOCKET_IFNAME"] == "eth1", env


def test_elastic_new_master_that_cannot_be_asked_its_data_address_is_dropped_for_the_next_spare(make_ssh_hosts,
                                                                                               tmp_path):
    """--data-interface eth1, spares h3 (its sshd gone) and h4. h1, instance 0's host, is cut: spare h3 would be
    the new instance 0 but cannot be asked for its eth1 address; podrun says so, h3 fails the re-planned
    attempt's check and is dropped, spare h4 takes its place and is asked: MASTER_ADDR is h4's eth1 address."""
    hosts = make_ssh_hosts(4, data_network=True)
    hosts.stop_sshd("h3")
    m = marker()
    script = (f'echo "up $RANK at $MASTER_ADDR restart $PODRUN_RESTART_COUNT"; '
              f'[ "$PODRUN_RESTART_COUNT" != 0 ] || sleep 600 # {m}')
    p, _, out, err = cut_h1_when_up(hosts, elastic_over_eth1(hosts, tmp_path, "h3,h4"), "sh", "-c", script,
                                    up="restart 0")
    assert p.returncode == 0, out + err
    said = [line for line in err.splitlines() if "elastic:" in line]
    assert len(said) == 3, err
    assert "dropping h1 (host h1 lost" in said[0] and "spare h3 in its place" in said[0], err
    assert said[1].startswith("podrun: elastic: cannot ask h3 for its address on eth1 (h3: ") and \
        said[1].endswith("; its preflight decides"), err
    assert "dropping h3 (" in said[2] and "spare h4 in its place" in said[2], err
    want = hosts.data_addresses["h4"]
    assert f"[0 h4] up 0 at {want} restart 1" in out and f"[1 h2] up 1 at {want} restart 1" in out, out
    assert [x["host"] for x in summary(tmp_path / "runs")["instances"]] == ["h4", "h2"]
