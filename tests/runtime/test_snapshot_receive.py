"""The snapshot a rank receives from another (podrun.runtime.snapshot.recover) over real torch.distributed (gloo, two
processes on loopback): it is used only when its MAC matches under the receiver's own key of the run; one sent
under another key is refused, and the receiver keeps nothing of it."""
from __future__ import annotations

import multiprocessing as mp
import uuid
from pathlib import Path

import pytest

from tests.ports import free_port

pytestmark = pytest.mark.timeout(120)


def _rank(rank: int, port: int, dirs: list[str], keys: list[str], out) -> None:
    import os

    import torch
    import torch.distributed as dist

    from podrun.runtime import snapshot

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        w = snapshot.Writer(dirs[rank], key=keys[rank])
        if rank == 0:                          # rank 0 holds update 3; rank 1 holds none and is sent it
            w.submit(3, {"w": torch.arange(8.0)})
            w.wait()
        try:
            got = snapshot.recover(w, -1)
            out.put((rank, "used", got.step, got.state["w"].tolist(), snapshot.held(dirs[rank])))
        except snapshot.SnapshotError as exc:
            out.put((rank, "refused", str(exc), None, snapshot.held(dirs[rank])))
    finally:
        dist.destroy_process_group()


def _recover(keys: list[str]) -> dict[int, tuple]:
    base = Path("/dev/shm") / f"podrun-test-{uuid.uuid4().hex[:12]}"
    dirs = [str(base / "h0"), str(base / "h1")]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, dirs, keys, out)) for r in (0, 1)]
    try:
        for p in procs:
            p.start()
        got = {}
        for _ in procs:
            r = out.get(timeout=90)
            got[r[0]] = r[1:]
        for p in procs:
            p.join(timeout=30)
        return got
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        from podrun.runtime import snapshot

        snapshot.remove(base)


def test_a_received_snapshot_is_used_only_under_the_receivers_key():
    key = uuid.uuid4().hex
    same = _recover([key, key])
    assert same[1][:3] == ("used", 3, [float(i) for i in range(8)]) and same[1][3] == [(3, 0)], same
    other = _recover([key, uuid.uuid4().hex])
    assert other[1][0] == "refused" and "received from rank 0 does not match its MAC" in other[1][1], other
    assert other[1][3] == [], other          # nothing of it kept for a later attempt
