"""Datasets (ImageNet-style folders, from podrun.train.images, CIFAR-10 batches, sklearn digits, synthetic) and the replica-sharded prefetching loader.

Samples travel as uint8 (N, 3, H, W) and are normalised on the device (see ``normalize``).

Sharding: at every update step the *global* batch is the same set of samples whatever the
decomposition. Epoch e shuffles the dataset with a permutation seeded by (seed, e); update step s
takes the global batch ``perm[s*G:(s+1)*G]`` (G = local batch x replicas x GA). Replica r takes the
contiguous slice ``[r*b*a, (r+1)*b*a)`` of it (disjoint shards) and feeds it as ``a`` micro batches
of ``b``. With a mean loss per micro batch, gradients divided by GA and averaged over replicas, the
update is the mean gradient over the same G samples: identical for 1x4, 2x2, 4x1. A position is
counted in global samples (``position``), so a run resumed on another split of the same G continues
the same sequence of global batches.
"""
from __future__ import annotations

import atexit
import os
import pickle
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch

from podrun.train.images import (IMAGENET_MEAN, IMAGENET_STD, TREE_HINT, DataError, FolderDataset, ImageDataset,
                                 make_micro)

# Test knob, for the step-split tests and bench only: "RANK=SECONDS,..." makes the named ranks' loader take that
# many seconds more per batch (an input-bound rank made on purpose). Unset in every real run.
TEST_INPUT_DELAY_ENV = "PODRUN_TEST_INPUT_DELAY"


def _test_input_delay() -> float:
    """This rank's extra seconds per batch under TEST_INPUT_DELAY_ENV (0.0 when unset or not named)."""
    rank = os.environ.get("RANK", "")
    for item in os.environ.get(TEST_INPUT_DELAY_ENV, "").split(","):
        name, _, value = item.partition("=")
        if name.strip() == rank and rank:
            try:
                return max(float(value), 0.0)
            except ValueError:
                return 0.0
    return 0.0


class ArrayDataset(ImageDataset):
    """In-memory uint8 images; train-time augmentation (pad-and-crop, optional flip) seeded per sample."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, num_classes: int, *, name: str,
                 mean=IMAGENET_MEAN, std=IMAGENET_STD, pad: int = 0, flip: bool = False, seed: int = 0):
        assert images.dtype == torch.uint8 and images.ndim == 4, images.shape
        self.images, self.labels = images.contiguous(), labels.long()
        self.num_classes, self.name, self.mean, self.std = num_classes, name, tuple(mean), tuple(std)
        self.pad, self.flip, self.seed = pad, flip, seed

    def __len__(self) -> int:
        return self.images.shape[0]

    def batch(self, indices, epoch, train):
        idx = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        x, y = self.images[idx], self.labels[idx]
        if train and (self.pad or self.flip):
            x = x.clone()
            h, w = x.shape[-2:]
            padded = torch.nn.functional.pad(x, (self.pad,) * 4) if self.pad else x
            for j, i in enumerate(idx.tolist()):
                rng = np.random.default_rng([self.seed, epoch, i])  # per sample: same on any decomposition
                dy, dx = (rng.integers(0, 2 * self.pad + 1, size=2) if self.pad else (0, 0))
                img = padded[j, :, dy:dy + h, dx:dx + w]
                if self.flip and rng.random() < 0.5:
                    img = img.flip(-1)
                x[j] = img
        return x, y


def _upscale(images: torch.Tensor, size: int) -> torch.Tensor:
    if images.shape[-1] == size:
        return images
    out = torch.nn.functional.interpolate(images.float(), size=(size, size), mode="bilinear", align_corners=False)
    return out.round().clamp_(0, 255).to(torch.uint8)


def _load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(images 1797x8x8 in 0..16, labels) from scikit-learn's bundled digits.csv.gz.

    The file is read directly (importing scikit-learn costs over a second per worker); load_digits()
    is the fallback when the file is not where scikit-learn keeps it.
    """
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("--data digits needs scikit-learn (its bundled digits set), which is not installed",
                        hint="pip install scikit-learn (or podrun[train])")
    f = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data" / "digits.csv.gz"
    if f.is_file():
        data = np.loadtxt(f, delimiter=",")
        return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.images, d.target


