"""In-place recovery (podrun.runtime.inplace) over real gloo between processes on loopback: 3 ranks train, rank 2 is
stopped (SIGSTOP: silent, no connection reset, as a cut link) before its part of an update, the two others are told
the new plan while blocked in that update's all-reduce, abandon it, re-form a group of 2 on the same store with the
new share of the same global batch (3 x 4 x GA 1 -> 2 x 3 x GA 2) and go on: every update's loss equals a run without
the failure (relative 1e-5), each update is logged once, and only the update in flight is redone, once. The test
plays the controller (the new plan over each survivor's pipe) and rank 0's store host."""
from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import signal

import pytest

from tests.ports import free_port

# one worker runs both cases under --dist loadgroup, so that the module's run without the failure (``plain``) is
# trained once, not once in each worker that draws a case
pytestmark = [pytest.mark.torch, pytest.mark.timeout(400), pytest.mark.xdist_group("inplace_local")]

GLOBAL, STEPS, STOP_AT = 12, 8, 4      # rank 2 stops before update STOP_AT + 1


def _batch(step: int):
    import torch

    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(GLOBAL, 16, generator=g), torch.randint(0, 4, (GLOBAL,), generator=g)


def _loss(model, x, y):
    import torch

    return torch.nn.functional.cross_entropy(model(x), y)


def _worker(rank: int, world: int, port: int, conn, out, stop_at: int | None, ahead: bool = False) -> None:
    import threading

    import torch
    import torch.distributed as dist

    from podrun.runtime import inplace

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
    group = inplace.Group(store, rank, world, 0)
    t = inplace.Trainer(model, opt, group, inplace.Share(rank, world, GLOBAL // world, 1), GLOBAL, _batch, _loss)
    plans: list = []
    came = threading.Event()

    def listen():                        # the channel the new plan comes over: abandon the group at once
        while True:
            try:
                msg = conn.recv()
            except EOFError:
                return
            plans.append(inplace.NewPlan(**msg))
            t.group.abandon()
            came.set()

    threading.Thread(target=listen, daemon=True).start()
    try:
        while t.step < STEPS:
            if stop_at is not None and t.step == stop_at:
                out.put(("stopping", rank))
                out.close()
                out.join_thread()            # its lines out before it stops (the queue's feeder thread stops too)
                os.kill(os.getpid(), signal.SIGSTOP)
            if ahead and t.step == STOP_AT:  # completes the next update alone (a group of one: the stand-in for
                ahead = False                # the lost peer's last bytes reaching this rank only), then waits
                t.group = inplace.Group(dist.HashStore(), 0, 1, 99)
                out.put(("loss", rank, t.step + 1, t.update()))
                came.wait(120)
                t.group.abandon()
            try:
                loss = t.update()
                out.put(("loss", rank, t.step, loss))
            except inplace.Abandoned:
                came.wait(60)
                at = t.reform(store, plans[-1])
                out.put(("reformed", rank, at, t.share.world, t.share.local_batch, t.share.grad_accum))
        out.put(("done", rank, t.redone))
    finally:
        out.close()
        out.join_thread()
        os._exit(0)                      # an abandoned gloo group is never torn down


def _run(stop: bool, ahead: bool = False) -> list[tuple]:
    import torch.distributed as dist

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,    # noqa: F841 - rank 0's host
                          timeout=datetime.timedelta(seconds=60))
    pipes = [ctx.Pipe() for _ in range(3)]
    procs = [ctx.Process(target=_worker, args=(r, 3, port, pipes[r][1], out, STOP_AT if stop and r == 2 else None,
                                               ahead and r == 1)) for r in range(3)]
    got: list[tuple] = []
    try:
        for p in procs:
            p.start()
        done, told = 0, False
        while done < (2 if stop else 3):
            msg = out.get(timeout=150)
            if os.environ.get("INPLACE_DEBUG"):
                print(msg, flush=True)
            got.append(msg)
            there = {(m[1], m[2]) for m in got if m[0] == "loss"}
            if (not told and any(m[0] == "stopping" for m in got) and (0, STOP_AT) in there
                    and (1, STOP_AT + (1 if ahead else 0)) in there):
                told = True              # both in update STOP_AT + 1, which waits on rank 2: the controller's
                for r in (0, 1):         # re-plan, 2 ranks x 3 x GA 2, told to each survivor
                    pipes[r][0].send({"generation": 1, "rank": r, "world": 2, "local_batch": 3, "grad_accum": 2})
            done += msg[0] == "done"
        return got
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=30)


@pytest.fixture(scope="module")
def plain() -> dict:
    return {(m[1], m[2]): m[3] for m in _run(False) if m[0] == "loss"}


@pytest.mark.parametrize("ahead", [False, True], ids=["in-flight", "one-rank-ahead"])
def test_survivors_recover_in_place_with_the_losses_of_a_run_without_the_failure(plain, ahead):
    """``one-rank-ahead``: rank 1 completed the update in flight (a group of one stands in for the lost peer's last
    bytes reaching it alone) while rank 0 did not: on re-forming they agree on the update both completed, rank 1
    goes back to its state before the other and redoes it with rank 0, and the curve is the same."""
    got = _run(True, ahead)
    losses = [m for m in got if m[0] == "loss"]
    for rank in (0, 1):
        steps = [m[2] for m in losses if m[1] == rank]
        again = [STOP_AT + 1] if ahead and rank == 1 else []            # its lone update, rolled back, redone
        assert steps == [*range(1, STOP_AT + 1), *again, *range(STOP_AT + 1, STEPS + 1)], (rank, steps)
        lone = next(x for x in losses if x[1:3] == (1, STOP_AT + 1)) if ahead else None   # its share's loss only
        for m in losses:
            if m[1] == rank and m is not lone:
                assert m[3] == pytest.approx(plain[(rank, m[2])], rel=1e-5), (m, plain[(rank, m[2])])
    assert sorted(m[1:] for m in got if m[0] == "reformed") == [(0, STOP_AT, 2, 3, 2), (1, STOP_AT, 2, 3, 2)], got
    assert sorted(m[1:] for m in got if m[0] == "done") == [(0, [STOP_AT + 1]), (1, [STOP_AT + 1])], got
    assert [m[2] for m in losses if m[1] == 2] == list(range(1, STOP_AT + 1))
