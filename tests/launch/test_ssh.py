"""podrun launch over ssh on real OpenSSH hosts in network namespaces (tests/harness): contract, faults."""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

# leftovers: the other launch tests import it from here
from tests.harness.podrun_proc import leftovers, ssh_launch_args  # noqa: F401
from tests.launch.helpers import ALLREDUCE, end, marker, podrun, podrun_popen, run_dir, summary, wait_output, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]
_port = iter(range(29700, 29900, 2))


CLIENTS = pytest.mark.parametrize("client", ["openssh", "paramiko"])   # both clients of the ssh transport


def ssh_args(hosts, tmp_path, *extra, config=None, n=None, client="auto"):
    return ssh_launch_args(hosts, tmp_path / "runs", next(_port), *extra, config=config,
                           names=hosts.hosts[:n] if n else None, client=client)


@pytest.mark.torch
def test_gloo_all_reduce_and_env_contract_across_4_hosts(ssh_hosts, tmp_path):
    """A torchrun script runs unchanged on 4 hosts: all_reduce = 1+2+3+4; the env contract per host."""
    dump = tmp_path / "env"
    dump.mkdir()
    cp = podrun(*ssh_args(ssh_hosts, tmp_path), "--", sys.executable, ALLREDUCE, "--dump", str(dump))
    assert cp.returncode == 0, cp.stderr
    lines = sorted(l for l in cp.stdout.splitlines() if "ALLREDUCE" in l)
    assert len(lines) == 4, cp.stdout
    ports, store = [], []
    for i, line in enumerate(lines):
        host = ssh_hosts.hosts[i]
        assert line.startswith(f"[{i} {host}] ALLREDUCE rank={i} world=4 local_rank=0 host={host} sum=10"), line
        env = json.loads((dump / f"env-{i}.json").read_text())
        assert env["RANK"] == str(i) and env["GROUP_RANK"] == str(i) and env["PODRUN_INSTANCE_INDEX"] == str(i)
        assert env["WORLD_SIZE"] == "4" and env["LOCAL_WORLD_SIZE"] == "1" and env["LOCAL_RANK"] == "0"
        # the address podrun's ssh reaches h1 by (the harness's config gives each host HostName <ip>)
        assert env["MASTER_ADDR"] == ssh_hosts.address(ssh_hosts.hosts[0]) and env["PODRUN_NUM_INSTANCES"] == "4"
        ports.append(env["MASTER_PORT"])
        store.append(env.get("TORCHELASTIC_USE_AGENT_STORE"))
    # the agent store: h1's agent holds the rendezvous port and serves the store; every worker dials it
    assert len(set(ports)) == 1 and store == ["True"] * 4
    rd = run_dir(tmp_path / "runs")
    for i in range(4):
        assert "sum=10" in (rd / f"instance-{i}.log").read_text()
    s = summary(tmp_path / "runs")
    assert [x["host"] for x in s["instances"]] == ssh_hosts.hosts and s["exit_code"] == 0
    assert all(x["status"] == "ok" for x in s["instances"])
    command = (rd / "command").read_text()
    assert all(f"# {h}\ncd " in command for h in ssh_hosts.hosts)


@CLIENTS
def test_fail_fast_across_hosts_leaves_nothing_on_any_host(ssh_hosts, tmp_path, client):
    """4 hosts x 2 workers; rank 5 (host 3) exits 3: run exits 3, every process on every host gone."""
    m = marker()
    cp = podrun(*ssh_args(ssh_hosts, tmp_path, client=client)[:-2], "--devices-per-host", "2", "--master-port", str(next(_port)),
                "--", "sh", "-c", f"echo up $RANK; sleep 1; [ $RANK = 5 ] && {{ echo dying >&2; exit 3; }}; sleep 60 # {m}")
    assert cp.returncode == 3, cp.stderr
    host = ssh_hosts.hosts[2]
    assert f"root cause: instance 2 on {host}, local rank 1: exited with code 3" in cp.stderr
    # fail fast: the other ranks were ended by podrun (a signal), not by the end of their 60 s sleep
    s = summary(tmp_path / "runs")
    ended = {(i["index"], r): c for i in s["instances"] for r, c in (i.get("workers") or {}).items()}
    assert ended[(2, "1")] == 3 and all(c > 128 for k, c in ended.items() if k != (2, "1")), ended
    assert wait_until(lambda: not leftovers(ssh_hosts, m), 3), leftovers(ssh_hosts, m)
    s = summary(tmp_path / "runs")
    assert s["root_cause"]["host"] == host and s["root_cause"]["exit_code"] == 3
    assert "dying" in "\n".join(s["root_cause"]["last_lines"])


