"""A one-worker user script for the snapshot security tests: restore, three snapshotted updates, then a failure on
the first attempt (exit 3) so that a restart reads the snapshots.

It checkpoints update 1 to the run directory (ckpt.json) and restores with ``newer_than`` that step, printing
``restored STEP from SOURCE``.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from podrun.runtime import elastic

p = elastic.plan()
ckpt = os.path.join(os.environ["PODRUN_RUN_DIR"], "ckpt.json")
disk = -1
if os.path.exists(ckpt):
    with open(ckpt) as f:
        disk = json.load(f)["step"]
got = elastic.restore(newer_than=disk)
if got is not None:
    print(f"restored {got.step} from snapshot", flush=True)
elif disk >= 0:
    print(f"restored {disk} from checkpoint", flush=True)
else:
    print("restored nothing", flush=True)
w = torch.zeros(4)
for step in range(1, 4):
    w += 1
    elastic.snapshot(step, {"w": w.clone(), "step": step})
    if step == 1 and disk < 0:
        with open(ckpt, "w") as f:
            json.dump({"step": 1}, f)
elastic.close()
if p.restart_count == 0:
    sys.exit(3)
