"""No step lost: elastic restarts resume from the in-memory snapshots on real OpenSSH hosts in network namespaces.

The GroupNorm script (train_groupnorm.py) uses podrun.runtime.elastic: a snapshot on every host after every
update, a disk checkpoint every 100 updates (never, within these runs, unless a test says otherwise), so only
a snapshot can resume a run at the step where it was cut. Losses are compared with the same training done in
this process on one replica (GroupNorm: the split of the global batch changes only float rounding).
"""
from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import pytest

from tests.elastic.test_elastic_ssh import TRAIN, steps, wait_step
from tests.launch.helpers import end, podrun_popen, run_dir, summary, wait_output, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.torch, pytest.mark.timeout(300)]
STEPS, G = 24, 12


def reference_losses(n: int = STEPS, g: int = G, samples: int = 240) -> dict[int, float]:
    """The GroupNorm run's loss at each step, trained here on one replica (local batch G, GA 1): trained once
    per process (the training is deterministic), a copy for each caller."""
    return dict(_reference_losses(n, g, samples))


@functools.lru_cache(maxsize=None)
def _reference_losses(n: int, g: int, samples: int) -> dict[int, float]:
    import torch

    from tests.elastic import groupnorm

    x, y = groupnorm.data(samples)
    model = groupnorm.model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    out = {}
    for step in range(n):
        idx = groupnorm.global_batch(step * g, g, samples)
        opt.zero_grad()
        loss = groupnorm.micro_loss(model, x, y, idx, micro=0, replicas=1, local_batch=g, replica=0)
        loss.backward()
        opt.step()
        out[step + 1] = loss.item()
    return out


def launch(hosts, names, tmp_path, port: int, *extra, train_extra=()):
    args = ["launch", "--hosts", ",".join(names), "--devices-per-host", "1", "--transport", "ssh",
            "--ssh-config", hosts.ssh_config_path, "--python", hosts.python, "--runs-dir", str(tmp_path / "runs"),
            "--master-port", str(port), "--keepalive", "4", "--global-batch", str(G), *extra,
            "--", sys.executable, TRAIN, "--steps", str(STEPS), "--sleep", "0.15", "--checkpoint-every", "100",
            *train_extra]
    return podrun_popen(*args)