def test_ctrl_c_ends_every_process_on_every_host(ssh_hosts, tmp_path):
    m = marker()
    p = podrun_popen(*ssh_args(ssh_hosts, tmp_path), "--", "sh", "-c", f"echo up $RANK; sleep 60 # {m}")
    try:
        for _ in range(4):
            wait_output(p, "up", 30)
        p.send_signal(signal.SIGINT)
        p.wait(timeout=45)          # below the workers' 60 s sleep; a worker that outlived SIGINT gets SIGTERM at 30 s
        assert p.returncode == 130
        assert wait_until(lambda: not leftovers(ssh_hosts, m), 3), leftovers(ssh_hosts, m)
        assert summary(tmp_path / "runs")["status"] == "interrupted"
    finally:
        end(p)


@pytest.mark.parametrize("bound", [0.5, 1, 2, 3, 5, 7.5, 60])
def test_ssh_keepalive_backstop_is_at_least_twice_the_liveness_bound(bound):
    """OpenSSH ends a connection after ALIVE_COUNT_MAX + 1 unanswered keepalives; that backstop is at least twice the
    liveness bound, so that a silent host is declared lost by podrun's heartbeat (naming the silence) first."""
    from podrun.launch.transports.ssh_common import ALIVE_COUNT_MAX, alive_interval

    interval = alive_interval(bound)
    assert isinstance(interval, int) and interval >= 1 and interval * (ALIVE_COUNT_MAX + 1) >= 2 * bound


@pytest.mark.parametrize("fault,client", [("isolate", "openssh"), ("freeze", "openssh"), ("crash", "openssh"),
                                          ("isolate", "paramiko"), ("crash", "paramiko")])
def test_lost_host_mid_run_is_detected_and_named(make_ssh_hosts, tmp_path, fault, client):
    """Cut h2's link / freeze h2 / kill everything on h2: the run ends within seconds naming h2,
    the other hosts are cleaned up, and nothing survives on h2 either once it is reachable again."""
    hosts = make_ssh_hosts(3)
    m = marker()
    p = podrun_popen(*ssh_args(hosts, tmp_path, client=client), "--keepalive", "3", "--", "sh", "-c", f"echo up $RANK; sleep 60 # {m}")
    try:
        for _ in range(3):
            wait_output(p, "up", 30)
        getattr(hosts, fault)("h2")
        p.wait(timeout=50)          # a hang guard below the workers' 60 s sleep, which would end the run too
        err = p.stderr.read()
        assert p.returncode == 255, err
        assert "instance 1 on h2" in err and "lost" in err, err
        if fault != "crash":        # podrun's heartbeat names the silence before OpenSSH's own keepalive ends ssh
            assert "instance 1 on h2: lost (no heartbeat for 3 s" in err, err
        assert wait_until(lambda: not leftovers(hosts, m, ["h1", "h3"]), 3), leftovers(hosts, m)
        if fault == "freeze":
            hosts.thaw("h2")
        # on the cut-off host, the agent hears no heartbeat (or EOF) on stdin and ends its workers itself
        assert wait_until(lambda: not leftovers(hosts, m, ["h2"]), 8), leftovers(hosts, m, ["h2"])
        s = summary(tmp_path / "runs")
        assert s["exit_code"] == 255 and s["root_cause"]["host"] == "h2"
        if fault != "crash":        # silence, not an EOF: declared only once the --keepalive bound had passed
            gap = {x["host"]: x["max_heartbeat_gap_s"] for x in s["instances"]}["h2"]
            assert gap >= s["heartbeat"]["bound_s"] == 3.0, s["instances"]
    finally:
        end(p)


