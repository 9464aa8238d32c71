"""The input pipeline measured alone (`podrun data bench`): a recipe's decode and augmentation over a folder of images
on this host, with no model, as images per second for each number of loader workers."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

from podrun.proctl import stat_fields
from podrun.train.data import DataError
from podrun.wire.worker_env import cpu_share, cpus_here


@dataclass(frozen=True)
class BenchRow:
    workers: int                    # 0: decoded in the rank's own thread (no worker process)
    images: int
    seconds: float
    cpu_seconds: float | None = None    # this process's and its workers' CPU time over the same images

    @property
    def images_per_second(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        per = self.images_per_second / self.workers if self.workers > 0 else self.images_per_second
        cpu = None if self.cpu_seconds is None else round(self.cpu_seconds / self.images * 1000, 3)
        return {"workers": self.workers, "images": self.images, "seconds": round(self.seconds, 4),
                "images_per_second": round(self.images_per_second, 1), "images_per_second_per_worker": round(per, 1),
                "cpu_ms_per_image": cpu}


def cpu_seconds(pids: list[int]) -> float | None:
    """User + system CPU seconds of these processes so far (Linux /proc; None elsewhere or when one has ended)."""
    stats = [stat_fields(pid) for pid in pids]     # utime and stime: fields 14 and 15 of /proc/<pid>/stat
    if any(fields is None or len(fields) < 13 for fields in stats):
        return None
    return sum(int(fields[11]) + int(fields[12]) for fields in stats) / os.sysconf("SC_CLK_TCK")


def host_cores(local_world_size: int = 1) -> int:
    """The cores of this rank's host that podrun's workers share: each rank's share (PODRUN_CPUS) times the ranks
    on the host where podrun set one, else the cores this process may run on."""
    share = cpu_share()
    return share * max(1, local_world_size) if share is not None else len(os.sched_getaffinity(0))


def slowest(records: list[dict]) -> dict:
    """Several hosts' bench records of the same worker counts as one: each count's slowest host's row."""
    rows = []
    for i, row in enumerate(records[0]["rows"]):
        rows.append(min((r["rows"][i] for r in records), key=lambda x: x["images_per_second"]))
    return {**records[0], "rows": rows, "cores": min(r["cores"] for r in records), "hosts": len(records)}


def default_counts(cores: int) -> list[int]:
    """0 (the rank alone), then 1, 2, 4 ... up to the cores, and the cores themselves."""
    counts, n = [0], 1
    while n < cores:
        counts.append(n)
        n *= 2
    return counts + [cores]


def train_split(data: str, image_size: int, bad_samples: str = "fail", decoder: str | None = None):
    """The training split of an ImageNet-style folder or of its tar shards (``data`` itself or its train/)."""
    from pathlib import Path

    from podrun.train.data import FolderDataset
    from podrun.train.shards import ShardDataset, is_shards

    root = Path(data)
    if (root / "train").is_dir():
        root = root / "train"
    if not root.is_dir():
        raise DataError(f"{data}: no such folder", hint="pass an ImageNet-style folder (train/<class>/*.jpg)")
    if is_shards(root):
        return ShardDataset(root, image_size, bad_samples=bad_samples, decoder=decoder)
    return FolderDataset(root, image_size, bad_samples=bad_samples, decoder=decoder)


def measure(ds, workers: int, *, batch: int, images: int, seed: int = 0) -> BenchRow:
    """Time ``images`` training samples (after one warm-up batch, which starts the workers) in batches of ``batch``."""
    from podrun.train.data import Loader, Shard
    from podrun.train.data_pool import worker_pids

    shard = Shard(local_batch=batch, grad_accum=1, replicas=1, replica_offset=0)
    steps = max(1, -(-images // batch))
    it = iter(Loader(ds, shard, seed=seed, prefetch=0, workers=workers))
    try:
        next(it)
        pids = [os.getpid(), *worker_pids()]
        c0, t0 = cpu_seconds(pids), time.perf_counter()
        for _ in range(steps):
            next(it)
        dt, c1 = time.perf_counter() - t0, cpu_seconds(pids)
    finally:
        it.close()
    return BenchRow(workers, steps * batch, dt, None if c0 is None or c1 is None else c1 - c0)


def bench(data: str, image_size: int, counts: list[int], *, batch: int = 32, images: int = 256,
          decoder: str | None = None, bad_samples: str = "fail") -> dict:
    """The data bench's record: the decoder, the host's cores and one row per worker count."""
    ds = train_split(data, image_size, bad_samples, decoder)
    if len(ds) < batch:
        raise DataError(f"{data}: {len(ds)} training images, fewer than one batch of {batch}",
                        hint="pass a smaller --batch or a larger folder")
    rows = [measure(ds, w, batch=batch, images=images).to_dict() for w in counts]
    return {"data": str(data), "images_in_split": len(ds), "image_size": image_size, "batch": batch,
            "decoder": ds.decoder, "cores": cpus_here(), "rows": rows}
