"""A tiny deterministic GroupNorm regression (tests/elastic/groupnorm.py) trained with gloo, for the elastic tests.

The global batch at step s is the samples at global positions [s*G, (s+1)*G) of a fixed data set in
an order that depends only on the seed and the epoch; each replica takes its share of every micro
step, gradients are summed over the global batch and divided by G. GroupNorm works per sample, so
the loss curve does not depend on how the global batch is split (replicas x local batch x GA) beyond
float rounding. Rank 0 checkpoints after every step (atomically) and logs each step to
metrics.jsonl; a restart resumes from the checkpoint.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.elastic import groupnorm  # noqa: E402  (the repository root, whatever the caller's cwd)

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--sleep", type=float, default=0.1)
p.add_argument("--samples", type=int, default=240)
args = p.parse_args()

e = os.environ
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
G, b, a = int(e["PODRUN_GLOBAL_BATCH"]), int(e["PODRUN_LOCAL_BATCH"]), int(e["PODRUN_GRAD_ACCUM"])
R, r = int(e["PODRUN_NUM_REPLICAS"]), int(e["PODRUN_REPLICA_OFFSET"])
assert R == world and b * R * a == G, (b, R, a, G)
run_dir = e["PODRUN_RUN_DIR"]
ckpt = os.path.join(run_dir, "ckpt.pt")

X, Y = groupnorm.data(args.samples)
model = groupnorm.model()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
step = 0
if os.path.exists(ckpt):
    state = torch.load(ckpt)
    assert state["global_batch"] == G
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    step = state["step"]


metrics = open(os.path.join(run_dir, "metrics.jsonl"), "a") if rank == 0 else None
if rank == 0:
    metrics.write(json.dumps({"kind": "run", "event": "resume" if step else "start", "step": step,
                              "world_size": world, "time": time.time()}) + "\n")
    metrics.flush()
while step < args.steps:
    idx = groupnorm.global_batch(step * G, G, args.samples)
    opt.zero_grad()
    loss_sum = torch.zeros(1)
    for k in range(a):                     # micro step k: replica r takes b samples of it
        loss = groupnorm.micro_loss(model, X, Y, idx, micro=k, replicas=R, local_batch=b, replica=r)
        loss.backward()
        loss_sum += loss.detach()
    for prm in model.parameters():
        dist.all_reduce(prm.grad)
    dist.all_reduce(loss_sum)
    opt.step()
    step += 1
    if rank == 0:
        tmp = ckpt + ".tmp"
        torch.save({"step": step, "global_batch": G, "model": model.state_dict(), "opt": opt.state_dict()}, tmp)
        os.replace(tmp, ckpt)
        metrics.write(json.dumps({"kind": "step", "step": step, "loss": loss_sum.item(), "world_size": world,
                                  "grad_accum": a, "time": time.time()}) + "\n")
        metrics.flush()
        print(f"step {step} loss {loss_sum.item():.6f} world {world} GA {a}", flush=True)
    time.sleep(args.sleep)
dist.barrier()
dist.destroy_process_group()
