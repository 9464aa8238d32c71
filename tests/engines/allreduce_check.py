"""A torchrun-style worker for engine/transport tests: env contract checks, then a gloo all_reduce."""
import datetime
import json
import os
import socket
import sys

import torch
import torch.distributed as dist

keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
        "PODRUN_RUN_ID", "PODRUN_INSTANCE_INDEX", "PODRUN_NUM_INSTANCES", "PODRUN_NUM_REPLICAS",
        "PODRUN_LOCAL_REPLICAS", "PODRUN_REPLICA_OFFSET", "PODRUN_PLAN", "PODRUN_RUN_DIR", "PODRUN_WARM"]
env = {k: os.environ.get(k) for k in keys}
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print("RESULT " + json.dumps({"host": socket.gethostname(), "rank": rank, "world": world, "sum": t.item(),
                              "env": env, "parent": os.getppid()}), flush=True)
dist.destroy_process_group()
if os.environ.get("FAIL_RANK") == str(rank):
    sys.exit(int(os.environ.get("FAIL_CODE", "3")))
