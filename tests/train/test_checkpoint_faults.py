"""Faults a run's files meet, with real files, real processes and real kills: a checkpoint with flipped bytes,
truncated or empty, two writers of one run or checkpoint directory, a writer killed mid-write, a full disk
(a small tmpfs this test mounts), a read-only checkpoint directory, a torn metrics line."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from podrun.train import checkpoint as ckpt
from podrun.rundir.metrics import read_metrics, read_metrics_counted
from tests.harness.podrun_proc import run_podrun
from tests.train.train_procs import WORKER, kill_a_save_in_flight, lock_holder, outside_env, train_opts, wait_for_step

HOST = socket.gethostname()


def _opts(run_dir, **kw):
    return train_opts(run_dir, **{"steps": 12, "seed": 5, "checkpoint_every": 4, **kw})


def _start(opts: dict) -> subprocess.Popen:
    """One real worker process (world 1) training the tiny model of tests/train/worker.py."""
    return subprocess.Popen([sys.executable, str(WORKER), json.dumps(opts)],
                            env=outside_env(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _run(opts: dict, timeout: float = 180) -> tuple[int, str]:
    p = _start(opts)
    out, _ = p.communicate(timeout=timeout)
    return p.returncode, out


def _resumes(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir) if r.get("event") == "resume"]


def _trained(run_dir: Path, opts: dict) -> list[Path]:
    rc, out = _run(opts)
    assert rc == 0, out[-3000:]
    return ckpt.list_checkpoints(run_dir / "checkpoints")


@pytest.mark.timeout(300)
def test_flipped_bytes_are_found_and_the_older_good_checkpoint_is_used(tmp_path):
    """512 bytes flipped inside the newest checkpoint (it still loads with torch.load): the resume names it
    on the console and in its record and continues from the one before."""
    run_dir = tmp_path / "r"
    saved = _trained(run_dir, _opts(run_dir, steps=8))
    assert [p.name for p in saved] == ["ckpt-000000004.pt", "ckpt-000000008.pt"]
    data = bytearray(saved[-1].read_bytes())
    mid = len(data) // 2
    data[mid:mid + 512] = bytes(b ^ 0x55 for b in data[mid:mid + 512])
    saved[-1].write_bytes(bytes(data))
    rc, out = _run(_opts(run_dir, steps=12))
    assert rc == 0, out[-3000:]
    assert f"checkpoint {saved[-1]} passed over: digest mismatch" in out, out[-2000:]
    resume = _resumes(run_dir)[-1]
    assert resume["step"] == 4 and resume["path"] == str(saved[0]), resume
    assert [r["path"] for r in resume["rejected"]] == [str(saved[-1])]
    assert "digest mismatch" in resume["rejected"][0]["why"]


@pytest.mark.timeout(300)
def test_truncated_and_empty_checkpoints_are_named_and_none_good_is_exit_2(tmp_path):
    run_dir = tmp_path / "r"
    saved = _trained(run_dir, _opts(run_dir, steps=8))
    with open(saved[-1], "r+b") as f:          # the newest torn mid-file, the older one emptied
        f.truncate(saved[-1].stat().st_size // 3)
    rc, out = _run(_opts(run_dir))
    assert rc == 0, out[-3000:]
    resume = _resumes(run_dir)[-1]
    assert resume["step"] == 4 and "no digest at its end" in resume["rejected"][0]["why"], resume

    left = ckpt.list_checkpoints(run_dir / "checkpoints")           # 8 and 12 now, both made bad
    left[-1].write_bytes(b"")
    left[0].write_bytes(left[0].read_bytes()[:-100])
    rc, out = _run(_opts(run_dir, steps=16))
    assert rc == 2, out[-3000:]
    assert "no checkpoint is good" in out and "Traceback" not in out, out[-3000:]
    assert f"{left[-1].name}: empty (0 bytes)" in out and f"{left[0].name}: no digest at its end" in out, out


@pytest.mark.timeout(300)
def test_a_second_writer_of_a_run_dir_or_a_checkpoint_dir_is_refused(tmp_path):
    run_dir, other = tmp_path / "r", tmp_path / "other"
    a = _start(_opts(run_dir, steps=100000, checkpoint_every=50))
    try:
        wait_for_step(run_dir, 2, [a])
        rc, out = _run(_opts(run_dir))                                    # the same run directory
        assert rc == 2, out[-3000:]
        assert f"run directory {run_dir} is in use by run {run_dir.name} on host {HOST} (pid {a.pid})" in out, out
        rc, out = _run(_opts(other, checkpoint_dir=str(run_dir / "checkpoints")))   # its checkpoint directory
        assert rc == 2, out[-3000:]
        assert f"checkpoint directory {run_dir / 'checkpoints'} is in use by run {run_dir.name}" in out, out
        assert not (other / "metrics.jsonl").exists() or not [r for r in read_metrics(other) if r["kind"] == "step"]
        assert a.poll() is None
        steps = [r["step"] for r in read_metrics(run_dir) if r.get("kind") == "step"]
        assert steps == list(range(1, len(steps) + 1))        # one writer's rows only
    finally:
        a.send_signal(signal.SIGKILL)
        a.wait()
    rc, out = _run(_opts(run_dir, steps=60))                  # the kernel dropped the dead holder's lock
    assert rc == 0, out[-3000:]


@pytest.mark.timeout(300)
def test_temp_files_go_only_with_their_dead_writer(tmp_path):
    """A saver killed -9 mid-write leaves its temporary file: the next run removes it before training and says
    so; a live writer's temporary file stays."""
    d = tmp_path / "r" / "checkpoints"
    kill_a_save_in_flight(d, 60)
    dead = [f for f in d.iterdir() if f.name.startswith(".ckpt-")]
    assert len(dead) == 1
    for f in ckpt.list_checkpoints(d):
        f.unlink()                          # the saver's states are not this run's
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        theirs = d / f".ckpt-000000099.pt.tmp-{HOST}-{live.pid}"
        theirs.write_bytes(b"partial")
        rc, out = _run(_opts(tmp_path / "r", steps=8))
        assert rc == 0, out[-3000:]
        assert f"removed {dead[0].name}, the partial checkpoint of a writer that died" in out, out[-2000:]
        assert not dead[0].exists() and theirs.exists()
    finally:
        live.kill()
        live.wait()


