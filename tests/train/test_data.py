"""Datasets (CIFAR-10 batches, ImageNet-style folders, digits, synthetic), their errors, and replica sharding."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from podrun.train.data import (DataError, Loader, Shard, digits, epoch_permutation, load_dataset, normalize,
                               step_indices)


def _write_cifar(root, n=20, bad=None):
    root.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        d = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), b"labels": list(rng.integers(0, 10, n))}
        if name == bad:
            d = {b"data": np.zeros((n, 100), dtype=np.uint8), b"labels": [0] * n}
        with open(root / name, "wb") as f:
            pickle.dump(d, f)


def test_cifar10_batches(tmp_path):
    _write_cifar(tmp_path / "c")
    train, val = load_dataset(str(tmp_path / "c"), image_size=32, num_classes=10)
    assert (len(train), len(val), train.num_classes) == (100, 20, 10)
    x, y = train.batch([0, 5, 99], epoch=0, train=True)
    assert x.dtype == torch.uint8 and x.shape == (3, 3, 32, 32) and y.dtype == torch.long
    xv, _ = val.batch([0, 1], 0, train=False)
    raw = pickle.load(open(tmp_path / "c" / "test_batch", "rb"), encoding="bytes")[b"data"][:2]
    assert torch.equal(xv, torch.from_numpy(raw.reshape(2, 3, 32, 32)))


def test_cifar10_missing_and_malformed(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "data_batch_1").write_bytes(b"")
    with pytest.raises(DataError, match=r"empty: not a CIFAR-10 python dataset: missing data_batch_2.*test_batch"):
        load_dataset(str(tmp_path / "empty"), image_size=32, num_classes=10)
    _write_cifar(tmp_path / "bad", bad="data_batch_3")
    with pytest.raises(DataError, match=r"data_batch_3: malformed CIFAR-10 batch"):
        load_dataset(str(tmp_path / "bad"), image_size=32, num_classes=10)


def test_image_folders(tmp_path):
    from PIL import Image

    for split, n in (("train", 3), ("val", 1)):
        for c, color in (("cat", (255, 0, 0)), ("dog", (0, 0, 255))):
            (tmp_path / "ds" / split / c).mkdir(parents=True)
            for i in range(n):
                Image.new("RGB", (40 + i, 30), color).save(tmp_path / "ds" / split / c / f"{i}.png")
    train, val = load_dataset(str(tmp_path / "ds"), image_size=16, num_classes=2)
    assert (len(train), len(val), train.classes) == (6, 2, ["cat", "dog"])
    x, y = train.batch(range(6), epoch=1, train=True)
    assert x.shape == (6, 3, 16, 16) and x.dtype == torch.uint8 and y.tolist() == [0, 0, 0, 1, 1, 1]
    assert x[0, 0].float().mean() > 250 and x[5, 2].float().mean() > 250
    x2, _ = train.batch(range(6), epoch=1, train=True)
    assert torch.equal(x, x2)      # augmentation seeded per (epoch, sample)
    (tmp_path / "ds" / "train" / "dog" / "broken.jpg").write_bytes(b"not a jpeg")
    train, _ = load_dataset(str(tmp_path / "ds"), image_size=16, num_classes=2)
    with pytest.raises(DataError, match="broken.jpg: cannot decode image"):
        train.batch(range(len(train)), 0, True)


@pytest.mark.parametrize("spec,match", [
    ("/nonexistent/imagenet", "dataset path does not exist"),
])
def test_missing_dataset_path(spec, match):
    with pytest.raises(DataError, match=match):
        load_dataset(spec, image_size=32, num_classes=10)


def test_folder_without_val_split(tmp_path):
    (tmp_path / "ds" / "train" / "a").mkdir(parents=True)
    with pytest.raises(DataError, match=r"ds: missing the val/ folder"):
        load_dataset(str(tmp_path / "ds"), image_size=32, num_classes=10)


def test_digits_offline_and_normalised_on_device():
    train, val = digits(16)
    assert (len(train), len(val)) == (1438, 359) and train.images.shape[1:] == (3, 16, 16)
    x = normalize(train.images[:256], train.mean, train.std)
    assert x.dtype == torch.float32 and abs(x.mean().item()) < 0.2 and 0.8 < x.std().item() < 1.2
    assert set(train.labels.tolist()) == set(range(10))


def test_synthetic_and_too_small_dataset():
    train, _ = load_dataset("synthetic", image_size=24, num_classes=7, synthetic_size=40)
    x, y = train.batch([0, 39], 0, True)
    assert x.shape == (2, 3, 24, 24) and int(y.max()) < 7
    with pytest.raises(DataError, match="fewer than one global batch of 64"):
        Loader(train, Shard(local_batch=8, grad_accum=2, replicas=4, replica_offset=0), seed=0)


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 4), r=st.sampled_from([1, 2, 4]), a=st.sampled_from([1, 2, 3]), step=st.integers(0, 3),
       seed=st.integers(0, 5))
def test_shards_are_disjoint_and_make_the_same_global_batch(b, r, a, step, seed):
    perm = epoch_permutation(100, seed, 2)
    g = b * r * a
    if (step + 1) * g > 100:
        return
    shards = [step_indices(perm, step, Shard(b, a, r, k)) for k in range(r)]
    assert all(len(s) == a and all(len(m) == b for m in s) for s in shards)
    flat = np.concatenate([np.concatenate(s) for s in shards])
    assert len(set(flat.tolist())) == g                               # disjoint
    assert sorted(flat.tolist()) == sorted(perm[step * g:(step + 1) * g].tolist())   # the same global batch
    # the same global batch as one replica with r x more accumulation
    one = np.concatenate(step_indices(perm, step, Shard(b, a * r, 1, 0)))
    assert sorted(one.tolist()) == sorted(flat.tolist())


def test_loader_prefetch_resumes_mid_epoch():
    train, _ = load_dataset("synthetic", image_size=8, num_classes=3, synthetic_size=48)
    shard = Shard(4, 1, 2, 1)
    full = [(e, s, m[0][1].tolist()) for (e, s, m), _ in zip(Loader(train, shard, seed=1, epochs=2), range(12))]
    late = [(e, s, m[0][1].tolist()) for e, s, m in Loader(train, shard, seed=1, start_epoch=1, start_step=2, epochs=2)]
    assert [(e, s) for e, s, _ in full][:7] == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (1, 0)]
    assert late == full[8:]


class _SlowSplit:
    """A split whose batches take a while: the prefetch thread is busy producing when the consumer stops."""

    def __init__(self, n: int, seconds: float):
        self.n, self.seconds = n, seconds

    def __len__(self):
        return self.n

    def batch(self, ix, epoch, train=True):
        import time

        time.sleep(self.seconds)
        return torch.zeros(len(ix), 3, 2, 2, dtype=torch.uint8), torch.zeros(len(ix), dtype=torch.long)


def _prefetchers():
    import threading

    return [t for t in threading.enumerate() if t.name == "podrun-prefetch"]


@pytest.mark.parametrize("taken", [0, 1, 3])
def test_a_closed_loader_leaves_no_prefetch_thread_running(taken):
    """The prefetch thread is joined when the loader's iterator is closed, even while it is producing a batch
    or waiting on a full queue. Left running, a daemon thread inside torch when the interpreter exits aborted
    the worker after its last step ("terminate called without an active exception", exit -6)."""
    assert _prefetchers() == []
    shard = Shard(local_batch=1, grad_accum=1, replicas=1, replica_offset=0, local_replicas=1)
    it = iter(Loader(_SlowSplit(64, 0.3), shard, seed=0, prefetch=1))
    for _ in range(taken + 1):
        next(it)
    it.close()
    assert _prefetchers() == [], "the prefetch thread outlived its loader"


def test_a_loader_still_held_at_exit_is_stopped_before_the_interpreter_finalises():
    """An iterator kept alive past its loop (by a traceback, or a variable until exit) is stopped by the
    atexit hook that runs before finalisation."""
    from podrun.train import data

    shard = Shard(local_batch=1, grad_accum=1, replicas=1, replica_offset=0, local_replicas=1)
    it = iter(Loader(_SlowSplit(64, 0.3), shard, seed=0, prefetch=1))
    next(it)
    assert len(_prefetchers()) == 1
    data._stop_prefetchers()
    assert _prefetchers() == [], "the atexit hook left the prefetch thread running"
    it.close()
    assert data._PREFETCHERS == {}
