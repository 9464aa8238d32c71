"""bench/scripts/elastic_train.py's model, data and step under torchft 0.2 (one replica group per host), for the
torchft row of bench/bench_elastic.py.

The loop is the one of torchft's train_ddp.py (Manager over a ProcessGroupGloo, the Optimizer wrapper that
starts the quorum in zero_grad and commits in step), started the way its README says (torchrun with one
node and one process per replica group, TORCHFT_LIGHTHOUSE naming the lighthouse, REPLICA_GROUP_ID the
group). What differs from that example: the model and data are tests/elastic/groupnorm.py's, each group
takes its share of the global batch by its participating rank (the global batch is local batch x
participants x GA, so it shrinks with the quorum), the gradients are summed rather than averaged (the
micro loss is already divided by the global batch, as in elastic_train.py), the data position in
global samples is part of the state a healing group receives from a peer, and the Manager takes its quorum
before the forward pass (use_async_quorum=False: a group that heals does so before it computes, so every
participant of a step adds its share; with the asynchronous quorum a healing group's share of that step is
zeroed) and skips the step-0 weight sync (init_sync=False: every group builds the same seeded weights).

The participating rank 0 appends one JSON line per committed step to `<dir>/steps.log` with the same keys as
elastic_train.py (world = participants in the step's quorum); every group appends its uncommitted steps to
`<dir>/events.log`. A group ends at the first step after `<dir>/stop` appears.

`--model resnet18` (the row of bench/bench_inplace.py): the resnet18 recipe's model instead (`--norm group`, CIFAR
stem, 10 classes, the same seed in every group) on `--samples` synthetic 32 px images (podrun.train.data's
SyntheticDataset), its loss the cross entropy summed over the micro batch and divided by the global batch; each
record also has `step_seconds` (the step from its quorum, and any heal, taken to its commit).
"""
import time

PROC_START = time.time()

import os  # noqa: E402
import sys  # noqa: E402
from datetime import timedelta  # noqa: E402

from train_args import appender, parser  # noqa: E402 - beside this script

p = parser(batch=1, grad_accum=6, pg_timeout=5.0, dir_help="steps.log, events.log, stop file")
p.add_argument("--min-replicas", type=int, default=1, help="the Manager's min_replica_size")
p.add_argument("--model", choices=("groupnorm", "resnet18"), default="groupnorm")
args = p.parse_args()
append = appender(args.dir)


import torch  # noqa: E402
from torch.distributed import ReduceOp  # noqa: E402
from torchft import Manager, Optimizer, ProcessGroupGloo  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.elastic import groupnorm  # noqa: E402

group_id = int(os.environ["REPLICA_GROUP_ID"])
if args.model == "resnet18":
    from podrun import models
    from podrun.train.data import SyntheticDataset

    torch.set_num_threads(1)
    images = SyntheticDataset(args.samples, 32, 10, seed=0)
    X, Y = images.batch(range(args.samples), 0, True)
    X = X.float() / 255.0
    torch.manual_seed(0)
    model = models.build("resnet18", num_classes=10, norm="group", stem="cifar")

    def micro_loss(net, x, y, idx, *, micro, replicas, local_batch, replica):
        start = micro * replicas * local_batch + replica * local_batch
        mine = idx[start: start + local_batch]
        return torch.nn.functional.cross_entropy(net(x[mine]), y[mine], reduction="sum") / len(idx)
else:
    X, Y = groupnorm.data(args.samples)
    model = groupnorm.model()
    micro_loss = groupnorm.micro_loss
inner = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
data = {"pos": 0}


def load_state_dict(state: dict) -> None:
    model.load_state_dict(state["model"])
    inner.load_state_dict(state["optim"])
    data["pos"] = int(state["pos"])


def state_dict() -> dict:
    return {"model": model.state_dict(), "optim": inner.state_dict(), "pos": data["pos"]}


manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=args.pg_timeout)),
                  min_replica_size=args.min_replicas, load_state_dict=load_state_dict, state_dict=state_dict,
                  replica_id=f"bench_{group_id}", hostname=os.environ["BENCH_HOST"], timeout=timedelta(seconds=30),
                  use_async_quorum=False, init_sync=False)
optimizer = Optimizer(manager, inner)
INIT_DONE = READY = time.time()
b, a = args.batch, args.grad_accum

while manager.current_step() < args.steps:
    optimizer.zero_grad()                       # starts the quorum
    t_step = time.time()                        # the step's own time: from its quorum (and any heal) to its commit
    rank, world = manager.participating_rank(), manager.num_participants()
    G = b * world * a
    idx = groupnorm.global_batch(data["pos"], G, args.samples)
    vec = torch.zeros(2)                        # [loss summed over the global batch, stop flag]
    for k in range(a):
        loss = micro_loss(model, X, Y, idx, micro=k, replicas=world, local_batch=b,
                                    replica=rank if rank is not None else 0)
        loss.backward()
        vec[0] += loss.detach()
    if os.path.exists(os.path.join(args.dir, "stop")):
        vec[1] = 1
    works = [manager.allreduce(prm.grad, reduce_op=ReduceOp.SUM) for prm in model.parameters()]
    works.append(manager.allreduce(vec, reduce_op=ReduceOp.SUM))
    for w in works:
        w.wait()
    step_before = manager.current_step()
    optimizer.step()                            # should_commit, then the inner step
    if manager.current_step() > step_before:
        data["pos"] += G
        if rank == 0:
            append("steps.log", {"step": manager.current_step(), "t": time.time(), "loss": vec[0].item(),
                                 "world": world, "local_batch": b, "grad_accum": a, "global_batch": G,
                                 "launcher": "torchft", "proc_start": PROC_START, "init_done": INIT_DONE,
                                 "built": READY, "ready": READY, "step_seconds": time.time() - t_step})
        if vec[1] > 0:
            break
    else:
        append("events.log", {"event": "error", "rank": group_id, "t": time.time(), "step": step_before,
                              "error": str(manager.errored())[:300]})
    time.sleep(args.sleep)
manager.shutdown(wait=False)