@pytest.fixture
def small_disk(tmp_path):
    """Mount a tmpfs of a given size (or read-only) under tmp_path; unmounted after the test (needs root)."""
    mounts = []

    def mount(name: str, options: str) -> Path:
        where = tmp_path / name
        where.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "podrun-test", str(where)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.fail(f"a tmpfs of its own is needed (mount -t tmpfs, as root): {r.stderr.strip()}", pytrace=False)
        mounts.append(where)
        return where

    yield mount
    for where in reversed(mounts):
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.timeout(300)
def test_a_full_disk_is_named_with_the_bytes_needed_and_free(tmp_path, small_disk):
    """Room for two checkpoints of the tiny model (64 KB each), not three: the third save fails with one
    paragraph naming the path, the bytes needed and free; the two written are intact. A disk with no room
    for one is refused before training."""
    disk = small_disk("disk", "size=160k,mode=0700")
    run_dir = tmp_path / "r"
    rc, out = _run(_opts(run_dir, checkpoint_dir=str(disk / "ck"), steps=20))
    assert rc == 1, out[-3000:]
    assert "Traceback" not in out and "enforce fail" not in out, out[-3000:]
    line = next(l for l in out.splitlines() if "no space left" in l)
    assert f"{disk / 'ck'} for checkpoint ckpt-000000012.pt: it needs" in line and "bytes free" in line, line
    good = ckpt.list_checkpoints(disk / "ck")
    assert [p.name for p in good] == ["ckpt-000000004.pt", "ckpt-000000008.pt"]
    assert all(ckpt.decode(p)[0] is not None for p in good)
    assert not [f for f in (disk / "ck").iterdir() if ".tmp-" in f.name]

    tiny = small_disk("tiny", "size=16k,mode=0700")
    rc, out = _run(_opts(tmp_path / "r2", checkpoint_dir=str(tiny)))
    assert rc == 2, out[-3000:]
    assert "refused before training" in out and "bytes free" in out, out[-3000:]
    assert not [r for r in read_metrics(tmp_path / "r2") if r.get("kind") == "step"]


