"""A tiny deterministic GroupNorm regression (tests/elastic/groupnorm.py) trained with gloo, for the elastic tests.

The global batch at step s is the samples at global positions [s*G, (s+1)*G) of a fixed data set in
an order that depends only on the seed and the epoch; each replica takes its share of every micro
step, gradients are summed over the global batch and divided by G. GroupNorm works per sample, so
the loss curve does not depend on how the global batch is split (replicas x local batch x GA) beyond
float rounding. Every rank hands its state to podrun.runtime.elastic.snapshot after every update (an
in-memory snapshot on its host), rank 0 checkpoints every --checkpoint-every steps (atomically) and logs
each step to metrics.jsonl; a restart resumes from the newest snapshot a rank holds when it is newer than
the checkpoint (podrun.runtime.elastic.restore), else from the checkpoint, and logs where it resumed.
With --hold-after N --hold-until FILE every rank waits after step N until FILE exists (the test's cue).
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from podrun.runtime import elastic  # noqa: E402
from tests.elastic import groupnorm  # noqa: E402  (the repository root, whatever the caller's cwd)

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--sleep", type=float, default=0.1)
p.add_argument("--samples", type=int, default=240)
p.add_argument("--checkpoint-every", type=int, default=1)
p.add_argument("--hold-after", type=int, default=-1, help="after this step, wait for --hold-until to exist")
p.add_argument("--hold-until", default="", help="a file the test creates to let the run go on")
args = p.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
plan = elastic.plan()
G, b, a, R, r = plan.global_batch, plan.local_batch, plan.grad_accum, plan.replicas, plan.replica
assert R == world and b * R * a == G, (b, R, a, G)
run_dir = os.environ["PODRUN_RUN_DIR"]
ckpt = os.path.join(run_dir, "ckpt.pt")

X, Y = groupnorm.data(args.samples)
model = groupnorm.model()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
step, where = 0, {}
state = torch.load(ckpt) if os.path.exists(ckpt) else None
got = elastic.restore(newer_than=state["step"] if state else -1)
if got is not None:
    state, where = got.state, {"source": "snapshot", "from_rank": got.from_rank, "fetched_by": list(got.fetched_by)}
elif state is not None:
    where = {"source": "checkpoint"}
if state is not None:
    assert state["global_batch"] == G
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    step = state["step"]


metrics = open(os.path.join(run_dir, "metrics.jsonl"), "a") if rank == 0 else None
if rank == 0:
    metrics.write(json.dumps({"kind": "run", "event": "resume" if step else "start", "step": step, **where,
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
    elastic.snapshot(step, {"model": model, "opt": opt, "step": step, "global_batch": G})
    if rank == 0 and step % args.checkpoint_every == 0:
        tmp = ckpt + ".tmp"
        torch.save({"step": step, "global_batch": G, "model": model.state_dict(), "opt": opt.state_dict()}, tmp)
        os.replace(tmp, ckpt)
    if rank == 0:
        metrics.write(json.dumps({"kind": "step", "step": step, "loss": loss_sum.item(), "world_size": world,
                                  "grad_accum": a, "time": time.time()}) + "\n")
        metrics.flush()
        print(f"step {step} loss {loss_sum.item():.6f} world {world} GA {a}", flush=True)
    time.sleep(args.sleep)
    while step == args.hold_after and not os.path.exists(args.hold_until):
        time.sleep(0.05)
elastic.close()
dist.barrier()
dist.destroy_process_group()
