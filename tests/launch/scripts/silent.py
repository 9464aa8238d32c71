"""A healthy run that prints nothing for a long stretch (torch.distributed, gloo), for the hang watch's tests.

Every rank prints "started", then is silent for --seconds:
  busy   every rank computes (CPU-bound, inside one C call per pass: its stack stays on one line)
  idle   rank 0 computes; rank 1 waits in select() on a pipe nobody writes (an I/O wait) that rank 0 does not
         wait for; rank 1 then waits in all_reduce for rank 0 to finish
then all ranks all_reduce once and print "done rank R".
"""
import argparse
import os
import select
import time

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["busy", "idle"], required=True)
    ap.add_argument("--seconds", type=float, required=True)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"started rank {rank}", flush=True)
    end = time.monotonic() + args.seconds
    if args.mode == "idle" and rank == 1:
        r, _ = os.pipe()
        select.select([r], [], [], args.seconds - 1)  # IDLE
    else:
        while time.monotonic() < end: sum(range(10 ** 6))  # BUSY
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"done rank {rank} sum {int(t[0].item())}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