@pytest.mark.timeout(300)
def test_a_read_only_or_missing_checkpoint_dir_is_refused_before_training(tmp_path, small_disk):
    ro = small_disk("ro", "size=1m,ro,mode=0700")
    rc, out = _run(_opts(tmp_path / "r", checkpoint_dir=str(ro)))
    assert rc == 2, out[-3000:]
    assert f"checkpoint directory {ro} cannot be written: Read-only file system" in out, out[-3000:]
    assert "Traceback" not in out
    assert not (tmp_path / "r" / "metrics.jsonl").exists() or \
        not [r for r in read_metrics(tmp_path / "r") if r.get("kind") == "step"]
    rc, out = _run(_opts(tmp_path / "r3", checkpoint_dir=str(tmp_path / "no" / "such" / "ck")))
    assert rc == 2 and "neither it nor its parent" in out, out[-3000:]


@pytest.mark.timeout(300)
def test_a_torn_metrics_line_does_not_swallow_the_next_record(tmp_path):
    run_dir = tmp_path / "r"
    _trained(run_dir, _opts(run_dir, steps=4))
    path = run_dir / "metrics.jsonl"
    whole = path.read_bytes()
    path.write_bytes(whole + whole.splitlines(keepends=True)[1][:30])    # a record cut mid-line
    rc, out = _run(_opts(run_dir, steps=8))
    assert rc == 0, out[-3000:]
    records, skipped = read_metrics_counted(run_dir)
    assert skipped == 1                                   # the torn line alone
    assert [r["step"] for r in records if r.get("event") == "resume"] == [4]
    assert [r["step"] for r in records if r.get("kind") == "step"] == list(range(1, 9))


FILL = textwrap.dedent("""
    import os
    with open(os.path.join(os.environ["PODRUN_RUN_DIR"], "fill"), "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"x" * 4096)
        except OSError as exc:
            print("filled:", exc.strerror, flush=True)
""")


@pytest.mark.timeout(300)
def test_the_last_line_says_summary_json_was_not_written(tmp_path, small_disk):
    """A command that fills the run directory's disk: podrun's last line says summary.json was not written
    instead of naming it as written."""
    runs = small_disk("runs", "size=256k,mode=0700")
    r = run_podrun("launch", "--runs-dir", runs, "--run-id", "full", "--", sys.executable, "-c", FILL,
                   env=outside_env(), timeout=240, cwd=tmp_path)
    last = r.stderr.strip().splitlines()[-1]
    assert "NOT written: summary.json (No space left on device)" in last, r.stderr[-3000:]
    assert not (runs / "full" / "summary.json").exists()


def test_a_disk_that_fills_during_the_write_is_named_and_leaves_no_temp_file(tmp_path, small_disk):
    """No older checkpoint to size it by: the write itself meets ENOSPC (torch's zip writer would say
    `enforce fail ... unexpected pos`); the error names the path, the bytes written when it failed and free."""
    import torch

    disk = small_disk("fills", "size=64k,mode=0700")
    with pytest.raises(ckpt.CheckpointError) as got:
        ckpt.save({"w": torch.zeros(100_000)}, disk, 3, keep=2)
    msg = got.value.message
    assert msg.startswith(f"no space left on the device of {disk} for checkpoint ckpt-000000003.pt: it needs "
                          "more than "), msg
    assert "bytes free" in msg and got.value.exit_code == 1
    assert [f.name for f in disk.iterdir()] == []


@pytest.mark.timeout(180)
def test_a_restart_waits_for_its_own_runs_earlier_attempt_never_for_another_run(tmp_path):
    """A process holding the run directory for run "x" is killed -9 a second after a restart of "x" began
    waiting: the restart then gets the lock (the kernel released it); run "y" is refused at once."""
    from podrun.rundir.lock import DirLock, LockError

    with lock_holder(tmp_path, "x") as holder:
        with pytest.raises(LockError, match=f"in use by run x on host {HOST} \\(pid {holder.pid}\\)"):
            DirLock(tmp_path, "y", "run directory").acquire(same_run_wait=3600)   # waiting would hit the timeout
        import threading

        threading.Timer(1.0, holder.kill).start()
        got = DirLock(tmp_path, "x", "run directory").acquire(same_run_wait=60)
        assert holder.poll() is not None or holder.wait(5) is not None
        got.release()
