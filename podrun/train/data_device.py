"""The device's own JPEG decoder for image folders on CUDA: nvJPEG through torchvision.io.decode_jpeg(device='cuda'),
a micro batch at a time, with the random-resized crop, resize and flip on the device.

The loader workers only read each file and its header (the crop box and flip are drawn from (seed, epoch, index)
there, as on the host path), so the host's cores are not the limit. It is used when the device is CUDA and
torchvision with CUDA support imports, unless $PODRUN_DECODER names a host decoder. It runs only on a CUDA host:
no CPU host and no test here runs it; the prepared device check (bench/gpu_check_data.py) measures it on a lent GPU.
A micro batch the device decoder refuses (a damaged or non-JPEG file among it) is decoded on the host instead, where
--bad-samples decides.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np
import torch

from podrun.train.images import FolderDataset, ImageDataset


def usable(device_kind: str) -> bool:
    """True where the device decoder can run: a CUDA device, torchvision with CUDA, no host decoder forced."""
    from podrun.train.decode import DECODER_ENV

    if device_kind != "cuda" or os.environ.get(DECODER_ENV) or not torch.cuda.is_available():
        return False
    try:
        import torchvision.io  # noqa: F401
    except ImportError:
        return False
    return True


class RawBatch(NamedTuple):
    """A micro batch still encoded: the files' bytes, each sample's crop box (left, top, right, bottom in its source's
    pixels) and flip, and the indices (for the host fall-back)."""

    data: list            # 1-D uint8 tensors
    boxes: torch.Tensor   # (N, 4) float64
    flips: torch.Tensor   # (N,) bool
    indices: torch.Tensor
    epoch: int
    train: bool


class RawFolder(ImageDataset):
    """A FolderDataset whose batches stay encoded (read by the loader workers, decoded on the device)."""

    decodes_files = True

    def __init__(self, ds: FolderDataset):
        self.ds, self.num_classes, self.name = ds, ds.num_classes, ds.name
        self.mean, self.std = ds.mean, ds.std

    def __len__(self):
        return len(self.ds)

    def batch(self, indices, epoch, train):
        from podrun.train import decode

        data, boxes, flips = [], [], []
        for i in indices:
            try:
                raw = self.ds.read(int(i))
            except OSError:
                raw = b""             # unreadable: the host path names it
            try:
                w, h = decode.image_size(raw, self.ds.decoder)
            except decode.DecodeError:
                w, h = 1, 1           # refused by the device decoder too: the host path names it
            box, flip = self.ds.box(int(i), w, h, epoch, train)
            data.append(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
            boxes.append(box)
            flips.append(flip)
        y = torch.tensor([self.ds.samples[int(i)][1] for i in indices], dtype=torch.long)
        raw_batch = RawBatch(data, torch.tensor(boxes, dtype=torch.float64), torch.tensor(flips),
                             torch.as_tensor(np.asarray(indices, dtype=np.int64)), epoch, train)
        return raw_batch, y

    def drain_skipped(self):
        return self.ds.drain_skipped()


def decode_batch(raw: RawBatch, ds: FolderDataset, device: torch.device) -> torch.Tensor:
    """(N, 3, S, S) uint8 on ``device``: decoded by nvJPEG in one batched call, each sample cropped, resized
    (bilinear) and flipped there. A batch nvJPEG refuses is decoded on the host (FolderDataset.batch)."""
    import torchvision.io as tio

    s = ds.image_size
    try:
        images = tio.decode_jpeg(raw.data, mode=tio.ImageReadMode.RGB, device=device)
    except (RuntimeError, ValueError):
        x, _ = ds.batch(raw.indices.tolist(), raw.epoch, raw.train)
        return x.to(device, non_blocking=True)
    out = torch.empty((len(images), 3, s, s), dtype=torch.uint8, device=device)
    for k, img in enumerate(images):
        left, top, right, bottom = (int(round(v)) for v in raw.boxes[k].tolist())
        crop = img[:, max(0, top):max(top + 1, bottom), max(0, left):max(left + 1, right)]
        r = torch.nn.functional.interpolate(crop[None].float(), size=(s, s), mode="bilinear", align_corners=False,
                                            antialias=True)[0]
        if bool(raw.flips[k]):
            r = r.flip(-1)
        out[k] = r.round_().clamp_(0, 255).to(torch.uint8)
    return out
