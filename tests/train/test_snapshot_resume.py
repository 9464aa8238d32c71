"""The runner's in-memory snapshots: 4 real gloo workers (one snapshot directory each, as on 4 hosts) killed
mid-run and resumed on 3, one of them a spare with no snapshot, continue from the step they were killed at
(the disk checkpoint interval is far larger) with the loss curve of a run that was never killed."""
from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from podrun.runtime import snapshot
from podrun.train import checkpoint as ckpt
from podrun.rundir.metrics import latest_by_step, read_metrics
from tests.ports import free_port
from tests.train.train_procs import SGD_COSINE, WORKER, train_opts, wait_all, wait_for_step, worker_env

STEPS, GLOBAL = 30, 24
KEY = uuid.uuid4().hex      # the run's snapshot key (podrun launch makes one per run)


def _opts(run_dir, **kw):
    return train_opts(run_dir, **{**SGD_COSINE, "steps": STEPS, "global_batch": GLOBAL, "checkpoint_every": 100, **kw})


def _start(dirs: list[Path | None], opts: dict, restart: int = 0) -> list[subprocess.Popen]:
    """One worker per entry of ``dirs``, each alone on its host (local rank 0, its host's snapshot writer) with
    that PODRUN_SNAPSHOT_DIR (None: none)."""
    import json

    port = free_port()
    procs = []
    for r, d in enumerate(dirs):
        extra = {"PODRUN_RESTART_COUNT": str(restart), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                 "GROUP_RANK": str(r)}
        if d is not None:
            extra.update(PODRUN_SNAPSHOT_DIR=str(d), PODRUN_SNAPSHOT_KEY=KEY)
        procs.append(subprocess.Popen([sys.executable, str(WORKER), json.dumps(opts)],
                                      env=worker_env(r, len(dirs), port, extra),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


@pytest.fixture
def shm():
    root = Path("/dev/shm") / f"podrun-test-{uuid.uuid4().hex[:12]}"
    yield root
    for d in list(root.iterdir()) if root.exists() else []:
        snapshot.remove(d)


@pytest.mark.timeout(420)
def test_killed_on_4_resumed_on_3_with_a_spare_from_the_snapshots(tmp_path, shm):
    run_dir, ref_dir = tmp_path / "4-then-3", tmp_path / "stays-on-4"
    hosts = [shm / f"h{i}" for i in range(1, 6)]
    victims = _start(hosts[:4], _opts(run_dir))
    wait_for_step(run_dir, 12, victims, timeout=300)
    for p in victims:
        p.send_signal(signal.SIGKILL)
    for p in victims:
        p.wait()
    logged = max(r["step"] for r in read_metrics(run_dir) if r.get("kind") == "step")
    assert logged < STEPS and not ckpt.list_checkpoints(run_dir / "checkpoints")   # no disk checkpoint to resume from
    held = [snapshot.held(h) for h in hosts[:4]]
    assert all(held) and all(h[0][0] >= logged - 2 for h in held), held     # the last updates, on every host

    # h3 is gone, h5 (a spare, no snapshot) takes the third rank
    out = wait_all(_start([hosts[0], hosts[1], hosts[4]], _opts(run_dir), restart=1), timeout=300)
    wait_all(_start([None] * 4, _opts(ref_dir)), timeout=300)

    records = read_metrics(run_dir)
    [resume] = [r for r in records if r.get("event") == "resume"]
    assert resume["source"] == "snapshot" and resume["step"] in (logged - 1, logged), (resume, logged)
    assert "does not match its MAC" not in "".join(out), out
    # the lowest survivor holding the newest update sends it to the others: the spare, and a survivor killed
    # while it was still writing that update (the kill lands at any point of a write)
    survivors = [held[0], held[1], []]
    holders = [r for r, h in enumerate(survivors) if resume["step"] in [s for s, _ in h]]
    assert holders and resume["step"] == max(h[0][0] for h in survivors if h), (resume, survivors)
    assert resume["from_rank"] == holders[0], (resume, survivors)
    assert resume["fetched_by"] == [r for r in range(3) if r not in holders] and 2 in resume["fetched_by"], resume
    assert resume["resumed_from"] == f"snapshot of update {resume['step']} (rank {holders[0]})"
    assert (resume["world_size"], resume["local_batch"]) == (3, 8)
    assert snapshot.held(hosts[4])[0][0] >= resume["step"], out              # the spare holds it now

    got = [(r["step"], r["loss"], r["accuracy"], r["lr"]) for r in latest_by_step(records, "step")]
    want = [(r["step"], r["loss"], r["accuracy"], r["lr"]) for r in latest_by_step(read_metrics(ref_dir), "step")]
    assert [row[0] for row in got] == list(range(1, STEPS + 1))
    for g, w in zip(got, want):
        assert g == pytest.approx(w, rel=1e-5, abs=1e-7), f"step {g[0]}: 4->3 {g} vs stays on 4 {w}"
