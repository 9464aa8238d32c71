"""The snapshot writer thread's CPU per update (copy and MAC) with the Poly1305 seal against HMAC-SHA256, interleaved;
and a loop's step time with either seal and without snapshots, interleaved in one process.

    python -m bench seal            (--quick: fewer repeats)

Thread CPU time (time.thread_time) around one synchronous slot write of the resnet18 (cifar stem) state with SGD
momentum, so that load from other processes, which stretches wall time, hardly moves it; the same write through
the file (a write() per megabyte, the writer's former copy) against its copy into the slot's kept mapping; and the
copy alone.
"""
from __future__ import annotations

import statistics
import time
import uuid
from pathlib import Path


def run(quick: bool) -> list[dict]:
    import os
    import secrets

    import numpy as np
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
    cpu: dict[str, list[float]] = {snapshot.POLY1305: [], snapshot.HMAC_SHA256: [], "copy": [], "write()": []}
    w = snapshot.Writer(d)
    real = snapshot._poly1305              # set to a stand-in that says no Poly1305 for HMAC
    try:
        kind, pieces, size = w._encode(state)
        w._write(0, 0, state)                     # the slot's pages exist, as after a run's first update
        w._write(1, 0, state)
        for i in range(repeats):                  # interleaved: each repeat writes with each MAC and copies alone
            for mac in (snapshot.POLY1305, snapshot.HMAC_SHA256):
                snapshot._poly1305 = real if mac == snapshot.POLY1305 else (lambda: None)
                t = time.thread_time()
                w._write(i % 2, i, state)
                cpu[mac].append(time.thread_time() - t)
                assert w.error is None, w.error
            snapshot._poly1305 = real
            w._mapped = lambda k, size: None          # the former copy: through the file, a write() per megabyte
            t = time.thread_time()
            w._write(i % 2, i, state)
            cpu["write()"].append(time.thread_time() - t)
            del w._mapped
            t = time.thread_time()
            _, pieces, size = w._encode(state)
            dst, at = w._mapped(i % 2, size), 0
            for piece in pieces:
                view = memoryview(piece).cast("B")
                dst[at:at + view.nbytes] = np.frombuffer(view, np.uint8)
                at += view.nbytes
            del dst
            cpu["copy"].append(time.thread_time() - t)
    finally:
        snapshot._poly1305 = real
        w.close()
        snapshot.remove(d)
    steps = _steps(quick)
    med = {k: statistics.median(v) * 1000 for k, v in cpu.items()}
    what = f"snapshot slot write, resnet18 (cifar stem) + SGD momentum, {size / 1e6:.1f} MB, writer thread CPU"
    note = (f"median of {repeats} interleaved writes each (time.thread_time); the copy alone (layout and copy of "
            f"each tensor into the slot's mapping, no MAC) {med['copy']:.1f} ms")
    return [{"benchmark": what, "subject": "Poly1305 seal (one-time key from the run key)",
             "value": med[snapshot.POLY1305], "peer": "HMAC-SHA256 over every byte", "peer_value": med[snapshot.HMAC_SHA256],
             "ratio": med[snapshot.POLY1305] / med[snapshot.HMAC_SHA256], "unit": "ms", "note": note},
            {"benchmark": what, "subject": "Poly1305 seal, the copy into the slot's kept mapping",
             "value": med[snapshot.POLY1305], "peer": "Poly1305 seal, the copy through write() (the former)",
             "peer_value": med["write()"], "ratio": med[snapshot.POLY1305] / med["write()"], "unit": "ms",
             "note": note},
            *steps]


def _steps(quick: bool) -> list[dict]:
    """Step time of a plain loop (the resnet18_cifar10 recipe's model, optimizer, global batch and image size: cifar
    stem, SGD momentum, batch 64 at 32 px, on this process's threads) with a snapshot after every update sealed by Poly1305, by HMAC-SHA256, and with none, interleaved in rounds of
    ``n`` steps each (the writer's wait in the optimizer's step pre-hook, as in the runner)."""
    import os
    import uuid

    import torch

    from podrun.models import build
    from podrun.runtime import snapshot
    from podrun.specs import load_recipe
    from podrun.train.optim import build_optimizer

    torch.manual_seed(0)
    model = build("resnet18", 10, stem="cifar", norm="batch")
    opt = build_optimizer(model, "sgd", 0.025, momentum=0.9, weight_decay=5e-4, nesterov=True)
    recipe = load_recipe("resnet18_cifar10")
    batch, px = recipe.global_batch, recipe.dataset.image_size
    x, y = torch.randn(batch, 3, px, px), torch.randint(0, 10, (batch,))
    d = Path("/dev/shm") / f"podrun-bench-{uuid.uuid4().hex[:8]}" / "host"
    w = snapshot.Writer(d, key=os.environ["PODRUN_SNAPSHOT_KEY"])
    rounds, n = (2, 5) if quick else (4, 8)
    times: dict[str, list[float]] = {"none": [], snapshot.POLY1305: [], snapshot.HMAC_SHA256: []}
    real = snapshot._poly1305              # set to a stand-in that says no Poly1305 for HMAC
    step = 0
    try:
        for _ in range(rounds):
            for mode in times:
                snapshot._poly1305 = (lambda: None) if mode == snapshot.HMAC_SHA256 else real
                for i in range(n + 1):                 # the first of each round warms the mode up, not counted
                    t = time.perf_counter()
                    torch.nn.functional.cross_entropy(model(x), y).backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    step += 1
                    if mode != "none":
                        w.submit(step, {"model": snapshot.freeze(model), "optimizer": opt.state_dict()})
                    if i > 0:
                        times[mode].append(time.perf_counter() - t)
                w.wait()
    finally:
        snapshot._poly1305 = real
        w.close()
        snapshot.remove(d)
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    note = (f"median of {rounds} interleaved rounds x {n} steps each, {torch.get_num_threads()} threads; a step is "
            "forward, backward, the optimizer step (which waits for the previous update's write) and the submit")
    what = f"loop step time, resnet18 (cifar stem) {px}px, batch {batch} (the recipe's), snapshot after every update"
    return [{"benchmark": what, "subject": "Poly1305 seal", "value": med[snapshot.POLY1305], "peer": "no snapshot",
             "peer_value": med["none"], "ratio": med[snapshot.POLY1305] / med["none"], "unit": "ms", "note": note},
            {"benchmark": what, "subject": "HMAC-SHA256 (the former seal)", "value": med[snapshot.HMAC_SHA256],
             "peer": "no snapshot", "peer_value": med["none"], "ratio": med[snapshot.HMAC_SHA256] / med["none"],
             "unit": "ms", "note": note}]


if __name__ == "__main__":
    from bench.rows import run_alone

    run_alone(run)
