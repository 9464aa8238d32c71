"""The store relay (podrun.launch.relay) and the held agent (--hold): real sockets, real TCPStore, real agents."""
from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from podrun.launch import protocol
from podrun.launch.agent import Agent, start_relay
from podrun.launch.relay import StoreRelay
from tests.launch.helpers import local_pids, marker, podrun, wait_until
from tests.launch.test_agent import _request
from tests.ports import free_port

pytestmark = pytest.mark.timeout(60)


def _echo_server(port: int, ready: threading.Event, upper: bool = True) -> socket.socket:
    srv = socket.create_server(("127.0.0.1", port))

    def serve():
        ready.set()
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return

            def one(c=c):
                with c:
                    while data := c.recv(1 << 16):
                        c.sendall(data.upper() if upper else data)
            threading.Thread(target=one, daemon=True).start()
    threading.Thread(target=serve, daemon=True).start()
    return srv


def _recv_exactly(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        assert chunk, f"connection closed after {len(buf)} of {n} bytes"
        buf += chunk
    return bytes(buf)


def test_relay_accepts_before_the_store_exists_and_joins_when_it_listens():
    """Connections made while nothing listens behind the relay are accepted (no refusal, so no client
    backoff); what they sent is delivered once the server is up, and the answers come back."""
    p = free_port(2)
    relay = StoreRelay(p, "127.0.0.1", p + 1).start()
    try:
        early = [socket.create_connection(("127.0.0.1", p), timeout=5) for _ in range(3)]
        for i, c in enumerate(early):
            c.sendall(f"hello {i}".encode())
        time.sleep(0.2)                                       # the server is still not there
        ready = threading.Event()
        srv = _echo_server(p + 1, ready)
        for i, c in enumerate(early):
            assert _recv_exactly(c, 7) == f"HELLO {i}".encode()
        late = socket.create_connection(("127.0.0.1", p), timeout=5)
        late.sendall(b"late")
        assert _recv_exactly(late, 4) == b"LATE"
        assert relay.relayed == 4
        for c in early + [late]:
            c.close()
        srv.close()
    finally:
        relay.close()


def test_relay_passes_large_messages_intact_both_ways():
    p = free_port(2)
    ready = threading.Event()
    srv = _echo_server(p + 1, ready, upper=False)
    relay = StoreRelay(p, "127.0.0.1", p + 1).start()
    try:
        payload = os.urandom(3 << 20)                         # 3 MiB: many partial sends and reads
        c = socket.create_connection(("127.0.0.1", p), timeout=10)
        t = threading.Thread(target=c.sendall, args=(payload,))
        t.start()
        assert _recv_exactly(c, len(payload)) == payload
        t.join()
        c.close()
    finally:
        relay.close()
        srv.close()


def test_relay_passes_on_a_close_from_either_side():
    p = free_port(2)
    srv = socket.create_server(("127.0.0.1", p + 1))
    relay = StoreRelay(p, "127.0.0.1", p + 1).start()
    try:
        c = socket.create_connection(("127.0.0.1", p), timeout=5)
        s, _ = srv.accept()
        s.close()                                             # the store side goes away
        c.settimeout(5)
        assert c.recv(10) == b""                              # ... and the worker sees EOF
        c2 = socket.create_connection(("127.0.0.1", p), timeout=5)
        s2, _ = srv.accept()
        c2.close()                                            # the worker goes away
        s2.settimeout(5)
        assert s2.recv(10) == b""
    finally:
        relay.close()
        srv.close()


_SELF_CONNECT = r"""
import socket, sys, time
from podrun.launch.relay import StoreRelay
Q = int(sys.argv[1])                       # the store's port, the odd lower end of the ephemeral range
relay = StoreRelay(Q - 1, "127.0.0.1", Q).start()
c = socket.create_connection(("127.0.0.1", Q - 1), timeout=5, source_address=("127.0.0.1", Q - 3))
c.sendall(b"ping")
time.sleep(0.3)                            # the relay tries the store every few ms meanwhile
for tries in range(1, 51):
    try:
        srv = socket.create_server(("127.0.0.1", Q))
        break
    except OSError as exc:
        err = exc
        time.sleep(0.002)
else:
    sys.exit(f"the store could not bind {Q}: {err}")
srv.settimeout(5)
a, _ = srv.accept()
assert a.recv(4) == b"ping"
a.sendall(b"PONG")
c.settimeout(5)
print("relayed", c.recv(4).decode(), "bind tries", tries, "relayed", relay.relayed)
"""


@pytest.mark.timeout(30)
def test_relay_does_not_connect_to_itself_while_the_store_port_is_ephemeral(tmp_path):
    """Regression (a CI failure): the relay connects to rank 0's store port over and over until the store
    listens. Where that port lies in the kernel's ephemeral range a connect can be given the port itself as
    its source, and TCP's simultaneous open joins the socket to itself: the relay then held the store's port
    (the store failed with EADDRINUSE) and echoed the client's bytes back to it. Made certain here in a
    network namespace of the test's own whose ephemeral range is the store port and one more: every connect
    before the store is up lands on itself. The relay must refuse those and join the client to the store."""
    q = 40001
    cmd = ["unshare", "--net", "sh", "-c",
           f'ip link set lo up && echo "{q} {q + 1}" > /proc/sys/net/ipv4/ip_local_port_range && '
           f'exec "$0" -c "$1" {q}', sys.executable, _SELF_CONNECT]
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=25, cwd=os.getcwd())
    assert cp.returncode == 0, cp.stdout + cp.stderr
    words = cp.stdout.split()
    assert words[:2] == ["relayed", "PONG"] and words[-1] == "1", cp.stdout


