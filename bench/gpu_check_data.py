"""The prepared device check's input row (`python -m bench gpu-check`, its bench part): ResNet-50 trained from a tree
of 500 x 375 JPEGs decoded on the device (nvJPEG through torchvision.io.decode_jpeg, a micro batch at a time; crop,
resize and flip on the device: podrun.train.data_device) beside the same loop on device-resident synthetic input.
The goal: from JPEG at >= 90 % of the synthetic rate.

The device decoder runs only on a lent GPU whose image has torchvision with CUDA; where it cannot run (no
torchvision, or the CPU form of the check) the row says so and times the host decoder in loader workers instead,
named as such. Nothing here stands in for the device decoder.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path


def _loop(model, batches, steps: int, warmup: int, device: str) -> float:
    """Seconds per step of a bf16 SGD loop over ``batches`` (an iterator of (x uint8 on the device, y))."""
    import torch
    import torch.nn.functional as F

    from podrun.train.data import IMAGENET_MEAN, IMAGENET_STD, normalize

    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    t = 0.0
    for i in range(warmup + steps):
        if i == warmup:
            if device == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
        x, y = next(batches)
        x = normalize(x.to(device, non_blocking=True), IMAGENET_MEAN, IMAGENET_STD, channels_last=True)
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y.to(device, non_blocking=True))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / steps


def measure(device: str, *, batch: int, size: int, steps: int, warmup: int, images: int, repeats: int = 2,
            workers: int | None = None) -> list[dict]:
    """Rows: img/s from the JPEG tree (device decoder where usable, else host decoder) and from device-resident
    synthetic input, the ratio of the two; interleaved repeats, the median of each."""
    import torch

    from bench.jpeg_tree import make_tree
    from podrun import models as pm
    from podrun.train import data_device
    from podrun.train.data import FolderDataset, Loader, Shard

    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    on_device = data_device.usable(device)
    workers = workers if workers is not None else max(1, min(8, len(os.sched_getaffinity(0)) - 1))
    with tempfile.TemporaryDirectory() as tmp:
        per_class = max(1, images // 8)
        tree = make_tree(Path(tmp) / "tree", classes=8, train_per_class=per_class, val_per_class=1)
        ds = FolderDataset(tree / "train", size)
        model = pm.build("resnet50", 1000).to(device).to(memory_format=torch.channels_last).train()
        shard = Shard(local_batch=batch, grad_accum=1, replicas=1, replica_offset=0)

        def synthetic():
            x = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8, device=device)
            y = torch.randint(0, 1000, (batch,), device=device)
            while True:
                yield x, y

        def jpeg():
            if on_device:
                where = torch.device(device)
                loader = Loader(data_device.RawFolder(ds), shard, seed=0, prefetch=0, workers=workers,
                                pin_memory=True, transform=lambda raw: data_device.decode_batch(raw, ds, where))
            else:
                loader = Loader(ds, shard, seed=0, prefetch=0, workers=workers, pin_memory=device == "cuda")
            for _, _, micro in loader:
                yield micro[0]

        times: dict[str, list[float]] = {"jpeg": [], "synthetic": []}
        for _ in range(repeats):
            for key, source in (("jpeg", jpeg), ("synthetic", synthetic)):
                it = source()
                try:
                    times[key].append(_loop(model, it, steps, warmup, device))
                finally:
                    it.close()
    ips = {k: batch / statistics.median(v) for k, v in times.items()}
    how = (f"{name}; ResNet-50 bf16, batch {batch} at {size} px; {len(ds)} JPEGs of 500x375 (~96 KB); "
           f"median of {repeats} interleaved repeats of {steps} steps after {warmup} warm-up")
    subject = ("from JPEG, device decoder (nvJPEG, torchvision.io.decode_jpeg)" if on_device else
               f"from JPEG, host decoder {ds.decoder} in {workers} loader workers")
    note = how if on_device else (how + "; the device decoder was not run: " +
                                  ("torchvision with CUDA is not importable here" if device == "cuda"
                                   else "the CPU form of the check"))
    ratio = ips["jpeg"] / ips["synthetic"]
    return [{"benchmark": "GPU train throughput, resnet50 input", "subject": subject, "value": round(ips["jpeg"], 1),
             "peer": "device-resident synthetic input, same loop", "peer_value": round(ips["synthetic"], 1),
             "ratio": round(ratio, 3), "unit": "img/s",
             "note": note + (f"; goal >= 0.9x synthetic: {'met' if ratio >= 0.9 else 'not met'}" if on_device else "")}]


CUDA_SIZES = dict(batch=256, size=224, steps=10, warmup=5, images=1024)     # ~30 s on an H100/H200


if __name__ == "__main__":       # python -m bench.gpu_check_data [cuda|cpu]: the row alone (cpu: minutes, tiny)
    import json
    import sys

    dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    kw = CUDA_SIZES if dev == "cuda" else \
        dict(batch=2, size=32, steps=2, warmup=1, images=16, workers=1)
    print(json.dumps(measure(dev, **kw), indent=2))
