"""The tutorial's DDP script (docs/launch.md) as a loop that recovers in place under `podrun launch --elastic`
(docs/elastic.md, "Your own loop"): rank 0 appends `step N loss L` to --out after every update."""
import argparse
import time

import torch
import torch.distributed as dist

from podrun.runtime import inplace

GLOBAL = 12


def batch(step: int):
    """Update step + 1's global batch, in global order: a function of the step only."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL, 4, generator=g)
    return x, x.sum(1, keepdim=True).sin()


def loss_fn(model, x, y):
    return (model(x) - y).pow(2).mean()


def model_and_opt():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    model, opt = model_and_opt()
    loop = inplace.loop(model, opt, GLOBAL, batch, loss_fn)
    if loop is None:
        raise SystemExit("not under podrun launch --elastic with gloo: no in-place loop")
    while loop.step < args.steps:
        loss = loop.train_step()
        if loop.share.rank == 0:
            with open(args.out, "a") as f:
                f.write(f"step {loop.step} loss {loss:.9g} world {loop.share.world}\n")
        time.sleep(args.sleep)
    inplace.end_process(0) if inplace.abandoned_any() else dist.destroy_process_group()


if __name__ == "__main__":
    main()