@CLIENTS
def test_unreachable_host_at_preflight_starts_nothing(make_ssh_hosts, tmp_path, client):
    hosts = make_ssh_hosts(2)
    hosts.stop_sshd("h2")
    m = marker()
    cp = podrun(*ssh_args(hosts, tmp_path, client=client), "--", "sh", "-c", f"sleep 30 # {m}")
    assert cp.returncode == 2, cp.stderr
    assert "h2: unreachable" in cp.stderr and "h1:" not in cp.stderr and "Traceback" not in cp.stderr
    assert not leftovers(hosts, m, ["h1"])
    assert summary(tmp_path / "runs")["status"] == "preflight_failed"


@CLIENTS
def test_wrong_key_fails_preflight_naming_every_host(ssh_hosts, tmp_path, client):
    cfg = tmp_path / "ssh_config"
    cfg.write_text(Path(ssh_hosts.ssh_config_path).read_text().replace(ssh_hosts.key_path, ssh_hosts.wrong_key_path))
    cp = podrun(*ssh_args(ssh_hosts, tmp_path, config=str(cfg), n=2, client=client), "--", "true")
    assert cp.returncode == 2, cp.stderr
    for h in ssh_hosts.hosts[:2]:
        assert f"{h}: authentication failed for root@" in cp.stderr
    assert "IdentityFile" in cp.stderr


@CLIENTS
def test_unknown_and_wrong_host_keys_are_rejected_unless_opted_out(ssh_hosts, tmp_path, client):
    cp = podrun(*ssh_args(ssh_hosts, tmp_path, config=ssh_hosts.ssh_config_unknown_path, n=2, client=client),
                "--", "true")
    assert cp.returncode == 2 and f"{ssh_hosts.hosts[0]}: unknown host key" in cp.stderr, cp.stderr
    assert "--no-host-key-check" in cp.stderr
    cp = podrun(*ssh_args(ssh_hosts, tmp_path, config=ssh_hosts.ssh_config_wrong_host_key_path, n=2, client=client),
                "--", "true")
    assert cp.returncode == 2 and "host key mismatch" in cp.stderr, cp.stderr
    cp = podrun(*ssh_args(ssh_hosts, tmp_path, "--no-host-key-check", config=ssh_hosts.ssh_config_unknown_path, n=2,
                          client=client), "--", "echo", "accepted")
    assert cp.returncode == 0 and cp.stdout.count("accepted") == 2, cp.stderr


def test_missing_workdir_or_python_fails_preflight_on_every_host_and_starts_nothing(ssh_hosts, tmp_path):
    """The held agents are the probes: a missing working directory or python is named per host, exit 2."""
    m = marker()
    cp = podrun(*ssh_args(ssh_hosts, tmp_path, "--workdir", str(tmp_path / "nowhere"), n=2), "--", "sh", "-c",
                f"sleep 30 # {m}")
    assert cp.returncode == 2 and "Traceback" not in cp.stderr, cp.stderr
    for h in ssh_hosts.hosts[:2]:
        assert f"{h}: working directory {tmp_path / 'nowhere'} does not exist" in cp.stderr, cp.stderr
    args = ssh_args(ssh_hosts, tmp_path, n=2)
    args[args.index("--python") + 1] = "/opt/no-such-python"
    cp = podrun(*args, "--", "sh", "-c", f"sleep 30 # {m}")
    assert cp.returncode == 2 and "python /opt/no-such-python not found" in cp.stderr, cp.stderr
    assert not leftovers(ssh_hosts, m, ssh_hosts.hosts[:2])


