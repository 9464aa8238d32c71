"""The store relay's cost once a run is going: torch TCPStore round trips through podrun.launch.relay
against the same store dialled directly, side by side (interleaved), on this machine's loopback.

    python -m bench relay
"""
from __future__ import annotations

import datetime
import statistics
import time


def _ops(store, n: int, value: bytes) -> float:
    """Seconds per set+get pair over n pairs."""
    t = time.perf_counter()
    for i in range(n):
        store.set(f"k{i % 64}", value)
        store.get(f"k{i % 64}")
    return (time.perf_counter() - t) / n


def run(quick: bool) -> list[dict]:
    import torch.distributed as dist

    from podrun.launch.relay import StoreRelay

    from tests.ports import free_port

    p = free_port(2)
    td = datetime.timedelta(seconds=30)
    master = dist.TCPStore("127.0.0.1", p + 1, 1, True, timeout=td, wait_for_workers=False)
    relay = StoreRelay(p, "127.0.0.1", p + 1).start()
    rows = []
    try:
        direct = dist.TCPStore("127.0.0.1", p + 1, 1, False, timeout=td)
        relayed = dist.TCPStore("127.0.0.1", p, 1, False, timeout=td)
        n, repeats = (300, 3) if quick else (2000, 7)
        for size in (16, 64 * 1024):
            value = b"x" * size
            ours, peer = [], []
            for _ in range(repeats):
                ours.append(_ops(relayed, n, value))
                peer.append(_ops(direct, n, value))
            o, d = statistics.median(ours), statistics.median(peer)
            rows.append({"benchmark": f"TCPStore set+get, {size} B values, loopback",
                         "subject": "through the store relay", "value": round(o * 1e6, 1),
                         "peer": "the same store dialled directly", "peer_value": round(d * 1e6, 1),
                         "ratio": round(o / d, 3), "unit": "us per set+get",
                         "note": f"median of {repeats} interleaved repeats of {n} pairs; the relay is one Python "
                                 "thread; it carries only store traffic (gloo and NCCL connect peer to peer)"})
    finally:
        relay.close()
        del master                     # rank 0's store, kept alive until here
    return rows


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
