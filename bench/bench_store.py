"""The agent store (podrun.host.store) on this machine's loopback, each figure against its peer:

- early clients: torch TCPStore clients that connect before the store exists (their `import torch` done);
  seconds from the store serving to every client done, when the port is held from the start (the agent
  store) vs when nothing listens until the store binds it (rank 0 hosting its own store: refused connects,
  torch's backoff);
- store operations once connected: set+get through the agent store (workers talk to the store directly) vs
  a store in another process that bound its own port (what the other ranks dial when rank 0 hosts it); with
  PODRUN_BASELINE=DIR (a checkout of the podrun with the store
  relay) also vs the relay it replaced, in front of the same store.

    python -m bench store
"""
from __future__ import annotations

import datetime
import importlib.util
import os
import statistics
import subprocess
import sys
import time

_CLIENT = r"""
import datetime, sys, time
from torch.distributed import TCPStore
print("ready", flush=True)
s = TCPStore("127.0.0.1", int(sys.argv[1]), None, False, timeout=datetime.timedelta(seconds=60))
s.get("k")
print(repr(time.time()), flush=True)
"""


_OWN = r"""
import datetime, sys
from torch.distributed import TCPStore
s = TCPStore("127.0.0.1", int(sys.argv[1]), None, True, timeout=datetime.timedelta(seconds=60), wait_for_workers=False)
print("up", flush=True)
sys.stdin.read()
"""


def _early(port: int, n: int, serve) -> float:
    """n clients connect (or try to) before the store; ``serve()`` brings it up and returns the time it
    serves; seconds from then until the last client is done."""
    clients = [subprocess.Popen([sys.executable, "-c", _CLIENT, str(port)], stdout=subprocess.PIPE, text=True)
               for _ in range(n)]
    for c in clients:
        assert c.stdout.readline().strip() == "ready"
    time.sleep(0.3)
    up, close = serve()
    try:
        done = [float(c.communicate(timeout=90)[0].strip()) for c in clients]
    finally:
        close()
    return max(done) - up


def _store_on(sock):
    """Serve a store on ``sock`` like the agent does; returns (time it serves, close)."""
    from torch.distributed import TCPStore

    from podrun.host.store import StoreHost

    host = StoreHost(sock)
    assert host.up.wait(60) and host.state == "up", host.state
    TCPStore("127.0.0.1", sock.getsockname()[1], None, False, timeout=datetime.timedelta(seconds=10)).set("k", "v")
    return time.time(), lambda: (host.close(), sock.close())


def _own_store(port: int):
    """A store that binds ``port`` itself once its torch is imported, as rank 0's does; (time it serves, close)."""
    from torch.distributed import TCPStore

    own = subprocess.Popen([sys.executable, "-c", _OWN, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           text=True)
    assert own.stdout.readline().strip() == "up"
    TCPStore("127.0.0.1", port, None, False, timeout=datetime.timedelta(seconds=10)).set("k", "v")
    return time.time(), lambda: (own.kill(), own.wait())


def _ops(store, n: int, value: bytes) -> float:
    """Seconds per set+get pair over n pairs."""
    t = time.perf_counter()
    for i in range(n):
        store.set(f"k{i % 64}", value)
        store.get(f"k{i % 64}")
    return (time.perf_counter() - t) / n


def _baseline_relay(base: str):
    spec = importlib.util.spec_from_file_location("baseline_relay", os.path.join(base, "podrun", "launch", "relay.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.StoreRelay


def run(quick: bool) -> list[dict]:
    import torch.distributed as dist

    from podrun.host.store import StoreHost
    from podrun.wire.probe import listen

    from tests.ports import free_port

    rows = []
    n_clients, repeats = (4, 2) if quick else (8, 5)
    held, unheld = [], []
    for _ in range(repeats):
        sock = listen(0)
        held.append(_early(sock.getsockname()[1], n_clients, lambda: _store_on(sock)))
        port = free_port()
        unheld.append(_early(port, n_clients, lambda: _own_store(port)))
    rows.append({"benchmark": f"{n_clients} early TCPStore clients, loopback", "subject": "agent store (port held "
                 "from the start)", "value": round(statistics.median(held), 4),
                 "peer": "port unheld until the store binds it (rank 0's own store)",
                 "peer_value": round(statistics.median(unheld), 4),
                 "ratio": round(statistics.median(held) / statistics.median(unheld), 3),
                 "unit": "s from the store serving to every client done",
                 "note": f"median of {repeats} interleaved; the clients had imported torch and were connecting "
                         "0.3 s before the store host started (its own torch import in between)"})

    td = datetime.timedelta(seconds=30)
    sock = listen(0)
    p = sock.getsockname()[1]
    host = StoreHost(sock)
    assert host.up.wait(60), host.state
    base = os.environ.get("PODRUN_BASELINE")
    relay = own = None
    try:
        via_agent = dist.TCPStore("127.0.0.1", p, None, False, timeout=td)
        peers = {}
        own_port = free_port(2)
        own = subprocess.Popen([sys.executable, "-c", _OWN, str(own_port)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
        assert own.stdout.readline().strip() == "up"
        peers["a store in another process on its own port (rank 0 hosting it)"] = dist.TCPStore(
            "127.0.0.1", own_port, None, False, timeout=td)
        if base:
            relay = _baseline_relay(base)(own_port + 1, "127.0.0.1", own_port).start()
            peers[f"the store relay it replaced ({base}), in front of that store"] = dist.TCPStore(
                "127.0.0.1", own_port + 1, None, False, timeout=td)
        n, reps = (300, 3) if quick else (2000, 7)
        for size in (16, 64 * 1024):
            value = b"x" * size
            ours, theirs = [], {k: [] for k in peers}
            for _ in range(reps):
                ours.append(_ops(via_agent, n, value))
                for k, st in peers.items():
                    theirs[k].append(_ops(st, n, value))
            o = statistics.median(ours)
            for k in peers:
                d = statistics.median(theirs[k])
                rows.append({"benchmark": f"TCPStore set+get, {size} B values, loopback",
                             "subject": "agent store (served on the held socket)", "value": round(o * 1e6, 1),
                             "peer": k, "peer_value": round(d * 1e6, 1), "ratio": round(o / d, 3),
                             "unit": "us per set+get", "note": f"median of {reps} interleaved repeats of {n} pairs"})
    finally:
        if relay is not None:
            relay.close()
        if own is not None:
            own.kill()
            own.wait()
        host.close()
        sock.close()
    return rows


if __name__ == "__main__":
    from bench.rows import run_alone

    run_alone(run)
