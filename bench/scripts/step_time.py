"""A gloo loop for the hang bench: STEPS steps of an all_reduce of N floats and a little compute, each
reported through podrun.runtime (a no-op under torchrun) unless REPORT is 0; rank 0 prints the median
step time in ms."""
import statistics
import sys
import time

import torch
import torch.distributed as dist

from podrun import runtime

steps, n = int(sys.argv[1]), int(sys.argv[2])
report = sys.argv[3] != "0" if len(sys.argv) > 3 else True
dist.init_process_group("gloo")
x = torch.ones(n)
w = torch.randn(256, 256)
times = []
for step in range(1, steps + 1):
    t0 = time.perf_counter()
    for _ in range(4):
        w = torch.tanh(w @ w * 0.01)
    dist.all_reduce(x)
    if report:
        runtime.report(step=step, total=steps, loss=float(w[0, 0]), step_seconds=time.perf_counter() - t0)
    times.append(time.perf_counter() - t0)
if dist.get_rank() == 0:
    print(f"STEP_MS {statistics.median(times[steps // 10:]) * 1000:.4f}", flush=True)
dist.destroy_process_group()
