"""The input pipeline on this machine: `podrun data bench` for the resnet50 recipe (decode, random-resized crop to
224, flip; 2 loader workers) beside torch's DataLoader(num_workers=2) over an ImageFolder-style PIL dataset doing the
same, and beside podrun's loader before its workers (PIL in the rank's one thread); then the decoders one core
gives (PIL, PIL with draft, simplejpeg, PyTurboJPEG where installed), decode only; and the metadata system calls
an epoch costs from the folder and from its tar shards (strace).

    python -m bench data            # 400 JPEGs of 500x375 (~96 KB), 5 interleaved rounds of 256 images each
    python -m bench --quick data    # 64 JPEGs, 1 round of 64 images

Each subject runs in a process of its own and times its images after one warm-up batch (which starts its
workers); the rounds interleave the subjects so the load of the machine's other users falls on each alike, and the
load average is in the notes.
"""
from __future__ import annotations

import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.rows import row, scratch

HERE = Path(__file__).resolve().parent
BATCH, SIZE, WORKERS = 32, 224, 2


# -- the peers, each run in its own process (`python -m bench.bench_data SUBJECT DATA IMAGES BATCH`) -------------

class TorchImageFolder:
    """torchvision's ImageFolder + RandomResizedCrop(224) + RandomHorizontalFlip as plain PIL (no CPU torchvision
    here for this torch): decode, crop with torchvision's scale (0.08, 1) and ratio (3/4, 4/3), resize bilinear,
    flip half the time; an (3, 224, 224) uint8 tensor and the class."""

    def __init__(self, root: Path):
        classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.samples = [(f, i) for i, c in enumerate(classes) for f in sorted((root / c).iterdir())]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        import math
        import random

        import numpy as np
        import torch
        from PIL import Image

        path, label = self.samples[i]
        with open(path, "rb") as f:
            im = Image.open(f).convert("RGB")
        w, h = im.size
        area = w * h
        for _ in range(10):
            target = area * random.uniform(0.08, 1.0)
            ar = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
            cw, ch = int(round(math.sqrt(target * ar))), int(round(math.sqrt(target / ar)))
            if 0 < cw <= w and 0 < ch <= h:
                x0, y0 = random.randint(0, w - cw), random.randint(0, h - ch)
                break
        else:
            cw, ch, x0, y0 = w, h, 0, 0
        im = im.resize((SIZE, SIZE), Image.BILINEAR, box=(x0, y0, x0 + cw, y0 + ch))
        if random.random() < 0.5:
            im = im.transpose(Image.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.asarray(im, dtype=np.uint8).copy()).permute(2, 0, 1), label


def _old_load(ds, i: int, epoch: int):
    """podrun's FolderDataset._load before the loader workers (commit 67b9027): PIL in the rank's thread."""
    import numpy as np
    import torch
    from PIL import Image

    path, _ = ds.samples[i]
    with Image.open(path) as im:
        im = im.convert("RGB")
        s = ds.image_size
        w, h = im.size
        rng = np.random.default_rng([ds.seed, epoch, i])
        frac = rng.uniform(0.35, 1.0)
        cw, ch = max(1, int(w * frac ** 0.5)), max(1, int(h * frac ** 0.5))
        x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        im = im.resize((s, s), Image.BILINEAR, box=(x0, y0, x0 + cw, y0 + ch))
        if rng.random() < 0.5:
            im = im.transpose(Image.FLIP_LEFT_RIGHT)
        arr = np.asarray(im, dtype=np.uint8)
    return torch.from_numpy(arr.copy()).permute(2, 0, 1)


def _peer(subject: str, data: Path, images: int, batch: int) -> tuple[float, float | None]:
    """(img/s, CPU ms per image over this process and its workers) of one peer over ``images`` after a warm-up
    batch."""
    import multiprocessing

    import torch

    from podrun.train.data_bench import cpu_seconds

    torch.set_num_threads(1)
    if subject == "torch":
        loader = torch.utils.data.DataLoader(TorchImageFolder(data / "train"), batch_size=batch, shuffle=True,
                                             num_workers=WORKERS, drop_last=True)
        it, n = iter(_forever(loader)), 0
        next(it)
        pids = [os.getpid(), *(p.pid for p in multiprocessing.active_children())]
        c0, t0 = cpu_seconds(pids), time.perf_counter()
        while n < images:
            n += len(next(it)[0])
        return n / (time.perf_counter() - t0), _per_image(c0, cpu_seconds(pids), n)
    from podrun.train.data import FolderDataset, epoch_permutation

    ds = FolderDataset(data / "train", SIZE, decoder="pil")
    perm = [int(i) for e in range(100) for i in epoch_permutation(len(ds), 0, e)]
    stack = lambda ix: torch.stack([_old_load(ds, i, 0) for i in ix])  # noqa: E731
    stack(perm[:batch])
    c0, t0, n = cpu_seconds([os.getpid()]), time.perf_counter(), 0
    while n < images:
        n += len(stack(perm[batch + n:2 * batch + n]))
    return n / (time.perf_counter() - t0), _per_image(c0, cpu_seconds([os.getpid()]), n)


