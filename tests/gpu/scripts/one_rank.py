"""A worker for tests/gpu/test_nccl_launch.py, written as a torchrun user writes one: under podrun launch it binds
its device by podrun's rule (select_device: LOCAL_RANK), joins a one-rank process group by env:// (NCCL on CUDA,
gloo on the CPU twin), all-reduces a tensor on its device and writes what it saw as JSON to argv[1]."""
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

from podrun.runtime.distributed import select_device

out, kind = sys.argv[1], sys.argv[2]
device = select_device(kind)
backend = "nccl" if device.kind == "cuda" else "gloo"
dist.init_process_group(backend, init_method="env://", timeout=datetime.timedelta(seconds=60))
t = torch.arange(1, 5, dtype=torch.float32, device=device.torch_device)
dist.all_reduce(t)
cuda = device.kind == "cuda"
seen = {name: os.environ.get(name) for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                                 "CUDA_VISIBLE_DEVICES")}
seen.update(backend=dist.get_backend(), world=dist.get_world_size(), tensor_device=str(t.device),
            sum=t.cpu().tolist(), current_device=torch.cuda.current_device() if cuda else None,
            device_count=torch.cuda.device_count() if cuda else 0,
            nccl=str(torch.cuda.nccl.version()) if cuda else None)
dist.destroy_process_group()
with open(out, "w", encoding="utf-8") as f:
    json.dump(seen, f)
