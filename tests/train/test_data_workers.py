"""The folder data path: the JPEG tree the tests and bench measure on, loader workers that give the batches of the
in-process loader (any worker count, resumed mid-epoch), augmentation seeded per sample, bad samples refused or
skipped and counted, and loader workers that end with their rank after kill -9."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.jpeg_tree import image_bytes, make_tree
from podrun.train.data import DataError, Loader, Shard, load_dataset


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """3 classes x 8 training images, small (120 x 90) so that decoding them costs the tests little."""
    return make_tree(tmp_path_factory.mktemp("jpeg") / "tree", classes=3, train_per_class=8, val_per_class=2,
                     seed=1, width=120, height=90)


def test_the_jpeg_tree_is_deterministic_and_the_size_of_imagenet_photographs(tmp_path):
    a = [image_bytes(np.random.default_rng([0, 0, 0, i])) for i in range(4)]
    assert a == [image_bytes(np.random.default_rng([0, 0, 0, i])) for i in range(4)]
    assert 80_000 < sum(map(len, a)) / 4 < 115_000, [len(x) for x in a]     # ImageNet's typical ~96 KB
    root = make_tree(tmp_path / "t", classes=2, train_per_class=2, val_per_class=1, seed=3, width=64, height=48)
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.jpg"))
    assert files == ["train/class000/img00000.jpg", "train/class000/img00001.jpg", "train/class001/img00000.jpg",
                     "train/class001/img00001.jpg", "val/class000/img00000.jpg", "val/class001/img00000.jpg"]


def _run(loader, take=None):
    out = []
    for e, s, micro in loader:
        out.append((e, s, [(x.clone() if isinstance(x, torch.Tensor) else x, y.clone()) for x, y in micro]))
        if take is not None and len(out) >= take:
            break
    return out


def _same(a, b):
    assert [(e, s) for e, s, _ in a] == [(e, s) for e, s, _ in b]
    for (_, _, ma), (_, _, mb) in zip(a, b):
        for (xa, ya), (xb, yb) in zip(ma, mb):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_loader_workers_give_the_in_process_batches_and_a_resume_continues_them(tree):
    train, _ = load_dataset(str(tree), image_size=16, num_classes=3)
    shard = Shard(local_batch=3, grad_accum=2, replicas=2, replica_offset=1)      # 2 updates an epoch
    ref = _run(Loader(train, shard, seed=4, epochs=3, prefetch=0))
    assert [(e, s) for e, s, _ in ref] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    _same(_run(Loader(train, shard, seed=4, epochs=3, workers=2)), ref)
    _same(_run(Loader(train, shard, seed=4, epochs=3, workers=3, start_epoch=1, start_step=1)), ref[3:])
    # the validation split through workers: the batches of the rank's own thread
    from podrun.train.data import eval_batches

    for rank in (0, 1):
        mine = list(eval_batches(train, 5, rank, 2))
        pooled = list(eval_batches(train, 5, rank, 2, workers=2))
        assert len(mine) == len(pooled) == 3
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(mine, pooled))
    # a sample's augmentation is a function of (seed, epoch, index): alone or among others, the same pixels
    x_pair, _ = train.batch([5, 17], epoch=2, train=True)
    assert torch.equal(train.batch([17], epoch=2, train=True)[0][0], x_pair[1])
    assert not torch.equal(train.batch([17], epoch=3, train=True)[0][0], x_pair[1])


def test_a_bad_sample_is_named_with_its_index_or_skipped_and_counted(tree, tmp_path):
    import shutil

    root = tmp_path / "bad"
    shutil.copytree(tree, root)
    victim = root / "train" / "class001" / "img00003.jpg"
    victim.write_bytes(victim.read_bytes()[:300])                 # truncated
    (root / "train" / "class002" / "img00000.jpg").write_bytes(b"not an image at all")
    train, _ = load_dataset(str(root), image_size=16, num_classes=3)
    index = [str(p) for p, _ in train.samples].index(str(victim))
    shard = Shard(local_batch=len(train), grad_accum=1, replicas=1, replica_offset=0)
    with pytest.raises(DataError) as err:
        _run(Loader(train, shard, seed=0, epochs=1, workers=2))
    named = [(index, victim), (index + 5, root / "train" / "class002" / "img00000.jpg")]
    assert any(err.value.message.startswith(f"bad sample {i}: {p}: cannot decode image (") for i, p in named), \
        err.value.message
    assert err.value.exit_code == 2 and "--bad-samples skip" in err.value.hint

    train, _ = load_dataset(str(root), image_size=16, num_classes=3, bad_samples="skip")
    heard = []
    batches = _run(Loader(train, shard, seed=0, epochs=1, workers=2, on_skip=heard.append))
    assert sorted(b.index for b in heard) == sorted([index, index + 5]), heard     # one epoch: each once
    assert {Path(b.path).name for b in heard} == {"img00003.jpg", "img00000.jpg"}
    x, y = batches[0][2][0]
    assert x.shape == (len(train), 3, 16, 16)        # the batch keeps its size: the next good sample stands in


def test_an_empty_class_folder_is_refused_or_kept_without_samples(tree, tmp_path):
    import shutil

    root = tmp_path / "empty"
    shutil.copytree(tree, root)
    (root / "train" / "class003").mkdir()
    (root / "val" / "class003").mkdir()
    with pytest.raises(DataError, match=r"class003: class folder 'class003' \(class index 3\) holds no images"):
        load_dataset(str(root), image_size=16, num_classes=4)
    train, val = load_dataset(str(root), image_size=16, num_classes=4, bad_samples="skip")
    assert train.num_classes == 4 and train.empty_classes == [str(root / "train" / "class003")]


PARENT = """
import sys, time, torch
from podrun.train.data import Loader, Shard, ImageDataset
from podrun.train.data_pool import worker_pids

