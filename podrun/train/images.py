"""The image datasets' common types (ImageDataset, DataError, the bad-sample policy), the folder dataset that decodes
files, and one micro batch made of a dataset: what the loader's worker pool and the shard reader take, below all
three (podrun.train.data, data_pool, shards)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from podrun.errors import PodrunError


class DataError(PodrunError):
    """A dataset that is missing or malformed: names the path and what was expected."""


IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
TREE_HINT = "expected an ImageNet-style tree: train/<class>/*.jpg and val/<class>/*.jpg"


class ImageDataset:
    """A split: ``len()``, ``num_classes``, ``mean``/``std`` (0..1 units) and ``batch(indices, epoch, train)``."""

    num_classes: int
    decodes_files = False       # True: decoding dominates a batch, worth worker processes (podrun.train.data_pool)
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    name: str = "dataset"

    def __len__(self) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def batch(self, indices: Sequence[int], epoch: int, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError  # pragma: no cover


BAD_SAMPLES = ("fail", "skip")      # --bad-samples: stop with exit 2 naming the file, or skip it (counted)


@dataclass(frozen=True)
class BadSample:
    """A file of the training or validation split that did not decode: where, which sample, why."""

    path: str
    index: int
    reason: str

    def line(self) -> str:
        return f"bad sample {self.index}: {self.path}: {self.reason}"


def decoding(bad_samples: str, decoder: str | None):
    """An image dataset's ``--bad-samples`` policy, checked, and the decoder it uses (decode.pick's)."""
    from podrun.train import decode

    if bad_samples not in BAD_SAMPLES:
        raise DataError(f"--bad-samples {bad_samples!r}: expected one of {', '.join(BAD_SAMPLES)}")
    try:
        return bad_samples, decode.pick(decoder)
    except decode.DecodeError as exc:
        raise DataError(str(exc), hint=f"unset ${decode.DECODER_ENV}, or install the decoder it names") from None


class FolderDataset(ImageDataset):
    """ImageNet-style ``split/<class>/*.jpg|png``: decoded by podrun.train.decode's fastest decoder, cropped and
    resized to image_size.

    A file that does not decode raises DataError naming it and its index (``bad_samples="fail"``), or, with
    ``"skip"``, is replaced by the next sample of the split that decodes (the batch keeps its size and every
    decomposition its samples) and recorded in ``skipped`` (drained by the loader, which reports each). An empty
    class folder is refused the same way, or kept as a class without samples and listed in ``empty_classes``."""

    decodes_files = True        # the loader gives it worker processes by default

    def __init__(self, root: Path, image_size: int, classes: list[str] | None = None, seed: int = 0,
                 bad_samples: str = "fail", decoder: str | None = None):
        self.root, self.image_size, self.seed, self.name = root, image_size, seed, "folder"
        self.bad_samples, self.decoder = decoding(bad_samples, decoder)
        if not root.is_dir():
            raise DataError(f"{root}: folder not found", hint=TREE_HINT)
        found = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.classes = classes if classes is not None else found
        if not self.classes:
            raise DataError(f"{root}: no class folders", hint="expected one folder per class with images inside")
        index = {c: i for i, c in enumerate(self.classes)}
        self.samples: list[tuple[Path, int]] = []
        self.empty_classes: list[str] = []
        self.skipped: list[BadSample] = []
        for c in found:
            if c not in index:
                raise DataError(f"{root / c}: class {c!r} is not among the training classes")
            files = sorted(f for f in (root / c).iterdir() if f.suffix.lower() in IMAGE_EXTS)
            if not files:
                if bad_samples == "fail":
                    raise DataError(f"{root / c}: class folder {c!r} (class index {index[c]}) holds no images "
                                    f"({', '.join(IMAGE_EXTS)})",
                                    hint="remove the folder, add its images, or pass --bad-samples skip")
                self.empty_classes.append(str(root / c))
            self.samples += [(f, index[c]) for f in files]
        if not self.samples:
            raise DataError(f"{root}: no images ({', '.join(IMAGE_EXTS)}) in the class folders")
        self.num_classes = len(self.classes)
        self._bad: dict[int, BadSample] = {}    # samples found bad in this process: not read again

    def __len__(self):
        return len(self.samples)

    def box(self, i: int, w: int, h: int, epoch: int, train: bool) -> tuple[tuple[float, float, float, float], bool]:
        """Sample i's crop box in its source's pixels and whether it is mirrored: a function of (seed, epoch, i)."""
        s = self.image_size
        if train:  # torchvision's RandomResizedCrop (scale 0.08-1, ratio 3/4-4/3) and a flip, seeded per sample
            rng = np.random.default_rng([self.seed, epoch, i])
            flip = bool(rng.random() < 0.5)
            for _ in range(10):
                area = w * h * rng.uniform(0.08, 1.0)
                ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
                cw, ch = int(round(math.sqrt(area * ratio))), int(round(math.sqrt(area / ratio)))
                if 0 < cw <= w and 0 < ch <= h:
                    x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
                    return (x0, y0, x0 + cw, y0 + ch), flip
            # no draw fitted: the centre crop of the whole source, its aspect clamped to 3/4-4/3
            cw, ch = w, h
            if w / h < 3 / 4:
                ch = min(h, round(w * 4 / 3))
            elif w / h > 4 / 3:
                cw = min(w, round(h * 4 / 3))
            x0, y0 = (w - cw) // 2, (h - ch) // 2
            return (x0, y0, x0 + cw, y0 + ch), flip
        # resize the shorter side to s/0.875, centre crop s: the crop's box in the source
        r = s / 0.875 / min(w, h)
        rw, rh = max(s, round(w * r)), max(s, round(h * r))
        left, top = (rw - s) // 2, (rh - s) // 2
        return (left * w / rw, top * h / rh, (left + s) * w / rw, (top + s) * h / rh), False

    def _load(self, i: int, epoch: int, train: bool) -> np.ndarray:
        from podrun.train import decode

        path, _ = self.samples[i]
        try:
            data = self.read(i)
            w, h = decode.image_size(data, self.decoder)
            box, flip = self.box(i, w, h, epoch, train)
            arr = decode.crop_resize(data, self.decoder, box, self.image_size, flip, (w, h))
        except (OSError, decode.DecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
            raise _Undecodable(BadSample(str(path), i, f"cannot decode image ({why})")) from None
        return arr

    def read(self, i: int) -> bytes:
        """Sample i's encoded bytes (a file of the folder; podrun.train.shards reads them from a tar shard)."""
        with open(self.samples[i][0], "rb") as f:
            return f.read()

    def _good(self, i: int, epoch: int, train: bool) -> tuple[np.ndarray, int]:
        """Sample i, or under "skip" the first one after it that decodes; (image, label)."""
        n = len(self.samples)
        for k in range(n):
            j = (i + k) % n
            if j in self._bad:
                self.skipped.append(self._bad[j])
                continue
            try:
                return self._load(j, epoch, train), self.samples[j][1]
            except _Undecodable as exc:
                if self.bad_samples == "fail":
                    raise DataError(exc.bad.line(), hint="remove or replace the file, or pass --bad-samples skip "
                                                         "(each skipped file is counted and reported)") from None
                self._bad[j] = exc.bad
                self.skipped.append(exc.bad)
        raise DataError(f"{self.root}: no image in the split decodes", hint=TREE_HINT)

    def batch(self, indices, epoch, train):
        """(N, 3, S, S) uint8 in channels-last layout (the decoders' own: no copy to planar), labels."""
        s = self.image_size
        x = np.empty((len(indices), s, s, 3), dtype=np.uint8)
        y = np.empty(len(indices), dtype=np.int64)
        for k, i in enumerate(indices):
            x[k], y[k] = self._good(int(i), epoch, train)
        return torch.from_numpy(x).permute(0, 3, 1, 2), torch.from_numpy(y)

    def drain_skipped(self) -> list[BadSample]:
        out, self.skipped = self.skipped, []
        return out


class _Undecodable(Exception):
    def __init__(self, bad: BadSample):
        super().__init__(bad.line())
        self.bad = bad


def make_micro(ds: ImageDataset, epoch: int, indices: np.ndarray,
               train: bool = True) -> tuple[torch.Tensor, torch.Tensor, list]:
    """One micro batch: (x, y, the samples a ``--bad-samples skip`` dataset replaced in it)."""
    x, y = ds.batch(indices, epoch, train=train)
    drain = getattr(ds, "drain_skipped", None)
    return x, y, drain() if drain is not None else []
