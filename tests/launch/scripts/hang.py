"""A plain two-rank gloo script that stops at step STOP in one rank, in one of several ways (--mode).

Each step prints a line and does one all_reduce; rank --odd stalls at --stop:
  sleep      time.sleep in the training loop
  lock       a deadlock: the main thread waits on a lock a second thread holds while it waits on the first
  skip       the rank skips one all_reduce (the others wait in theirs; it waits in the next barrier)
  loader     a DataLoader worker process is stuck, and the rank waits for its batch
  slow       no stall: every step takes --every seconds (slow but moving)
With --until FILE the loop goes on past --steps until FILE exists (seen by any rank), so that a test can look
at a live run without racing its end.
Lines marked "# STALL-<mode>" are where each mode stops; the tests look those lines up.
"""
from __future__ import annotations

import argparse
import os
import threading
import time

import torch
import torch.distributed as dist


class Stuck(torch.utils.data.Dataset):
    def __len__(self):
        return 1000

    def __getitem__(self, i):
        if i >= 5:   # the rank gets items 0-4 (steps 0-4), then waits at step 5
            time.sleep(3600)  # STALL-loader
        return torch.zeros(1)


def deadlock():
    """The main thread holds a and waits for b; a second thread holds b and waits for a."""
    a, b = threading.Lock(), threading.Lock()
    b_taken = threading.Event()
    a.acquire()

    def other():
        b.acquire()
        b_taken.set()
        a.acquire()  # STALL-lock-thread

    threading.Thread(target=other, daemon=True).start()
    b_taken.wait()
    b.acquire()  # STALL-lock


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="sleep")
    ap.add_argument("--stop", type=int, default=5)
    ap.add_argument("--odd", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--every", type=float, default=0.05)
    ap.add_argument("--until", default=None, help="go on past --steps until this file exists")
    ap.add_argument("--tag", default="", help="ignored: a marker for the test to find the processes by")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loader = None
    if args.mode == "loader" and rank == args.odd:
        loader = iter(torch.utils.data.DataLoader(Stuck(), batch_size=1, num_workers=1))
    step = -1
    while True:
        step += 1
        time.sleep(args.every)
        if rank == args.odd and step == args.stop:
            if args.mode == "sleep":
                time.sleep(3600)  # STALL-sleep
            elif args.mode == "lock":
                deadlock()
            elif args.mode == "skip":
                dist.barrier()  # STALL-skip
            elif args.mode == "loader":
                pass
        if loader is not None:
            next(loader)  # STALL-loader-rank
        t = torch.tensor([1.0, float(args.until is not None and os.path.exists(args.until))])
        dist.all_reduce(t)  # STALL-others
        print(f"step {step} rank {rank} sum {int(t[0].item())}", flush=True)
        if step + 1 >= args.steps and (args.until is None or t[1].item() > 0):
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
