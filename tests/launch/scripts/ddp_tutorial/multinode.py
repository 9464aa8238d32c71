"""A stand-in for the DDP tutorial's multinode.py (pytorch/examples, distributed/ddp-tutorial-series), written for
these tests from the tutorial's documented behaviour: the same command line (`multinode.py TOTAL_EPOCHS SAVE_EVERY
[--batch_size N]`), the same two kinds of line ("[GPU<rank>] Epoch E | Batchsize: B | Steps: S" each epoch on every
rank, "Epoch E | Training snapshot saved at snapshot.pt" from rank 0), the same resume from snapshot.pt, on CPU
(gloo): a linear model over 2048 random samples of 20 features, each rank its DistributedSampler share.

One difference from the tutorial, which destroys the process group while its Trainer still holds the DDP model:
this script frees the DDP model first. A gloo DDP reducer that outlives its destroyed group can abort the worker
at exit ("terminate called without an active exception", SIGABRT), seen once in CI under torchrun itself; podrun's
own runner frees its wrappers before the group the same way (podrun/train/runner.py). The tests compare the two
launchers on this script, not torch's teardown."""
import argparse
import gc
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

SNAPSHOT = "snapshot.pt"
SAMPLES, FEATURES = 2048, 20


def main() -> None:
    ap = argparse.ArgumentParser(description="the DDP tutorial's multinode training job, on CPU")
    ap.add_argument("total_epochs", type=int)
    ap.add_argument("save_every", type=int)
    ap.add_argument("--batch_size", type=int, default=32)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    data = TensorDataset(torch.rand(SAMPLES, FEATURES), torch.rand(SAMPLES, 1))
    loader = DataLoader(data, batch_size=args.batch_size, sampler=DistributedSampler(data))
    net = torch.nn.Linear(FEATURES, 1)
    first = 0
    if os.path.exists(SNAPSHOT):
        print("Loading snapshot")
        saved = torch.load(SNAPSHOT, map_location="cpu", weights_only=True)
        net.load_state_dict(saved["MODEL_STATE"])
        first = saved["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {first}")
    model = DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for epoch in range(first, args.total_epochs):
        print(f"[GPU{rank}] Epoch {epoch} | Batchsize: {args.batch_size} | Steps: {len(loader)}")
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        if rank == 0 and epoch % args.save_every == 0:
            torch.save({"MODEL_STATE": net.state_dict(), "EPOCHS_RUN": epoch}, SNAPSHOT)
            print(f"Epoch {epoch} | Training snapshot saved at {SNAPSHOT}")
    del model, opt
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
