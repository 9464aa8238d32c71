"""The snapshot writer thread's CPU per update (copy and MAC) with the Poly1305 seal against HMAC-SHA256, interleaved.

    python -m bench seal            (--quick: fewer repeats)

Thread CPU time (time.thread_time) around one synchronous slot write of the resnet18 (cifar stem) state with SGD
momentum, so that load from other processes, which stretches wall time, hardly moves it; and the copy alone.
"""
from __future__ import annotations

import statistics
import time
import uuid
from pathlib import Path


def run(quick: bool) -> list[dict]:
    import os
    import secrets

    import torch

    from podrun.models import build
    from podrun.runtime import snapshot
    from podrun.train.optim import build_optimizer
    from podrun.wire.worker_env import SNAPSHOT_KEY_NAME

    os.environ.setdefault(SNAPSHOT_KEY_NAME, secrets.token_hex(32))
    model = build("resnet18", 10, stem="cifar", norm="batch")
    opt = build_optimizer(model, "sgd", 0.1, momentum=0.9, weight_decay=5e-4, nesterov=True)
    model(torch.randn(4, 3, 16, 16)).square().mean().backward()
    opt.step()
    state = {"model": snapshot.freeze(model), "optimizer": opt.state_dict()}
    d = Path("/dev/shm") / f"podrun-bench-{uuid.uuid4().hex[:8]}" / "host"
    repeats = 4 if quick else 12
    cpu: dict[str, list[float]] = {snapshot.POLY1305: [], snapshot.HMAC_SHA256: [], "copy": []}
    w = snapshot.Writer(d)
    saved = list(snapshot._POLY)
    try:
        kind, pieces, size = w._encode(state)
        w._write(0, 0, state)                     # the slot's pages exist, as after a run's first update
        w._write(1, 0, state)
        for i in range(repeats):                  # interleaved: each repeat writes with each MAC and copies alone
            for mac in (snapshot.POLY1305, snapshot.HMAC_SHA256):
                snapshot._POLY[:] = [] if mac == snapshot.POLY1305 else [None]
                t = time.thread_time()
                w._write(i % 2, i, state)
                cpu[mac].append(time.thread_time() - t)
                assert w.error is None, w.error
            t = time.thread_time()
            _, pieces, _ = w._encode(state)
            with w._open_data(i % 2) as f:
                for piece in pieces:
                    f.write(piece)
            cpu["copy"].append(time.thread_time() - t)
    finally:
        snapshot._POLY[:] = saved
        w.close()
        snapshot.remove(d)
    med = {k: statistics.median(v) * 1000 for k, v in cpu.items()}
    what = f"snapshot slot write, resnet18 (cifar stem) + SGD momentum, {size / 1e6:.1f} MB, writer thread CPU"
    note = (f"median of {repeats} interleaved writes each (time.thread_time); the copy alone (layout and write of "
            f"each tensor, no MAC) {med['copy']:.1f} ms")
    return [{"benchmark": what, "subject": "Poly1305 seal (one-time key from the run key)",
             "value": med[snapshot.POLY1305], "peer": "HMAC-SHA256 over every byte", "peer_value": med[snapshot.HMAC_SHA256],
             "ratio": med[snapshot.POLY1305] / med[snapshot.HMAC_SHA256], "unit": "ms", "note": note}]


if __name__ == "__main__":
    from bench.rows import run_alone

    run_alone(run)
