"""A worker for the runtime tests: read the rank from whichever launcher started it, join gloo, all_reduce."""
import torch
import torch.distributed as dist

from podrun.runtime import destroy_distributed, init_distributed

info = init_distributed(timeout=30)
t = torch.tensor([float(info.rank + 1)])
dist.all_reduce(t)
import sys

# one write per line: workers share the pipe, and print() writes the text and the newline separately
sys.stdout.write(f"WORKER {info.source} rank={info.rank} world={info.world_size} "
                 f"local={info.local_rank}/{info.local_world_size} sum={t.item()}\n")
sys.stdout.flush()
destroy_distributed()