def resumes(rd: Path) -> list[dict]:
    return [r for r in map(json.loads, (rd / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == "run" and r["event"] == "resume"]


def finish(p, timeout: float = 240) -> str:
    try:
        return p.communicate(timeout=timeout)[1]
    finally:
        end(p)


def cut_run(hosts, names, tmp_path, port: int, cut: str, *extra, at_step: int = 8,
            train_extra=()) -> tuple[Path, str]:
    """Launch, cut host ``cut`` once step ``at_step`` is logged, and wait for the run's end, which must be
    exit 0: (the run dir, podrun's stderr)."""
    p = launch(hosts, names, tmp_path, port, *extra, train_extra=train_extra)
    try:
        wait_step(tmp_path / "runs", at_step, 120)
        hosts.isolate(cut)
    finally:
        err = finish(p)
    assert p.returncode == 0, err
    return run_dir(tmp_path / "runs"), err


def check_curve(rd: Path) -> dict[int, dict]:
    """Every step 1..STEPS logged, each loss that of the run that lost nothing (rel 1e-5)."""
    got, ref = steps(rd), reference_losses()
    assert sorted(got) == list(range(1, STEPS + 1))
    for s in got:
        assert got[s]["loss"] == pytest.approx(ref[s], rel=1e-5, abs=1e-7), s
    return got


def check_no_step_replayed(rd: Path, replan: dict, resume: dict) -> None:
    """The attempt resumed at the last step logged before the loss (or the one in flight was lost): its first
    step is at_step + 1 or at_step, which the disk checkpoint (every 100 steps) could not give."""
    assert resume["source"] == "snapshot", resume
    assert resume["step"] + 1 in (replan["at_step"], replan["at_step"] + 1), (resume, replan["at_step"])
    assert replan["resumed_from"] == {"step": resume["step"], "source": "snapshot", "from_rank": resume["from_rank"]}


def shm_gone(rd: Path) -> None:
    """The run's snapshot directory is removed once the run has ended (the cut host's agent, which lost its
    controller, removes its own when it notices)."""
    d = Path("/dev/shm") / f"podrun-{rd.name}"
    assert wait_until(lambda: not d.exists(), 60, 0.2), sorted(os.listdir(d)) if d.exists() else d


def test_lost_host_then_the_master_host_each_resume_from_the_snapshots_with_no_step_replayed(make_ssh_hosts,
                                                                                             tmp_path):
    """Two claims in one run (one launch, its workers started once): h3 is cut at step 6, the run re-plans
    4 -> 3 and resumes from the snapshot every survivor holds (none fetched) with no step replayed; then h1, the
    master host, is cut at step 12 and the run resumes again, on h2 and h4, from the survivors' snapshot with no
    step replayed. The curve is that of a run that lost nothing. Each cut leaves 12 steps or more (0.15 s each at
    least) for the test to cut before the run could end."""
    hosts = make_ssh_hosts(4)
    p = launch(hosts, hosts.hosts, tmp_path, 29700, "--elastic", "2", "--max-restarts", "2")
    try:
        wait_step(tmp_path / "runs", 6, 120)
        hosts.isolate("h3")
        wait_step(tmp_path / "runs", 12, 120)          # reached after the first resume
        hosts.isolate("h1")
    finally:
        err = finish(p)
    assert p.returncode == 0, err
    assert "re-planned 4 -> 3 hosts: 1 x 4 x GA 3 -> 1 x 3 x GA 4 = global batch 12" in err, err
    assert "re-planned 3 -> 2 hosts: 1 x 3 x GA 4 -> 1 x 2 x GA 6" in err, err
    rd = run_dir(tmp_path / "runs")
    got = check_curve(rd)
    assert got[STEPS]["world_size"] == 2
    rp = summary(tmp_path / "runs")["elastic"]["replans"]
    res = resumes(rd)
    assert [r["hosts_lost"] for r in rp] == [["h3"], ["h1"]] and len(res) == 2, (rp, res)
    check_no_step_replayed(rd, rp[0], res[0])
    assert res[0]["fetched_by"] == []          # h1, h2 and h4 each held it
    assert rp[1]["new"]["hosts"] == ["h2", "h4"] and rp[1]["at_step"] >= 12, rp[1]
    check_no_step_replayed(rd, rp[1], res[1])
    shm_gone(rd)


def test_a_spare_receives_over_the_network_the_newest_snapshot_a_survivor_holds(make_ssh_hosts, tmp_path):
    """Two claims in one run: PODRUN_TEST_SNAPSHOT_UNTIL (a test knob) keeps h1 and h3 from writing snapshots after
    update 5, so only h2 holds the newer ones; h2 is cut at step 9 and the spare h4 takes its place. The newest
    snapshot's only copy was lost, so the run falls back to the next complete one, update 5, the newest a survivor
    holds (not from scratch, and not from disk: the checkpoint interval is 100); and h4, which held none,
    received it over the network from h1."""
    hosts = make_ssh_hosts(4)
    rd, err = cut_run(hosts, hosts.hosts[:3], tmp_path, 29706, "h2", "--elastic", "3", "--spare-hosts", "h4",
                      "--max-restarts", "1", "--env", "PODRUN_TEST_SNAPSHOT_UNTIL=h1=5,h3=5", at_step=9)
    assert "spare h4 in its place; re-planned 3 -> 3 hosts" in err, err
    check_curve(rd)
    s = summary(tmp_path / "runs")
    assert [x["host"] for x in s["instances"]] == ["h1", "h4", "h3"]
    [rp] = s["elastic"]["replans"]
    [res] = resumes(rd)
    assert rp["at_step"] >= 9 and res["step"] == 5 and res["source"] == "snapshot", (rp, res)
    assert rp["resumed_from"] == {"step": 5, "source": "snapshot", "from_rank": res["from_rank"]}, (rp, res)
    assert res["fetched_by"] == [1] and res["from_rank"] == 0      # h4 (rank 1 now) had none: h1 sent it
    shm_gone(rd)


def test_no_snapshot_left_on_a_survivor_falls_back_to_the_disk_checkpoint(make_ssh_hosts, tmp_path):
    """With the test knob PODRUN_TEST_SNAPSHOT_UNTIL at 0 on h1, h2 and h4 (they write none) and h3 cut, the run
    resumes from the disk checkpoint (every 4 updates here)."""
    hosts = make_ssh_hosts(4)
    rd, _ = cut_run(hosts, hosts.hosts, tmp_path, 29724, "h3", "--elastic", "2", "--max-restarts", "1",
                    "--env", "PODRUN_TEST_SNAPSHOT_UNTIL=h1=0,h2=0,h4=0", at_step=9,
                    train_extra=("--checkpoint-every", "4"))
    check_curve(rd)
    [rp] = summary(tmp_path / "runs")["elastic"]["replans"]
    [res] = resumes(rd)
    assert res["source"] == "checkpoint" and res["step"] % 4 == 0 and 8 <= res["step"] <= rp["at_step"], (rp, res)
    assert rp["resumed_from"] == {"step": res["step"], "source": "checkpoint", "from_rank": None}
    shm_gone(rd)


def test_a_second_failure_during_recovery_is_recovered_from_the_snapshots_again(make_ssh_hosts, tmp_path):
    """h3 is cut at step 8; while the 3 hosts left recover (held there by the test knob
    PODRUN_TEST_RECOVERY_HOLD_S after agreeing on the snapshot), h2 is cut too. The run re-plans again, to 2
    hosts, resumes from the same snapshot and ends with the curve of a run that lost nothing."""
    hosts = make_ssh_hosts(4)
    p = launch(hosts, hosts.hosts, tmp_path, 29730, "--elastic", "2", "--max-restarts", "2",
               "--env", "PODRUN_TEST_RECOVERY_HOLD_S=8")
    try:
        wait_step(tmp_path / "runs", 8, 120)
        hosts.isolate("h3")
        wait_output(p, "snapshot recovery: holding", 120)
        hosts.isolate("h2")
    finally:
        err = finish(p)
    assert p.returncode == 0, err
    said = [line for line in err.splitlines() if "elastic:" in line]
    assert len(said) == 2 and "re-planned 3 -> 2 hosts: 1 x 3 x GA 4 -> 1 x 2 x GA 6" in said[1], err
    rd = run_dir(tmp_path / "runs")
    got = check_curve(rd)
    assert got[STEPS]["world_size"] == 2
    rp = summary(tmp_path / "runs")["elastic"]["replans"]
    res = resumes(rd)
    assert [r["hosts_lost"] for r in rp] == [["h3"], ["h2"]]
    assert len(res) == 1 and res[0]["source"] == "snapshot"      # the interrupted attempt logged no resume
    assert rp[0]["resumed_from"] is None and rp[1]["at_step"] == rp[0]["at_step"]   # no step in between
    check_no_step_replayed(rd, rp[1], res[0])
    shm_gone(rd)