def digits(image_size: int = 32, val_fraction: float = 0.2) -> tuple[ArrayDataset, ArrayDataset]:
    """scikit-learn's bundled 8x8 digits (1,797 images, offline), upscaled to image_size, 3 channels."""
    images, target = _load_digits_arrays()
    imgs = torch.from_numpy((images * (255.0 / 16.0)).round().astype(np.uint8))[:, None]
    imgs = _upscale(imgs, image_size).expand(-1, 3, -1, -1).contiguous()
    labels = torch.from_numpy(target.astype(np.int64))
    perm = torch.from_numpy(np.random.default_rng(1234).permutation(len(labels)))
    n_val = int(round(len(labels) * val_fraction))
    tr, va = perm[n_val:], perm[:n_val]
    mean = float(imgs[tr].float().mean() / 255)
    std = float(imgs[tr].float().std() / 255)
    kw = dict(num_classes=10, mean=(mean,) * 3, std=(std,) * 3)
    return (ArrayDataset(imgs[tr], labels[tr], name="digits", pad=max(1, image_size // 16), **kw),
            ArrayDataset(imgs[va], labels[va], name="digits", **kw))


CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


def cifar10(path: str | os.PathLike) -> tuple[ArrayDataset, ArrayDataset]:
    """CIFAR-10 python batches: data_batch_1..5 and test_batch (in PATH or PATH/cifar-10-batches-py)."""
    root = Path(path)
    if (root / "cifar-10-batches-py").is_dir():
        root = root / "cifar-10-batches-py"
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    missing = [n for n in names if not (root / n).is_file()]
    if missing:
        raise DataError(f"{root}: not a CIFAR-10 python dataset: missing {', '.join(missing)}",
                        hint="expected the files data_batch_1..data_batch_5 and test_batch from "
                             "cifar-10-python.tar.gz (extract it and pass the folder)")

    def load(name):
        f = root / name
        try:
            with open(f, "rb") as fh:
                d = pickle.load(fh, encoding="bytes")
            data = np.asarray(d[b"data"], dtype=np.uint8)
            labels = np.asarray(d[b"labels"], dtype=np.int64)
            if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
                raise ValueError(f"data has shape {data.shape}, labels {len(labels)}")
        except Exception as exc:
            raise DataError(f"{f}: malformed CIFAR-10 batch ({type(exc).__name__}: {exc})",
                            hint="expected a pickled dict with b'data' (N x 3072 uint8) and b'labels'") from None
        return torch.from_numpy(data.reshape(-1, 3, 32, 32)), torch.from_numpy(labels)

    parts = [load(n) for n in names[:5]]
    xt, yt = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    xv, yv = load("test_batch")
    kw = dict(num_classes=10, name="cifar10", mean=CIFAR_MEAN, std=CIFAR_STD)
    return ArrayDataset(xt, yt, pad=4, flip=True, **kw), ArrayDataset(xv, yv, **kw)


def image_folders(path: str | os.PathLike, image_size: int, bad_samples: str = "fail") -> tuple[FolderDataset, FolderDataset]:
    root = Path(path)
    if not root.is_dir():
        raise DataError(f"{root}: dataset folder not found",
                        hint="pass --data digits, --data synthetic, a CIFAR-10 folder or an ImageNet-style folder")
    for split in ("train", "val"):
        if not (root / split).is_dir():
            raise DataError(f"{root}: missing the {split}/ folder", hint=TREE_HINT)
    train = FolderDataset(root / "train", image_size, bad_samples=bad_samples)
    return train, FolderDataset(root / "val", image_size, classes=train.classes, bad_samples=bad_samples)


class SyntheticDataset(ImageDataset):
    """Random uint8 images of the right shape (a small pool, reused) for throughput runs."""

    def __init__(self, size: int, image_size: int, num_classes: int, seed: int = 0, pool: int = 64):
        g = torch.Generator().manual_seed(seed)
        self.n, self.num_classes, self.name = size, num_classes, "synthetic"
        self.pool = torch.randint(0, 256, (pool, 3, image_size, image_size), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, num_classes, (size,), generator=g)

    def __len__(self):
        return self.n

    def batch(self, indices, epoch, train):
        idx = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        return self.pool[idx % self.pool.shape[0]], self.labels[idx]


def load_dataset(spec: str, *, image_size: int, num_classes: int, synthetic_size: int = 10_000,
                 seed: int = 0, bad_samples: str = "fail") -> tuple[ImageDataset, ImageDataset]:
    """``digits`` | ``synthetic`` | a CIFAR-10 folder | an ImageNet-style folder -> (train, val)."""
    if spec == "digits":
        return digits(image_size)
    if spec == "synthetic":
        return (SyntheticDataset(synthetic_size, image_size, num_classes, seed),
                SyntheticDataset(max(1, synthetic_size // 10), image_size, num_classes, seed + 1))
    root = Path(spec)
    if not root.exists():
        raise DataError(f"{spec}: dataset path does not exist",
                        hint="pass digits, synthetic, a CIFAR-10 folder (data_batch_1..5, test_batch) "
                             "or an ImageNet-style folder (train/<class>/*.jpg, val/<class>/*.jpg)")
    if any((root / n).exists() for n in ("data_batch_1", "test_batch", "cifar-10-batches-py")):
        return cifar10(root)
    from podrun.train import shards

    if shards.is_shards(root / "train"):      # `podrun data pack` output: train/ and val/ of tar shards
        if not shards.is_shards(root / "val"):
            raise DataError(f"{root}: shards of train/ but no val/{shards.INDEX}", hint="pack the val/ split too")
        train = shards.ShardDataset(root / "train", image_size, bad_samples=bad_samples)
        return train, shards.ShardDataset(root / "val", image_size, bad_samples=bad_samples, classes=train.classes)
    return image_folders(root, image_size, bad_samples)


@dataclass(frozen=True)
class Shard:
    """How this worker cuts each global batch: replicas [offset, offset+local) of ``replicas``."""

    local_batch: int
    grad_accum: int
    replicas: int
    replica_offset: int
    local_replicas: int = 1

    @property
    def global_batch(self) -> int:
        return self.local_batch * self.replicas * self.grad_accum


def steps_per_epoch(n: int, shard: Shard) -> int:
    s = n // shard.global_batch
    if s < 1:
        raise DataError(f"the dataset has {n} samples, fewer than one global batch of {shard.global_batch}",
                        hint="lower the global batch (--global-batch / --local-batch) or use more data")
    return s


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """The order of epoch ``epoch``: a function of the seed and the epoch only, never of the decomposition."""
    return np.random.default_rng([seed, 7919, epoch]).permutation(n)


def position(samples: int, global_batch: int, n: int) -> tuple[int, int]:
    """(epoch, update step within it) after ``samples`` training samples; an epoch holds n // G global batches."""
    if samples % global_batch:
        raise ValueError(f"{samples} samples is not on a boundary of global batch {global_batch}")
    step, per_epoch = samples // global_batch, n // global_batch
    return step // per_epoch, step % per_epoch


def step_indices(perm: np.ndarray, step: int, shard: Shard) -> list[np.ndarray]:
    """This worker's micro batches of update ``step``: a list of GA arrays, each local_batch x local_replicas.

    The fixed layout: global batch ``perm[step*G:(step+1)*G]``; replica r's part starts at r*b*a, and its
    micro step j takes ``[r*b*a + j*b, r*b*a + (j+1)*b)`` of the global batch.
    """
    g = perm[step * shard.global_batch:(step + 1) * shard.global_batch]
    b, a = shard.local_batch, shard.grad_accum
    mine = [g[(shard.replica_offset + k) * b * a:(shard.replica_offset + k + 1) * b * a]
            for k in range(shard.local_replicas)]
    return [np.concatenate([m[j * b:(j + 1) * b] for m in mine]) for j in range(a)]


class Loader:
    """Iterates (epoch, step, [(x_uint8, y) per micro batch]) from a start position.

    ``workers`` > 0: that many forked loader processes decode and augment the micro batches in parallel
    (podrun.train.data_pool), in order, with no prefetch thread of its own. 0: in this process, prefetched by a
    thread when ``prefetch`` > 0. Either way the batches are the same: each sample's augmentation is seeded by
    (seed, epoch, index), never by who decodes it. ``on_skip(BadSample)`` hears of every sample a dataset read with
    ``--bad-samples skip`` replaced. ``transform(x)``, when given, runs on each micro batch in this process (the
    device decoder of podrun.train.data_device)."""

    def __init__(self, dataset: ImageDataset, shard: Shard, *, seed: int, start_epoch: int = 0,
                 start_step: int = 0, epochs: int | None = None, prefetch: int = 3, pin_memory: bool = False,
                 workers: int = 0, on_skip=None, transform=None):
        self.ds, self.shard, self.seed, self.prefetch, self.pin = dataset, shard, seed, prefetch, pin_memory
        self.start_epoch, self.start_step, self.epochs = start_epoch, start_step, epochs
        self.workers, self.on_skip, self.transform = workers, on_skip, transform
        self.steps_per_epoch = steps_per_epoch(len(dataset), shard)

    def keys(self) -> Iterator[tuple[int, int, int, np.ndarray]]:
        """(epoch, step, micro step, sample indices) of every micro batch from the start position on."""
        epoch, step = self.start_epoch, self.start_step
        while self.epochs is None or epoch < self.epochs:
            perm = epoch_permutation(len(self.ds), self.seed, epoch)
            while step < self.steps_per_epoch:
                for j, ix in enumerate(step_indices(perm, step, self.shard)):
                    yield epoch, step, j, ix
                step += 1
            epoch, step = epoch + 1, 0

    def _micro(self) -> Iterator[tuple[int, int, int, torch.Tensor, torch.Tensor, list]]:
        if self.workers > 0:
            from podrun.train.data_pool import pooled

            yield from pooled(self.ds, self.keys(), self.workers, pin_memory=self.pin)
            return
        for key in self.keys():
            x, y, skipped = make_micro(self.ds, key[0], key[3])
            if self.pin:
                x, y = x.pin_memory(), y.pin_memory()
            yield (*key[:3], x, y, skipped)

    def _produce(self) -> Iterator:
        delay = _test_input_delay()
        micro: list = []
        for epoch, step, j, x, y, skipped in self._micro():
            for bad in skipped:
                if self.on_skip is not None:
                    self.on_skip(bad)
            micro.append((x if self.transform is None else self.transform(x), y))
            if j == self.shard.grad_accum - 1:
                if delay > 0:
                    time.sleep(delay)
                yield epoch, step, micro
                micro = []

    def __iter__(self):
        if self.prefetch <= 0 or self.workers > 0:  # synchronous: no thread (the workers prefetch)
            yield from self._produce()
            return
        q: queue.Queue = queue.Queue(maxsize=max(1, self.prefetch))
        stop = threading.Event()
        END = object()

        def offer(item) -> bool:
            """Put item unless the consumer has stopped (then False): a full queue never blocks the thread."""
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def work():
            try:
                for item in self._produce():
                    if not offer(item):
                        return
                offer(END)
            except BaseException as exc:  # surfaced in the consumer
                offer(exc)

        t = threading.Thread(target=work, name="podrun-prefetch", daemon=True)
        t.start()
        _PREFETCHERS[t] = stop
        try:
            for item in iter(q.get, END):
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            # joined, not left running: a daemon thread still inside torch when the interpreter exits
            # aborts the process ("terminate called without an active exception", exit -6)
            stop.set()
            t.join()
            _PREFETCHERS.pop(t, None)


# prefetch threads still running -> their stop events; an iterator kept alive by a traceback until the
# interpreter exits is stopped here, before finalisation, for the same reason as in Loader.__iter__
_PREFETCHERS: dict[threading.Thread, threading.Event] = {}


@atexit.register
def _stop_prefetchers() -> None:
    for t, stop in list(_PREFETCHERS.items()):
        stop.set()
        t.join()


def eval_batches(dataset: ImageDataset, batch: int, rank: int, world: int, on_skip=None, workers: int = 0):
    """The validation split sharded round-robin by rank (every sample counted once overall); ``on_skip`` and
    ``workers`` (loader processes that decode it) as for Loader."""
    idx = np.arange(rank, len(dataset), world)
    keys = ((0, k, 0, idx[i:i + batch]) for k, i in enumerate(range(0, len(idx), batch)))
    if workers > 0 and len(idx) > 0:
        from podrun.train.data_pool import pooled

        made = ((x, y, skipped) for _, _, _, x, y, skipped in pooled(dataset, keys, workers, train=False))
    else:
        made = (make_micro(dataset, 0, ix, train=False) for _, _, _, ix in keys)
    for x, y, skipped in made:
        for bad in skipped:
            if on_skip is not None:
                on_skip(bad)
        yield x, y


def normalize(x: torch.Tensor, mean: Sequence[float], std: Sequence[float], dtype=torch.float32,
              channels_last: bool = False) -> torch.Tensor:
    """uint8 (N, C, H, W) on the device -> normalised float."""
    m = torch.tensor(mean, device=x.device, dtype=torch.float32).view(1, -1, 1, 1) * 255
    s = torch.tensor(std, device=x.device, dtype=torch.float32).view(1, -1, 1, 1) * 255
    out = (x.float() - m) / s
    if channels_last:
        out = out.contiguous(memory_format=torch.channels_last)
    return out.to(dtype)