@pytest.mark.torch
def test_tcpstore_clients_reach_rank0_store_through_the_relay_before_it_exists():
    """Real torch TCPStores: two clients connect through the relay before rank 0's store is created;
    rank 0 (world size 3, waiting for its workers) then sees both and the keys flow every way."""
    import torch.distributed as dist

    p = free_port(2)
    relay = StoreRelay(p, "127.0.0.1", p + 1).start()
    td = datetime.timedelta(seconds=20)
    got, errors = {}, []

    def client(r):
        try:
            st = dist.TCPStore("127.0.0.1", p, 3, False, timeout=td)
            st.set(f"k{r}", f"v{r}")
            got[r] = st.get("k0").decode()
        except Exception as exc:  # noqa: BLE001
            errors.append(repr(exc))
    try:
        threads = [threading.Thread(target=client, args=(r,)) for r in (1, 2)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        master = dist.TCPStore("127.0.0.1", p + 1, 3, True, timeout=td)   # rank 0's store, behind the relay
        master.set("k0", "v0")
        for t in threads:
            t.join(20)
        assert not errors, errors
        assert got == {1: "v0", 2: "v0"}
        assert master.get("k1") == b"v1" and master.get("k2") == b"v2"
    finally:
        relay.close()


def test_agent_without_the_port_gives_rank0_the_rendezvous_port_back(tmp_path):
    req = _request(tmp_path, ["true"])
    envs = req.worker_envs(0)
    assert envs[0]["MASTER_PORT"] == str(req.master_port + 1) and envs[0]["PODRUN_STORE_RELAY"]
    out = open(tmp_path / "out", "wb")
    agent = Agent(0, ["true"], envs, grace=1, stdin_watch=False, stdin_timeout=0, out=out)
    with socket.create_server(("", 0)) as taken:
        port = taken.getsockname()[1]
        assert start_relay(agent, "127.0.0.1", port) is None
    out.close()
    assert envs[0]["MASTER_PORT"] == str(port) and "PODRUN_STORE_RELAY" not in envs[0]
    assert "no store relay: cannot listen on port" in (tmp_path / "out").read_text()


def test_busy_store_port_fails_preflight_and_no_relay_keeps_one_port(tmp_path):
    p = free_port(2)
    with socket.create_server(("", p + 1)):
        cp = podrun("launch", "--devices-per-host", "2", "--master-port", str(p), "--runs-dir", str(tmp_path / "r"),
                    "--", "echo", "never")
        assert cp.returncode == 2 and "never" not in cp.stdout, cp.stderr
        assert f"port of rank 0's store (behind the store relay) {p + 1} is in use" in cp.stderr
        assert "Traceback" not in cp.stderr
        cp = podrun("launch", "--devices-per-host", "2", "--master-port", str(p), "--no-store-relay", "--runs-dir",
                    str(tmp_path / "r"), "--", "sh", "-c", "echo port=$MASTER_PORT relay=${PODRUN_STORE_RELAY:-none}")
        assert cp.returncode == 0, cp.stderr
        assert cp.stdout.count(f"port={p} relay=none") == 2, cp.stdout


def _held_agent(tmp_path, m):
    req = _request(tmp_path, ["sh", "-c", f"touch {tmp_path}/started-$RANK; sleep 30 # {m}"])
    return subprocess.Popen(req.agent_argv(0, hold=True), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, bufsize=1)


def _read_until(p, kind: str) -> protocol.Event:
    for line in p.stdout:
        ev = protocol.parse(line.rstrip("\n"))
        if ev.kind == kind:
            return ev
    raise AssertionError(f"the agent ended before a {kind} line")


def test_held_agent_reports_facts_and_starts_nothing_without_a_go(tmp_path):
    """--hold: the agent reports its host's facts (rank 0's agent: the busy ports among both of its
    ports), then ends with exit 0 and no worker started when the controller closes its stdin."""
    m = marker()
    p = _held_agent(tmp_path, m)
    facts = json.loads(_read_until(p, "probe").text)
    import podrun

    assert facts["podrun"] == podrun.__version__ and facts["python"] == ".".join(map(str, sys.version_info[:3]))
    assert len(facts["ports"]) == 2 and facts["ports_busy"] == []
    time.sleep(0.3)
    assert not list(tmp_path.glob("started-*")) and local_pids(m) == [p.pid]      # the agent, and no worker
    p.stdin.close()
    assert p.wait(timeout=10) == 0
    assert not list(tmp_path.glob("started-*"))


def test_held_agent_starts_its_workers_on_go(tmp_path):
    m = marker()
    p = _held_agent(tmp_path, m)
    _read_until(p, "probe")
    p.stdin.write("G")
    p.stdin.flush()
    assert _read_until(p, "start").local_rank == 0
    assert wait_until(lambda: (tmp_path / "started-0").exists(), 10)
    p.stdin.write("T")
    p.stdin.flush()
    assert p.wait(timeout=10) == 128 + 15
    assert wait_until(lambda: local_pids(m) == [], 5)
