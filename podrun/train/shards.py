"""Tar shards of an image folder in WebDataset's layout (``NNNNNN.tar`` of ``<key>.jpg`` + ``<key>.cls``), with an
index for random access: `podrun data pack` writes them, ShardDataset reads them.

A split's shards sit in one folder with ``index.json``: the classes, each shard's name, sample count and SHA-256, and
for every sample its shard, the offset and size of its image bytes inside that tar, and its class. Sample i of the
shards is sample i of the folder they were packed from (the folder's sorted order), so the data order, the global
batches and the augmentation are the folder's: a run on the shards trains on the same samples at every step. Reading
a sample is one pread in an open shard, with no metadata operation per file.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import tarfile
from pathlib import Path

import numpy as np

from podrun import safefs
from podrun.train.images import IMAGE_EXTS, DataError, FolderDataset

INDEX = "index.json"
FORMAT = "podrun-shards-1"
SHARD_MODE = 0o644          # data others of the group may read, as the folder it came from


def is_shards(root: Path) -> bool:
    return (root / INDEX).is_file()


def _split_samples(root: Path) -> tuple[list[str], list[tuple[Path, int]]]:
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not classes:
        raise DataError(f"{root}: no class folders", hint="expected one folder per class with images inside")
    samples = [(f, i) for i, c in enumerate(classes)
               for f in sorted(f for f in (root / c).iterdir() if f.suffix.lower() in IMAGE_EXTS)]
    if not samples:
        raise DataError(f"{root}: no images ({', '.join(IMAGE_EXTS)}) in the class folders")
    return classes, samples


PROGRESS = ".pack-progress.json"     # the shards written so far, for a pack that was stopped to resume from


def _resumable(out: Path, listing: str) -> dict[str, dict]:
    """The shards a stopped pack of the same listing wrote whole (their digest checked again), by name."""
    try:
        done = json.loads((out / PROGRESS).read_text(encoding="utf-8"))
        if done.get("listing") != listing:
            return {}
        return {s["name"]: s for s in done["shards"]
                if hashlib.sha256((out / s["name"]).read_bytes()).hexdigest() == s["sha256"]}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def pack_split(src: Path, out: Path, shard_size: int, progress=None, classes: list[str] | None = None) -> dict:
    """Pack one split (``src/<class>/*``) into ``out``; returns its index. ``shard_size``: samples per shard. A
    pack stopped midway resumes: the shards it wrote whole for the same files and shard size are kept."""
    found, samples = _split_samples(src)
    classes = classes if classes is not None else found
    label_of = {c: i for i, c in enumerate(classes)}
    safefs.own_dir(out, "shard folder")
    listing = hashlib.sha256(json.dumps([shard_size, classes, [str(p) for p, _ in samples]]).encode()).hexdigest()
    kept = _resumable(out, listing)
    shards, shard_of, offset, size, label = [], [], [], [], []
    for s, start in enumerate(range(0, len(samples), shard_size)):
        name = f"{s:06d}.tar"
        part = samples[start:start + shard_size]
        if name in kept and kept[name]["samples"] == len(part):
            entry = kept[name]
            shards.append(entry)
            shard_of += [s] * len(part)
            offset += entry["offset"]
            size += entry["size"]
            label += entry["label"]
            if progress is not None:
                progress(s + 1, -(-len(samples) // shard_size), start + len(part), len(samples))
            continue
        with safefs.replacing(out / name, f"shard {out / name}", mode=SHARD_MODE, durable=False) as f:
            digest = hashlib.sha256()
            tee = _Tee(f, digest)
            with tarfile.open(fileobj=tee, mode="w", format=tarfile.USTAR_FORMAT) as tar:
                for k, (path, _) in enumerate(part):
                    i = start + k
                    cls = label_of[path.parent.name]
                    key = f"{i:09d}"
                    data = path.read_bytes()
                    info = tarfile.TarInfo(f"{key}{path.suffix.lower()}")
                    info.size, info.mtime, info.mode = len(data), 0, 0o644
                    tar.addfile(info, io.BytesIO(data))
                    padded = -(-len(data) // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
                    shard_of.append(s)
                    offset.append(tar.offset - padded)      # the member's data: after its header
                    size.append(len(data))
                    label.append(cls)
                    text = f"{cls}\n".encode()
                    cinfo = tarfile.TarInfo(f"{key}.cls")
                    cinfo.size, cinfo.mtime, cinfo.mode = len(text), 0, 0o644
                    tar.addfile(cinfo, io.BytesIO(text))
        shards.append({"name": name, "samples": len(part), "sha256": digest.hexdigest(),
                       "offset": offset[start:], "size": size[start:], "label": label[start:]})
        safefs.write_file(out / PROGRESS, json.dumps({"listing": listing, "shards": shards}), "pack progress",
                          durable=False)
        if progress is not None:
            progress(s + 1, -(-len(samples) // shard_size), start + len(part), len(samples))
    index = {"format": FORMAT, "layout": "webdataset", "classes": classes,
             "shards": [{k: e[k] for k in ("name", "samples", "sha256")} for e in shards],
             "samples": {"shard": shard_of, "offset": offset, "size": size, "label": label}}
    safefs.write_file(out / INDEX, json.dumps(index) + "\n", f"shard index {out / INDEX}", mode=SHARD_MODE,
                      durable=False)
    (out / PROGRESS).unlink(missing_ok=True)
    return index


class _Tee:
    """A write-only file that hashes what passes through it."""

    def __init__(self, f, digest):
        self.f, self.digest = f, digest

    def write(self, b):
        self.digest.update(b)
        return self.f.write(b)

    def tell(self):
        return self.f.tell()


def pack(folder: str | os.PathLike, out: str | os.PathLike, shard_size: int, progress=None) -> dict:
    """``folder/{train,val}`` (or one split) packed into ``out/{train,val}`` (or ``out``); returns the indexes."""
    src, dst = Path(folder), Path(out)
    if shard_size < 1:
        raise DataError(f"--shard-size {shard_size}: must be at least 1")
    if not src.is_dir():
        raise DataError(f"{src}: folder not found", hint="pass an ImageNet-style folder (train/<class>/*.jpg)")
    safefs.own_dir(dst, "shard folder")
    if (src / "train").is_dir():
        train = pack_split(src / "train", dst / "train", shard_size, progress)
        done = {"train": train}
        if (src / "val").is_dir():
            done["val"] = pack_split(src / "val", dst / "val", shard_size, progress, classes=train["classes"])
        return done
    return {"split": pack_split(src, dst, shard_size, progress)}


class ShardDataset(FolderDataset):
    """A split read from its tar shards: FolderDataset's decoding, augmentation and bad-sample handling, the bytes
    read at the index's offsets (one open file per shard in each process)."""

    def __init__(self, root: Path, image_size: int, seed: int = 0, bad_samples: str = "fail",
                 decoder: str | None = None, classes: list[str] | None = None):
        from podrun.train.images import decoding

        self.root, self.image_size, self.seed, self.name = root, image_size, seed, "shards"
        self.bad_samples, self.decoder = decoding(bad_samples, decoder)
        try:
            index = json.loads((root / INDEX).read_text(encoding="utf-8"))
            assert index.get("format") == FORMAT, f"format {index.get('format')!r}, not {FORMAT}"
            smp = index["samples"]
            self._shard = np.asarray(smp["shard"], dtype=np.int64)
            self._offset = np.asarray(smp["offset"], dtype=np.int64)
            self._size = np.asarray(smp["size"], dtype=np.int64)
            labels = [int(v) for v in smp["label"]]
            self._names = [s["name"] for s in index["shards"]]
            self.classes = list(index["classes"])
        except (OSError, ValueError, KeyError, TypeError, AssertionError) as exc:
            raise DataError(f"{root / INDEX}: not a shard index ({exc})",
                            hint="write it with podrun data pack FOLDER OUT") from None
        if classes is not None and classes != self.classes:
            raise DataError(f"{root / INDEX}: classes differ from the training split's")
        self.samples = [(root / f"{self._names[s]}#{i:09d}", c) for i, (s, c) in enumerate(zip(self._shard, labels))]
        self.num_classes, self.empty_classes, self.skipped = len(self.classes), [], []
        self._bad: dict = {}
        self._files: dict[int, int] = {}
        self._pid = os.getpid()

    def read(self, i: int) -> bytes:
        if self._pid != os.getpid():        # a forked loader worker opens its own descriptors
            self._files, self._pid = {}, os.getpid()
        s = int(self._shard[i])
        fd = self._files.get(s)
        if fd is None:
            fd = self._files[s] = os.open(self.root / self._names[s], os.O_RDONLY | os.O_CLOEXEC)
        n = int(self._size[i])
        data = os.pread(fd, n, int(self._offset[i]))
        if len(data) != n:
            raise OSError(0, f"the shard ends {n - len(data)} bytes short of the sample (damaged or cut)")
        return data


def print_progress(done: int, total: int, samples: int, all_samples: int) -> None:
    print(f"\rpacked {done}/{total} shards ({samples}/{all_samples} samples)", end="\n" if done == total else "",
          file=sys.stderr, flush=True)