def test_busy_rendezvous_port_on_the_master_host(ssh_hosts, tmp_path):
    port = next(_port)
    h1 = ssh_hosts.hosts[0]
    listener = ssh_hosts.popen(h1, [sys.executable, "-c",
                                    f"import socket,time; s=socket.socket(); s.bind(('', {port})); s.listen(); "
                                    "print('ok', flush=True); time.sleep(60)"], stdout=__import__("subprocess").PIPE,
                               text=True)
    try:
        assert listener.stdout.readline().strip() == "ok"
        args = ssh_args(ssh_hosts, tmp_path, n=2)
        args[args.index("--master-port") + 1] = str(port)
        cp = podrun(*args, "--", "echo", "never")
        assert cp.returncode == 2, cp.stderr
        assert f"{h1}: rendezvous port {port} is in use" in cp.stderr and "never" not in cp.stdout
    finally:
        listener.kill()
        listener.wait()


def test_dry_run_over_ssh_connects_to_nothing(tmp_path):
    cp = podrun("launch", "--hosts", "node1,node2", "--devices-per-host", "1", "--dry-run", "--runs-dir",
                str(tmp_path / "runs"), "--run-id", "x", "--", "python", "train.py")
    assert cp.returncode == 0, cp.stderr
    assert "via ssh" in cp.stdout and "# host node2: runs" in cp.stdout
    assert "--heartbeat 0.25 --instance 1 --stdin-timeout 5 --agent-store --hold -- python train.py" in cp.stdout
    assert "MASTER_PORT=29500" in cp.stdout and "MASTER_PORT=29501" not in cp.stdout    # every worker, rank 0 too


def test_two_instances_per_host_share_one_connection(ssh_hosts, tmp_path):
    args = ssh_args(ssh_hosts, tmp_path, n=2)
    args[args.index("--devices-per-host") + 1] = "2"
    cp = podrun(*args, "--instances-per-host", "2", "--", "sh", "-c", "echo rank=$RANK group=$GROUP_RANK on $(hostname)")
    assert cp.returncode == 0, cp.stderr
    h1, h2 = ssh_hosts.hosts[:2]
    for i, h in enumerate([h1, h1, h2, h2]):
        assert f"[{i} {h}] rank={i} group={i} on {h}" in cp.stdout, cp.stdout


def _config(hosts, tmp_path, name, **opts) -> str:
    """The harness's ssh config with some options changed (opts: config keyword -> value; None drops it)."""
    text = Path(hosts.ssh_config_path).read_text()
    lines = []
    for line in text.splitlines():
        key = line.strip().split(" ", 1)[0]
        if key in opts:
            if opts[key] is not None:
                lines.append(f"  {key} {opts.pop(key)}")
            continue
        lines.append(line)
    lines += [f"  {k} {v}" for k, v in opts.items() if v is not None]
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return str(p)


@CLIENTS
def test_accept_new_saves_unknown_host_keys_and_refuses_a_changed_one_later(ssh_hosts, tmp_path, client):
    """StrictHostKeyChecking accept-new, as OpenSSH: the first run saves each host's key to the
    UserKnownHostsFile, a later run with a changed key in that file is refused. (paramiko also creates the
    file's folder; OpenSSH's client does not, so there it exists.)"""
    known = tmp_path / "ssh" / "known_hosts"
    if client == "openssh":
        known.parent.mkdir(mode=0o700)
    cfg = _config(ssh_hosts, tmp_path, "cfg", StrictHostKeyChecking="accept-new", UserKnownHostsFile=str(known))
    cp = podrun(*ssh_args(ssh_hosts, tmp_path, config=cfg, n=2, client=client), "--", "echo", "accepted")
    assert cp.returncode == 0 and cp.stdout.count("accepted") == 2, cp.stderr
    saved = known.read_text().splitlines()
    real = Path(ssh_hosts.known_hosts_path).read_text()
    for h in ssh_hosts.hosts[:2]:
        key = " ".join(next(l for l in real.splitlines() if l.startswith(f"{h},")).split()[1:3])
        assert f"{ssh_hosts.address(h)} {key}" in saved, (h, saved)
    if client == "paramiko":        # OpenSSH's client writes it with the user's umask
        assert oct(known.stat().st_mode & 0o777) == "0o600"
    cp = podrun(*ssh_args(ssh_hosts, tmp_path, config=cfg, n=2, client=client), "--", "echo", "again")
    assert cp.returncode == 0 and cp.stdout.count("again") == 2, cp.stderr
    assert known.read_text().splitlines() == saved           # known now: nothing appended
    wrong = Path(ssh_hosts.known_hosts_wrong_path).read_text().split("\n")[0].split()[1:3]
    known.write_text("".join(f"{line.split()[0]} {' '.join(wrong)}\n" for line in saved))
    cp = podrun(*ssh_args(ssh_hosts, tmp_path, config=cfg, n=2, client=client), "--", "echo", "changed")
    assert cp.returncode == 2 and "host key mismatch" in cp.stderr and "changed" not in cp.stdout, cp.stderr


