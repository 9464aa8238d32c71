"""A GroupNorm regression (tests/elastic/groupnorm.py) for bench/bench_elastic.py that runs unchanged under podrun
and torchrun.

Rank and world come from the env (RANK, WORLD_SIZE, MASTER_ADDR/PORT: init_process_group's env://).
The split of a step: under podrun the local batch and GA are PODRUN_LOCAL_BATCH / PODRUN_GRAD_ACCUM
(podrun re-plans them so that the global batch stays); under torchrun they are the fixed
`--batch` / `--grad-accum` (what torchrun users do), so the global batch is batch x world x GA and
changes with the world. The training collectives time out after `--pg-timeout` s (gloo's default is
30 min): they run in a group made with that timeout right after init_process_group, whose own timeout
(`--init-timeout`) bounds how long the first rank waits for the last to arrive (with a 10 s init
timeout, workers that import torch a few seconds later than their peers on a loaded machine fail gloo's
connectFullMesh with "Connection refused", which costs a restart).

Rank 0 checkpoints after every step into `--dir` (atomically: step and position in global samples,
model, optimizer) and every process resumes from it; the data order is a function of the seed and
the epoch only. With `--ckpt flash` (under dlrover-run) the same state goes through DLRover's flash
checkpoint instead: to the agent's shared memory every step, to disk every `--disk-every` steps, and a
restarted process loads it from memory when its host holds it. Rank 0 appends one JSON line per step to
`<dir>/steps.log` with its wall time, the loss, the world, the decomposition and its own clock: when the
process started, joined gloo, built the model and optimizer, and restored the checkpoint (so a controller
tells the steps of a restarted attempt from those of the first and splits its start); any rank whose collective fails appends the error
with its time to `<dir>/events.log`. Under podrun it also writes the run's metrics.jsonl, from which
podrun's summary.json takes training_after_s. The run ends at the first step after `<dir>/stop`
appears (rank 0 reads it and shares it in the step's all_reduce, so every rank stops at the same step).
"""
import time

PROC_START = time.time()

import datetime  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

from train_args import appender, parser  # noqa: E402 - beside this script

p = parser(batch=2, grad_accum=3, pg_timeout=10.0, dir_help="checkpoint, steps.log, events.log, stop file")
p.add_argument("--init-timeout", type=float, default=60.0, help="seconds init waits for every rank to arrive")
p.add_argument("--ckpt", choices=("torch", "flash"), default="torch",
               help="torch: rank 0 torch.save()s every step; flash: DLRover's flash checkpoint (DdpCheckpointer: "
                    "shared memory every step, disk every --disk-every steps), for dlrover-run")
p.add_argument("--disk-every", type=int, default=10, help="with --ckpt flash: steps between disk checkpoints")
args = p.parse_args()
append = appender(args.dir)


import sys  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.elastic import groupnorm  # noqa: E402  (the model and data the elastic tests train)

e = os.environ
rank, world = int(e["RANK"]), int(e["WORLD_SIZE"])
try:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.init_timeout))
    group = dist.new_group(timeout=datetime.timedelta(seconds=args.pg_timeout))
except Exception as exc:
    append("events.log", {"event": "init_error", "rank": rank, "t": time.time(), "error": str(exc)[:300]})
    raise
INIT_DONE = time.time()
if "PODRUN_LOCAL_BATCH" in e:
    launcher, b, a = "podrun", int(e["PODRUN_LOCAL_BATCH"]), int(e["PODRUN_GRAD_ACCUM"])
else:
    launcher, b, a = "other", args.batch, args.grad_accum
R, G = world, b * world * a
if launcher == "podrun":
    assert G == int(e["PODRUN_GLOBAL_BATCH"]), (b, world, a, e["PODRUN_GLOBAL_BATCH"])
ckpt = os.path.join(args.dir, "ckpt.pt")
metrics = os.path.join(e["PODRUN_RUN_DIR"], "metrics.jsonl") if launcher == "podrun" and rank == 0 else None

X, Y = groupnorm.data(args.samples)
model = groupnorm.model()
opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
BUILT = time.time()                         # model and optimizer (torch.optim imports torch._dynamo)
step, pos = 0, 0
if args.ckpt == "flash":
    from dlrover.trainer.torch.flash_checkpoint.ddp import DdpCheckpointer, StorageType

    flash = DdpCheckpointer(os.path.join(args.dir, "flash"))
    state = flash.load_checkpoint() or None
    state = state.get("model_states", state) if state else None
else:
    state = torch.load(ckpt) if os.path.exists(ckpt) else None
if state:
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    step, pos = state["step"], state["pos"]
READY = time.time()                         # the checkpoint restored


try:
    while step < args.steps:
        idx = groupnorm.global_batch(pos, G, args.samples)
        opt.zero_grad()
        vec = torch.zeros(2)                # [loss summed over the global batch, stop flag]
        for k in range(a):                  # micro step k: replica `rank` takes b samples of it
            loss = groupnorm.micro_loss(model, X, Y, idx, micro=k, replicas=R, local_batch=b, replica=rank)
            loss.backward()
            vec[0] += loss.detach()
        if rank == 0 and os.path.exists(os.path.join(args.dir, "stop")):
            vec[1] = 1
        for prm in model.parameters():
            dist.all_reduce(prm.grad, group=group)
        dist.all_reduce(vec, group=group)
        opt.step()
        step, pos = step + 1, pos + G
        t = time.time()
        if args.ckpt == "flash":             # every rank calls it; the engine saves rank 0's copy per node
            state = {"step": step, "pos": pos, "model": model.state_dict(), "opt": opt.state_dict()}
            flash.save_checkpoint(step, state, os.path.join(args.dir, "flash", f"{step}.pt"),
                                  storage_type=StorageType.DISK if step % args.disk_every == 0 else StorageType.MEMORY)
        if rank == 0:
            if args.ckpt == "torch":
                tmp = ckpt + ".tmp"
                torch.save({"step": step, "pos": pos, "model": model.state_dict(), "opt": opt.state_dict()}, tmp)
                os.replace(tmp, ckpt)
            append("steps.log", {"step": step, "t": t, "loss": vec[0].item(), "world": world,
                                 "local_batch": b, "grad_accum": a, "global_batch": G, "launcher": launcher,
                                 "proc_start": PROC_START, "init_done": INIT_DONE, "built": BUILT, "ready": READY})
            if metrics is not None:
                with open(metrics, "a") as f:
                    f.write(json.dumps({"kind": "step", "step": step, "loss": vec[0].item(), "time": t}) + "\n")
        if vec[1] > 0:
            break
        time.sleep(args.sleep)
    dist.barrier(group=group)
except Exception as exc:    # a collective with a lost peer: record when this rank saw it, then fail
    append("events.log", {"event": "error", "rank": rank, "t": time.time(), "step": step, "error": str(exc)[:300]})
    raise
dist.destroy_process_group()
