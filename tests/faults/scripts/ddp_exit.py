"""The DDP tutorial's ending, restarted many times: each rank's Trainer holds its DDP model when
destroy_process_group() is called, and the model is freed as the function that trains returns (as in the
tutorial's multinode.py).
Rank 1 then writes its pid and exits 0; rank 0 then waits (at most --wait s) for rank 1's process to end, writes
``hang-<attempt>`` in --dir when it did not, and exits 1 until the last attempt (--attempts), which exits 0."""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


class Trainer:
    def __init__(self):
        self.model = DistributedDataParallel(torch.nn.Linear(8, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def train(self, steps: int) -> None:
        for _ in range(steps):
            self.opt.zero_grad()
            self.model(torch.rand(16, 8)).pow(2).mean().backward()
            self.opt.step()


def train(steps: int) -> int:
    """The tutorial's shape: the group destroyed while the Trainer (and its DDP model) lives; both go as this
    returns. Returns the rank."""
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    trainer = Trainer()
    trainer.train(steps)
    dist.destroy_process_group()
    return rank


def ended(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--attempts", type=int, required=True)
    ap.add_argument("--wait", type=float, default=30.0)
    args = ap.parse_args()
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rank = train(4)
    if rank == 1:
        with open(os.path.join(args.dir, f"rank1-{attempt}.pid"), "w") as f:
            f.write(str(os.getpid()))
        return 0
    pid_file, deadline = os.path.join(args.dir, f"rank1-{attempt}.pid"), time.monotonic() + args.wait
    while time.monotonic() < deadline:
        if os.path.exists(pid_file) and os.path.getsize(pid_file) > 0 and ended(int(open(pid_file).read())):
            break
        time.sleep(0.05)
    else:
        open(os.path.join(args.dir, f"hang-{attempt}"), "w").close()
    print(f"attempt {attempt} ended", flush=True)
    return 1 if attempt < args.attempts else 0


if __name__ == "__main__":
    sys.exit(main())
