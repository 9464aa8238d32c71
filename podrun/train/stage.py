"""Staging (`--stage`): a job's tar shards copied once to each host's node-local disk before training starts.

The node-local disk is the first of $PODRUN_LOCAL_DISK, $SLURM_TMPDIR (Slurm), $SGE_LOCALDIR (Grid Engine: ABCI) and
$PBS_LOCALDIR (PBS) that is set, else the cluster spec's ``local_disk:`` (the plan's). The ranks of a host take one lock there:
the first copies the shards (train/ and val/, each shard checked against its SHA-256 in the index as it is copied,
several at once) and marks the job's copy done; the others then find the mark and read the copy. A restart in
the same job ($SLURM_JOB_ID, $JOB_ID, $PBS_JOBID) finds the mark and copies nothing; a shard already there whole
(the same digest) is not copied again. Every directory and file is made through podrun.safefs.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from podrun import safefs
from podrun.train.data import DataError
from podrun.train.shards import INDEX, is_shards

LOCAL_DISK_ENVS = ("PODRUN_LOCAL_DISK", "SLURM_TMPDIR", "SGE_LOCALDIR", "PBS_LOCALDIR")
JOB_ENVS = ("SLURM_JOB_ID", "JOB_ID", "PBS_JOBID")
CHUNK = 1 << 20
COPIES = 4                  # shards copied at once on a host


@dataclass(frozen=True)
class Staged:
    root: Path              # the staged data (train/ and val/ of shards), read in place of the source
    source: Path
    disk: str               # where the node-local disk came from: "$SLURM_TMPDIR=/tmp/job.1"
    shards: int             # shards this call copied (0: the job's copy was there)
    bytes: int
    seconds: float

    def record(self) -> dict:
        """The run's metrics record (kind ``stage``), which the run's account counts as staging."""
        return {"kind": "stage", "seconds": round(self.seconds, 4), "shards": self.shards, "bytes": self.bytes,
                "source": str(self.source), "staged": str(self.root), "disk": self.disk}


def local_disk(environ: Mapping[str, str] | None = None, spec_disk: str | None = None) -> tuple[Path, str] | None:
    """(the node-local disk, where it came from), or None where the cluster names none."""
    env = os.environ if environ is None else environ
    name = next((n for n in LOCAL_DISK_ENVS if env.get(n)), None)
    if name is not None:
        return Path(env[name]), f"${name}={env[name]}"
    if spec_disk:
        return Path(spec_disk), f"the cluster spec's local_disk: {spec_disk}"
    return None


def _copy(src: Path, dest: Path, sha256: str) -> int:
    """``src`` to ``dest`` whole (a new file renamed over it), its digest checked on the way; its bytes."""
    digest, n = hashlib.sha256(), 0
    with open(src, "rb") as f, safefs.replacing(dest, "staged shard", error=DataError, durable=False) as out:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
            out.write(chunk)
            n += len(chunk)
        if digest.hexdigest() != sha256:
            raise DataError(f"{src}: damaged shard: its SHA-256 is not the one in {src.parent / INDEX}; nothing "
                            f"staged from it", hint="pack the folder again (podrun data pack)")
    return n


def _whole(path: Path, sha256: str) -> bool:
    try:
        with open(path, "rb") as f:
            digest = hashlib.sha256()
            for chunk in iter(lambda: f.read(CHUNK), b""):
                digest.update(chunk)
        return digest.hexdigest() == sha256
    except OSError:
        return False


def stage(data: str | os.PathLike, environ: Mapping[str, str] | None = None, copies: int = COPIES,
          spec_disk: str | None = None) -> Staged:
    """Copy ``data``'s shards (podrun data pack's output: train/ and val/) to this host's node-local disk once per
    job; the staged copy. ``spec_disk``: the cluster spec's ``local_disk:``. A plain image folder, or no node-local
    disk: DataError (exit 2) saying what to do."""
    t0 = time.monotonic()
    src = Path(data).resolve()
    env = os.environ if environ is None else environ
    if not is_shards(src / "train"):
        raise DataError(f"--stage: {data} holds no tar shards (no train/{INDEX}): staging copies the shards of "
                        "podrun data pack", hint=f"pack it first: podrun data pack {data} OUT, then train --data OUT "
                                                 "--stage")
    found = local_disk(env, spec_disk)
    if found is None:
        raise DataError("--stage: this host names no node-local disk (none of $" + ", $".join(LOCAL_DISK_ENVS) +
                        " is set, and the cluster spec gives no local_disk:)",
                        hint="give the cluster spec a local_disk: (a folder on each host's own disk), or run without "
                             "--stage")
    disk, where = found
    job = next((env[n] for n in JOB_ENVS if env.get(n)), "no-job")
    dest = safefs.own_dir(disk / f"podrun-stage-{hashlib.sha256(str(src).encode()).hexdigest()[:16]}",
                          "staged data directory", error=DataError)
    lock = safefs.open_private(dest / ".lock", read=True)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)          # the host's first rank copies; the others wait for it here
        mark = dest / f".staged-{hashlib.sha256(job.encode()).hexdigest()[:16]}"
        if mark.is_file():
            return Staged(dest, src, where, 0, 0, time.monotonic() - t0)
        splits = [s for s in ("train", "val") if is_shards(src / s)]
        work, indexes = [], {}
        for split in splits:
            text = safefs.read_user_file(src / split / INDEX, "shard index", limit=1 << 30, error=DataError)
            index = json.loads(text)
            indexes[split] = text
            safefs.own_dir(dest / split, "staged data directory", error=DataError)
            for s in index["shards"]:
                if not _whole(dest / split / s["name"], s["sha256"]):
                    work.append((src / split / s["name"], dest / split / s["name"], s["sha256"]))
        with ThreadPoolExecutor(max(1, copies)) as pool:
            sizes = list(pool.map(lambda w: _copy(*w), work))
        for split, text in indexes.items():       # the index last: a copy without it is no shards
            safefs.write_file(dest / split / INDEX, text, "staged shard index", error=DataError, durable=False)
        safefs.write_file(mark, json.dumps({"job": job, "source": str(src), "shards": len(work)}), "stage mark",
                          error=DataError)
        return Staged(dest, src, where, len(work), sum(sizes), time.monotonic() - t0)
    finally:
        os.close(lock)