class Slow(ImageDataset):
    decodes_files, num_classes = True, 2
    def __len__(self):
        return 64
    def batch(self, ix, epoch, train=True):
        import os
        os.write(1, f"busy {os.getpid()}\\n".encode())     # one write: print's pieces of two workers interleave
        time.sleep(600)          # a worker busy in a decode: DataLoader's watch of its parent does not see the end

it = iter(Loader(Slow(), Shard(1, 1, 1, 0), seed=0, workers=2))
import threading
threading.Thread(target=lambda: next(it), daemon=True).start()
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.timeout(120)
def test_loader_workers_end_with_their_rank_after_kill_9():
    """A rank (here a process iterating a Loader with 2 workers, each stuck in a long decode) is killed with -9: its
    workers are gone soon after (the kernel's PR_SET_PDEATHSIG), not left decoding for the rest of the batch."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    rank = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, env=env)
    pids: list[int] = []
    try:
        pids = [int(rank.stdout.readline().split()[1]) for _ in range(2)]      # both workers inside a batch
        assert all(_alive(p) for p in pids)
        rank.send_signal(signal.SIGKILL)
        rank.wait()
        deadline = time.monotonic() + 60
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(p) for p in pids), f"loader workers {pids} outlived their rank"
    finally:
        rank.kill()
        rank.wait()
        for p in pids:                  # the orphans of a failure, not left for the rest of the session
            if _alive(p):
                os.kill(p, signal.SIGKILL)


@pytest.mark.timeout(240)
def test_a_run_stops_on_a_bad_sample_with_its_path_or_skips_it_counted(tree, tmp_path):
    """Two real single-rank runs over a folder with one truncated JPEG: --bad-samples fail (the default) exits 2
    naming the file; skip trains on, prints the file once, records it in metrics.jsonl and counts it in the
    summary."""
    import json
    import shutil

    from podrun.rundir.metrics import read_metrics
    from tests.train.train_procs import start_workers, wait_all

    root = tmp_path / "data"
    shutil.copytree(tree, root)
    victim = root / "train" / "class000" / "img00002.jpg"
    victim.write_bytes(victim.read_bytes()[:200])
    base = dict(data=str(root), image_size=16, num_classes=3, steps=3, global_batch=24, lr=0.1, eval_every=0,
                console=False, resume=False, loader_workers=1)
    fail = start_workers(1, {**base, "run_dir": str(tmp_path / "fail")})
    skip = start_workers(1, {**base, "bad_samples": "skip", "run_dir": str(tmp_path / "skip")})
    out = fail[0].communicate(timeout=220)[0]
    assert fail[0].returncode == 2, out
    assert f"bad sample 2: {victim}: cannot decode image" in out and "Traceback" not in out, out
    skip_out = wait_all(skip, timeout=220)[0]
    assert skip_out.count(f"skipped bad sample 2: {victim}: cannot decode image") == 1, skip_out
    summary = json.loads(skip_out.split("SUMMARY ", 1)[1].splitlines()[0])
    assert summary["bad_samples"]["mode"] == "skip" and summary["bad_samples"]["skipped"] == 3, summary  # 3 epochs
    recs = [r for r in read_metrics(tmp_path / "skip") if r.get("kind") == "bad_sample"]
    assert [(r["path"], r["index"]) for r in recs] == [(str(victim), 2)]


def test_the_device_decoders_host_side_reads_the_bytes_and_draws_the_same_boxes(tree):
    """The CUDA path's loader workers only read files and draw each sample's box and flip, as the host path does;
    the device side (nvJPEG) runs on a lent GPU only (bench/gpu_check_data.py)."""
    from podrun.train.data_device import RawBatch, RawFolder, usable

    train, _ = load_dataset(str(tree), image_size=16, num_classes=3)
    assert not usable("cpu")
    shard = Shard(local_batch=4, grad_accum=1, replicas=1, replica_offset=0)
    (e, s, [(raw, y)]), = _run(Loader(RawFolder(train), shard, seed=2, epochs=1, workers=2), take=1)
    assert isinstance(raw, RawBatch) and len(raw.data) == 4
    for k, i in enumerate(raw.indices.tolist()):
        assert bytes(raw.data[k].numpy()) == train.samples[i][0].read_bytes()
        box, flip = train.box(i, 120, 90, e, True)
        assert raw.boxes[k].tolist() == list(map(float, box)) and bool(raw.flips[k]) == flip
        assert y[k] == train.samples[i][1]


def test_podrun_data_bench_times_the_pipeline_per_worker_count_and_refuses_a_bad_file(tree, tmp_path):
    import json
    import shutil

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    cmd = [sys.executable, "-m", "podrun", "data", "bench", "--recipe", "resnet18_cifar10", "--batch", "4",
           "--images", "8"]
    out = subprocess.run(cmd + ["--data", str(tree), "--workers", "0", "--workers", "2", "--json"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout)
    assert rec["recipe"] == "resnet18_cifar10" and rec["decoder"] in ("simplejpeg", "pil")
    assert [r["workers"] for r in rec["rows"]] == [0, 2] and all(r["images_per_second"] > 0 for r in rec["rows"])
    assert rec["images_in_split"] == 24 and rec["rows"][0]["images"] == 8
    root = tmp_path / "bad"
    shutil.copytree(tree, root)
    victim = root / "train" / "class001" / "img00000.jpg"
    victim.write_bytes(b"\xff\xd8 truncated")
    bad = subprocess.run(cmd + ["--data", str(root), "--workers", "1", "--images", "24"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and f"bad sample 8: {victim}: cannot decode image" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr


def test_tar_shards_give_the_folders_batches_with_a_digest_each_and_name_a_damaged_shard(tree, tmp_path):
    """`podrun data pack` output (WebDataset's layout, an index for random access) read through loader workers:
    the same global batches of the same pixels as the folder, so a run on the shards trains as on the folder; each
    shard's SHA-256 is in the index; a cut shard names the shard, the key and the index of its lost samples."""
    import hashlib
    import json
    import tarfile

    from podrun.train.shards import pack

    out = tmp_path / "shards"
    done = pack(tree, out, shard_size=10)
    assert [s["samples"] for s in done["train"]["shards"]] == [10, 10, 4] and len(done["val"]["shards"]) == 1
    index = json.loads((out / "train" / "index.json").read_text())
    for s in index["shards"]:
        assert hashlib.sha256((out / "train" / s["name"]).read_bytes()).hexdigest() == s["sha256"]
    with tarfile.open(out / "train" / "000001.tar") as tar:
        assert tar.getnames()[:2] == ["000000010.jpg", "000000010.cls"]
    folder, _ = load_dataset(str(tree), image_size=16, num_classes=3)
    sharded, val = load_dataset(str(out), image_size=16, num_classes=3)
    assert (sharded.name, len(sharded), sharded.classes, len(val)) == ("shards", 24, folder.classes, 6)
    from podrun.train.data_bench import train_split

    assert train_split(str(out), 16).name == "shards"              # podrun data bench reads them too
    shard = Shard(local_batch=4, grad_accum=2, replicas=1, replica_offset=0)
    _same(_run(Loader(sharded, shard, seed=9, epochs=2, workers=2)), _run(Loader(folder, shard, seed=9, epochs=2)))

    # a pack stopped after its second shard resumes: the shards written whole are kept, the index is the same
    class Stop(Exception):
        pass

    def stop_after_two(done, *_):
        if done == 2:
            raise Stop

    again = tmp_path / "again"
    with pytest.raises(Stop):
        pack(tree, again, shard_size=10, progress=stop_after_two)
    first = [(again / "train" / n).stat().st_ino for n in ("000000.tar", "000001.tar")]
    assert not (again / "train" / "index.json").exists()
    pack(tree, again, shard_size=10)
    assert [(again / "train" / n).stat().st_ino for n in ("000000.tar", "000001.tar")] == first
    assert json.loads((again / "train" / "index.json").read_text()) == index
    assert not (again / "train" / ".pack-progress.json").exists()

    cut = out / "train" / "000002.tar"
    cut.write_bytes(cut.read_bytes()[:1024])         # the first sample's header and a sliver of its bytes
    damaged, _ = load_dataset(str(out), image_size=16, num_classes=3)
    with pytest.raises(DataError, match=r"^bad sample 2\d: .*/000002\.tar#0000000\d\d: cannot decode image"):
        damaged.batch(range(20, 24), 0, True)


def test_the_decoders_give_the_same_crops(tree):
    """simplejpeg and PIL (both libjpeg-turbo) make the same training crops: bit for bit where the source is decoded
    at full size, within a few levels where each scales it in the DCT (a 32 px crop of a 120 px source)."""
    try:
        import simplejpeg  # noqa: F401
    except ImportError:
        pytest.fail("simplejpeg is not installed (podrun's [data] extra; .ci/install installs it)", pytrace=False)
    from podrun.train.data import FolderDataset

    for size, mean_levels in ((96, 0.0), (32, 3.0)):
        a = FolderDataset(tree / "train", size, decoder="simplejpeg")
        b = FolderDataset(tree / "train", size, decoder="pil")
        xa, ya = a.batch(range(len(a)), epoch=1, train=True)
        xb, yb = b.batch(range(len(b)), epoch=1, train=True)
        assert torch.equal(ya, yb)
        diff = (xa.int() - xb.int()).abs().float().mean().item()
        assert diff <= mean_levels, (size, diff)


@pytest.mark.timeout(300)
def test_stage_copies_the_shards_to_node_local_disk_once_per_job_and_the_account_counts_it(tree, tmp_path):
    """--stage with $SLURM_TMPDIR (a folder, as Slurm makes one per job): two ranks of a real run on one host stage
    the shards once (the host's lock: one copies, each shard checked against its digest, the other waits and reads
    the copy); the run trains from the copy, its metrics record the staging and the account counts it as staging,
    out of the start-up; the same job again copies nothing, nor does a new job whose shards are there whole. A
    damaged shard, a plain folder and a host with no node-local disk are each one clear error."""
    import hashlib
    import json

    from podrun.rundir.account import attempt_part
    from podrun.rundir.metrics import StepLog, read_metrics
    from podrun.rundir.summary import Attempt, RunStatus
    from podrun.train.shards import pack
    from podrun.train.stage import local_disk, stage
    from tests.train.train_procs import start_workers, wait_all

    out = tmp_path / "shards"
    pack(tree, out, shard_size=10)                  # train: 3 shards, val: 1
    disk = tmp_path / "local"
    disk.mkdir()
    env = {"SLURM_TMPDIR": str(disk), "SLURM_JOB_ID": "41"}
    run = tmp_path / "run"
    base = dict(data=str(out), image_size=16, num_classes=3, steps=2, global_batch=24, lr=0.1, eval_every=0,
                console=False, resume=False, loader_workers=1, stage=True, run_dir=str(run))
    wait_all(start_workers(2, base, extra_env=env), timeout=280)
    (staged,) = disk.iterdir()
    mark = json.loads(next(staged.glob(".staged-*")).read_text())
    assert mark == {"job": "41", "source": str(out.resolve()), "shards": 4}, mark    # copied once, by one rank
    for split in ("train", "val"):
        index = json.loads((staged / split / "index.json").read_text())
        assert index == json.loads((out / split / "index.json").read_text())
        for s in index["shards"]:
            assert hashlib.sha256((staged / split / s["name"]).read_bytes()).hexdigest() == s["sha256"]
    (rec,) = [r for r in read_metrics(run) if r.get("kind") == "stage"]
    assert rec["staged"] == str(staged) and rec["disk"] == f"$SLURM_TMPDIR={disk}" and rec["seconds"] > 0, rec
    log = StepLog.read(run)
    assert log.stages == ((rec["time"], rec["seconds"]),) and len(log.steps) == 2
    first_step = log.steps[0][1]
    part = attempt_part(Attempt(started=rec["time"] - rec["seconds"] - 1.0, ended=log.steps[-1][1] + 0.1,
                                all_ready_s=0.5, status=RunStatus.OK), log, None, True)
    assert part.seconds["staging"] == pytest.approx(rec["seconds"]), part
    assert part.seconds["startup"] == pytest.approx(first_step - (rec["time"] - rec["seconds"] - 0.5)
                                                    - rec["seconds"], abs=0.5), part
    again = stage(out, env)
    assert (again.root, again.shards, again.bytes) == (staged, 0, 0)             # the same job: its copy
    assert stage(out, {**env, "SLURM_JOB_ID": "42"}).shards == 0                 # a new job: the shards whole

    bad = out / "train" / "000001.tar"
    data = bytearray(bad.read_bytes())
    data[-5000] ^= 0xFF
    bad.write_bytes(bytes(data))
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    with pytest.raises(DataError, match=r"000001\.tar: damaged shard: its SHA-256 is not the one in"):
        stage(out, {"SLURM_TMPDIR": str(fresh), "SLURM_JOB_ID": "43"})
    with pytest.raises(DataError, match="holds no tar shards") as exc:
        stage(tree, env)
    assert "podrun data pack" in exc.value.hint
    with pytest.raises(DataError, match=r"names no node-local disk \(none of \$PODRUN_LOCAL_DISK, \$SLURM_TMPDIR, "
                                        r"\$SGE_LOCALDIR, \$PBS_LOCALDIR is set, and the cluster spec gives no "
                                        r"local_disk:\)"):
        stage(out, {})
    # a cluster spec's local_disk: reaches the runner in the plan, and is the disk where no variable names one
    spec = tmp_path / "mine.yaml"
    spec.write_text((Path(__file__).resolve().parents[2] / "cluster_specs" / "local.yaml").read_text()
                    + f"local_disk: {tmp_path / 'spec-disk'}\n")
    plan = subprocess.run([sys.executable, "-m", "podrun", "plan", "--cluster", str(spec), "--json",
                           str(Path(__file__).resolve().parents[2] / "recipes" / "resnet18_cifar10")],
                          capture_output=True, text=True, timeout=60)
    assert json.loads(plan.stdout)["local_disk"] == str(tmp_path / "spec-disk"), plan.stderr
    spec_disk = json.loads(plan.stdout)["local_disk"]
    assert local_disk({}, spec_disk) == (tmp_path / "spec-disk", f"the cluster spec's local_disk: {spec_disk}")
    assert local_disk({"SGE_LOCALDIR": "/local/job"}, spec_disk)[1] == "$SGE_LOCALDIR=/local/job"   # the job's first
