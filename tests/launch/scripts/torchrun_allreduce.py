"""A script written for torchrun (env:// rendezvous, gloo); runs unchanged under podrun launch.

Prints one line: ALLREDUCE rank=<r> world=<w> local_rank=<l> host=<h> sum=<s> restart=<n>
and, with --dump DIR, writes DIR/env-<rank>.json with the worker's whole environment.
"""
import datetime
import json
import os
import socket
import sys

import torch
import torch.distributed as dist

args = sys.argv[1:]
if "--dump" in args:
    d = args[args.index("--dump") + 1]
    with open(os.path.join(d, f"env-{os.environ['RANK']}.json"), "w") as f:
        json.dump(dict(os.environ), f)
dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=30))
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"ALLREDUCE rank={rank} world={world} local_rank={os.environ['LOCAL_RANK']} host={socket.gethostname()} "
      f"sum={int(t.item())} restart={os.environ.get('PODRUN_RESTART_COUNT', '-')}", flush=True)
if "--fail-rank" in args and rank == int(args[args.index("--fail-rank") + 1]):
    sys.exit(3)
if "--hang" in args:
    import time
    time.sleep(300)
dist.destroy_process_group()