def _per_image(c0, c1, n: int) -> float | None:
    return None if c0 is None or c1 is None else (c1 - c0) / n * 1000


def _forever(loader):
    while True:
        yield from loader


def _decoders(data: Path, images: int) -> dict[str, float]:
    """Decode-only img/s of each decoder on one core (the same files, in turn)."""
    import numpy as np
    from PIL import Image

    files = sorted((data / "train").rglob("*.jpg"))[:images]
    blobs = [f.read_bytes() for f in files]

    def pil(b):
        return np.asarray(Image.open(io.BytesIO(b)).convert("RGB"))

    def pil_draft(b):       # what a 224 crop of at most half the source needs: DCT scaling by 1/2
        im = Image.open(io.BytesIO(b))
        im.draft("RGB", (im.size[0] // 2, im.size[1] // 2))
        return np.asarray(im.convert("RGB"))

    subjects = {"PIL": pil, "PIL + draft (1/2)": pil_draft}
    try:
        import simplejpeg

        subjects["simplejpeg"] = lambda b: simplejpeg.decode_jpeg(b, colorspace="RGB")
        subjects["simplejpeg (1/2)"] = lambda b: simplejpeg.decode_jpeg(b, colorspace="RGB", min_width=250,
                                                                        min_height=187)
    except ImportError:
        pass
    try:
        import turbojpeg

        tj = turbojpeg.TurboJPEG()
        subjects["PyTurboJPEG"] = lambda b: tj.decode(b, pixel_format=turbojpeg.TJPF_RGB)
    except (ImportError, RuntimeError, OSError):
        pass
    out: dict[str, list[float]] = {k: [] for k in subjects}
    for _ in range(3):
        for name, fn in subjects.items():
            t0 = time.perf_counter()
            for b in blobs:
                fn(b)
            out[name].append(len(blobs) / (time.perf_counter() - t0))
    return {k: statistics.median(v) for k, v in out.items()}


def _epochs(data: Path, epochs: int) -> None:
    """Read ``epochs`` epochs of the training split in this process (strace counts its metadata operations)."""
    from podrun.train.data import Loader, Shard, load_dataset

    train, _ = load_dataset(str(data), image_size=16, num_classes=1000)
    for _ in Loader(train, Shard(8, 1, 1, 0), seed=0, epochs=epochs, prefetch=0):
        pass


METADATA = "open,openat,stat,newfstatat,statx,lstat,access,getdents64"


def _metadata_per_epoch(data: Path) -> float | None:
    """Metadata system calls per epoch of the training split: (3 epochs - 1 epoch) / 2 under strace (the imports
    and the first opens fall in both and cancel); None without strace."""
    import shutil
    import tempfile

    if shutil.which("strace") is None:
        return None
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    counts = []
    for epochs in (1, 3):
        with tempfile.NamedTemporaryFile(prefix="podrun-bench-strace-") as log:
            subprocess.run(["strace", "-f", "-qq", "-e", f"trace={METADATA}", "-o", log.name, sys.executable, "-m",
                            "bench.bench_data", "epochs", str(data), str(epochs)], check=True, env=env,
                           cwd=HERE.parent, capture_output=True, timeout=900)
            counts.append(sum(1 for _ in open(log.name)))
    return (counts[1] - counts[0]) / 2


# -- the benchmark -------------------------------------------------------------------------------------------------

def _podrun(data: Path, images: int) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    cp = subprocess.run([sys.executable, "-m", "podrun", "data", "bench", "--recipe", "resnet50", "--data", str(data),
                         "--workers", str(WORKERS), "--batch", str(BATCH), "--images", str(images), "--json"],
                        capture_output=True, text=True, timeout=900, env=env)
    if cp.returncode != 0:
        raise RuntimeError(f"podrun data bench exited {cp.returncode}: {cp.stderr[-2000:]}")
    rec = json.loads(cp.stdout)
    return rec["rows"][0]["images_per_second"], rec["rows"][0]["cpu_ms_per_image"], rec["decoder"]


def _run_peer(subject: str, data: Path, images: int) -> tuple[float, float | None]:
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    cp = subprocess.run([sys.executable, "-m", "bench.bench_data", subject, str(data), str(images), str(BATCH)],
                        capture_output=True, text=True, timeout=900, env=env, cwd=HERE.parent)
    if cp.returncode != 0:
        raise RuntimeError(f"peer {subject} exited {cp.returncode}: {cp.stderr[-2000:]}")
    rate, cpu = cp.stdout.split()[-2:]
    return float(rate), None if cpu == "None" else float(cpu)


def run(quick: bool) -> list[dict]:
    from bench.jpeg_tree import make_tree

    n_images, timed, rounds = (64, 64, 1) if quick else (400, 256, 5)
    ours, torch_dl, old, loads = [], [], [], []
    cpu: dict[str, list[float]] = {"podrun": [], "torch": [], "old": []}
    with scratch("data") as d:
        tree = make_tree(d / "tree", classes=4, train_per_class=n_images // 4, val_per_class=1)
        for i in range(rounds):
            loads.append(os.getloadavg()[0])
            subjects = [("podrun", ours), ("torch", torch_dl), ("old", old)]
            for name, out in subjects[i % 3:] + subjects[:i % 3]:       # each first in turn
                if name == "podrun":
                    rate, ms, decoder = _podrun(tree, timed)
                else:
                    rate, ms = _run_peer(name, tree, timed)
                out.append(rate)
                if ms is not None:
                    cpu[name].append(ms)
        loads.append(os.getloadavg()[0])
        dec = _decoders(tree, min(n_images, 120))
        from podrun.train.shards import pack

        pack(tree, d / "shards", shard_size=100)
        meta = {"folder": _metadata_per_epoch(tree), "shards": _metadata_per_epoch(d / "shards")}
    load = f"load average {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores"
    fmt = lambda v: ", ".join(f"{x:.1f}" for x in v)  # noqa: E731
    pipe = (f"{n_images} JPEGs 500x375 (~96 KB), batch {BATCH}, {timed} images a run after 1 warm-up batch, "
            f"median of {rounds} interleaved round(s); {load}")
    rows = [row("resnet50 input pipeline (decode, random-resized crop 224, flip): img/s",
                f"podrun data bench --workers {WORKERS} ({decoder})", ours, "img/s",
                f"{pipe}; runs podrun {fmt(ours)}, torch {fmt(torch_dl)}", f"torch DataLoader(num_workers={WORKERS}), "
                "ImageFolder-style PIL", torch_dl, digits=1),
            row("resnet50 input pipeline: img/s", f"podrun data bench --workers {WORKERS} ({decoder})", ours, "img/s",
                f"{pipe}; runs before {fmt(old)}; goal >= 1.8x", "podrun's loader before (PIL, the rank's one thread)",
                old, digits=1)]
    for peer, name in (("torch", f"torch DataLoader(num_workers={WORKERS}), ImageFolder-style PIL"),
                       ("old", "podrun's loader before (PIL, the rank's one thread)")):
        rows.append(row("resnet50 input pipeline: CPU ms per image (lower is better; the load of others left out)",
                        f"podrun data bench --workers {WORKERS} ({decoder})", cpu["podrun"] or None, "ms",
                        f"user+system CPU of the process and its workers over the timed images, median of {rounds}; "
                        f"runs podrun {fmt(cpu['podrun'])}, {peer} {fmt(cpu[peer])}", name, cpu[peer] or None,
                        digits=2))
    if meta["folder"] is not None:
        rows.append(row("metadata system calls per epoch (strace: open, stat, access, getdents ...)",
                        "tar shards (podrun data pack --shard-size 100)", meta["shards"], "calls",
                        f"{n_images} training images; (3 epochs - 1 epoch) / 2 in one process; goal <= 1 % of the "
                        "folder's", "the image folder", meta["folder"], digits=1))
    base = dec.get("PIL")
    for name, rate in dec.items():
        rows.append(row("JPEG decode only, one core, 500x375: img/s", name, rate, "img/s",
                        f"{min(n_images, 120)} files, median of 3 interleaved passes; {load}", "PIL", base, digits=1))
    return rows


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "epochs":
        _epochs(Path(sys.argv[2]), int(sys.argv[3]))
    elif len(sys.argv) == 5:           # a peer's own process
        rate, cpu = _peer(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
        print(f"{rate:.3f} {cpu}")
    else:
        from bench.rows import run_alone

        run_alone(run)
