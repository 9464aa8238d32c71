"""A torchrun-style gloo worker that all-reduces a small tensor in a loop, quietly, for --seconds.

Prints "up <rank>" after the first all-reduce and "done <rank> <count>" at the end, nothing between,
so that while it runs only heartbeats tell podrun its hosts are alive. The ranks stop together: each
all-reduce carries whether a rank's time is up (ranks that each read their own clock can stop one
all-reduce apart, one in the barrier and another in an all-reduce that never completes: a hang, seen in
a CI rehearsal under load). The process group's timeout is gloo's default (30 minutes): a peer that
vanishes leaves the others blocked in all_reduce until podrun ends them. A restarted attempt
(PODRUN_RESTART_COUNT > 0) loops for 2 s at most. Other arguments (a marker, to find the processes)
are ignored.
"""
import os
import sys
import time

import torch
import torch.distributed as dist

args = sys.argv[1:]
seconds = float(args[args.index("--seconds") + 1])
if os.environ.get("PODRUN_RESTART_COUNT", "0") != "0":     # a restarted attempt (an elastic re-plan) ends soon
    seconds = min(seconds, 2.0)
dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
t = torch.ones(1025)          # the last element: 1 from each rank whose time is up
dist.all_reduce(t)
print(f"up {rank}", flush=True)
end, n = time.monotonic() + seconds, 1
while True:                   # every rank stops after the same all-reduce: the first one a rank's time was up in
    time.sleep(0.05)
    t.fill_(1.0)
    t[-1] = float(time.monotonic() >= end)
    dist.all_reduce(t)
    n += 1
    if t[-1].item() > 0:
        break
dist.barrier()
print(f"done {rank} {n} world {os.environ['WORLD_SIZE']}", flush=True)
dist.destroy_process_group()
