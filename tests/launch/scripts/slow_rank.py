"""A plain DDP loop over gloo that reports its step split through podrun's hook for a user's script
(podrun.runtime.steps: input, compute, optim phases; the DDP model watched, so backward's wait after the last gradient
counts as comm): every rank's data step takes BASE seconds, rank SLOW_RANK's SLOW_EXTRA more (argv: STEPS BASE
SLOW_RANK SLOW_EXTRA; SLOW_RANK -1: no slow rank)."""
import gc
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

from podrun.runtime import steps

total, base, slow_rank, extra = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
steps.watch(model)
for step in range(1, total + 1):
    t = time.perf_counter()
    with steps.phase("input"):
        time.sleep(base + (extra if rank == slow_rank else 0.0))      # the data step
        x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
    with steps.phase("compute"):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()                                            # the all-reduce: every rank waits for the slowest
    with steps.phase("optim"):
        opt.step()
        opt.zero_grad()
    steps.step(step, total, loss=loss.item(), step_seconds=time.perf_counter() - t)
del model, opt    # DDP's gloo work freed before the group (else gloo can abort at exit)
gc.collect()
dist.destroy_process_group()
print(f"rank {rank} done", flush=True)
