"""A worker that writes its whole environment to $ENV_DUMP_DIR/<RANK>.json, then joins a gloo all_reduce."""
import datetime
import json
import os

import torch
import torch.distributed as dist

with open(os.path.join(os.environ["ENV_DUMP_DIR"], f"{os.environ['RANK']}.json"), "w") as f:
    json.dump(dict(os.environ), f)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
t = torch.ones(1)
dist.all_reduce(t)
assert t.item() == dist.get_world_size()
dist.destroy_process_group()
