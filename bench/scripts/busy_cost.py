"""One rank of a 2-rank DDP loop over gloo (argv: MODE STEPS, MODE "hook": the busy clock on, "split": the
clock's every stamp of the step split as the recipes' runner takes them (podrun.runtime.steps.StepClock both),
"plain": DDP's built-in all-reduce, no clock); rank 0 prints the median step in ms and the median busy time."""
import gc
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

from podrun.runtime.steps import StepClock

mode, steps = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(1)
dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(768, 768),
                                                                                           nn.ReLU())]))
clock = StepClock(model) if mode in ("hook", "split") else None
split = mode == "split"
opt = torch.optim.SGD(model.parameters(), lr=0.001)
x, y = torch.randn(32, 768), torch.randn(32, 768)
times, busy = [], []
for i in range(steps):
    t = time.perf_counter()
    if clock is not None:
        clock.start()
    if split:
        clock.fetched()
    nn.functional.mse_loss(model(x), y).backward()
    if split:
        clock.synced()
    if clock is not None:
        busy.append(clock.busy())
    opt.step()
    opt.zero_grad()
    if split:
        clock.stepped()
        clock.split()
    if i >= steps // 10:                       # the first tenth warms up
        times.append(time.perf_counter() - t)
if dist.get_rank() == 0:
    print(f"STEP_MS {statistics.median(times) * 1e3:.4f} BUSY_MS "
          f"{statistics.median(busy) * 1e3 if busy else float('nan'):.4f}", flush=True)
del model, opt, clock    # DDP's gloo work freed before the group (else gloo can abort at exit)
gc.collect()
dist.destroy_process_group()