def test_global_known_hosts_file_is_read_by_default(ssh_hosts, tmp_path, monkeypatch):
    """With no GlobalKnownHostsFile in the config, the system's known hosts (OpenSSH's default files) count."""
    from podrun.launch.transports import ssh as ssh_transport

    cfg = _config(ssh_hosts, tmp_path, "cfg", UserKnownHostsFile="/dev/null", GlobalKnownHostsFile=None)
    import paramiko

    c = paramiko.SSHConfig.from_path(cfg).lookup(ssh_hosts.hosts[0])
    assert ssh_transport.known_hosts_files(c)[1] == ["/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2"]
    # the same lookup with the system file put elsewhere (the machine's /etc/ssh is not the test's to write)
    monkeypatch.setattr(ssh_transport, "GLOBAL_KNOWN_HOSTS", ssh_hosts.known_hosts_path)
    from podrun.cli.options import resolve_plan
    from podrun.launch.options import LaunchOptions, TransportOptions
    from podrun.launch.run import build_request
    from podrun.launch.request import SSHOptions

    plan, *_ = resolve_plan(None, hosts_opt=ssh_hosts.hosts[0], devices_per_host=1)
    req = build_request(plan, ["true"], transport="ssh", runs_dir=str(tmp_path / "runs"),
                        options=LaunchOptions(transports=TransportOptions(ssh=SSHOptions(config_path=cfg))))
    t = ssh_transport.SSHTransport(req)
    try:
        client = t._connect(ssh_hosts.hosts[0])
        assert client.get_transport().is_active()
    finally:
        t.close()
    monkeypatch.setattr(ssh_transport, "GLOBAL_KNOWN_HOSTS", "/dev/null")
    t = ssh_transport.SSHTransport(req)
    try:
        with pytest.raises(paramiko.SSHException, match="known_hosts"):
            t._connect(ssh_hosts.hosts[0])
    finally:
        t.close()


SLOW_READERS = '''
import threading, time
_start = threading.Thread.start
def start(self):
    if getattr(getattr(self, "_target", None), "__name__", "") == "_reader":
        time.sleep(1.0)          # the fault: each output reader's thread is slow to start, as on a saturated machine
    _start(self)
threading.Thread.start = start
'''


@CLIENTS
def test_slow_reader_starts_do_not_cost_the_agents_their_heartbeats(ssh_hosts, tmp_path, client):
    """A fault injected into the controller (a sitecustomize on its PYTHONPATH): each thread that reads a host's
    output takes 1 s to start, as 64 of them took 8.9 s on a saturated machine. The agents count their
    controller's silence from the go (--keepalive 2): the heartbeats must not wait behind those 4 s of starts,
    so the run ends 0 with every instance ok and no agent reporting its controller lost."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_READERS)
    pythonpath = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    cp = podrun(*ssh_args(ssh_hosts, tmp_path, "--keepalive", "2", client=client), "--",
                "sh", "-c", "sleep 4; echo finished $RANK", env={"PYTHONPATH": pythonpath}, timeout=120)
    assert cp.returncode == 0, cp.stderr[-3000:]
    assert sorted(l.split("] ", 1)[1] for l in cp.stdout.splitlines() if "finished" in l) == \
        [f"finished {r}" for r in range(4)], cp.stdout
    s = summary(tmp_path / "runs")
    assert all(i["status"] == "ok" for i in s["instances"]), s["instances"]
    assert "controller" not in cp.stderr, cp.stderr[-3000:]
