"""bench/bench_elastic.py's judgements of a recovery, on logs it did not write: the updates done again after a
resume, and whether the per-step losses equal a run without the failure (its replay checked against the bench
script itself, run under real torch.distributed gloo)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from bench import bench_elastic as be
from tests.ports import free_port


def _log(batches) -> list[dict]:
    """steps.log records of steps 1..n at the given global batches, step s logged at t = s, with the losses of
    the replay of those batches."""
    losses = be.reference_losses(tuple(batches))
    return [{"step": i + 1, "t": float(i + 1), "loss": losses[i], "global_batch": g, "world": g // 6}
            for i, g in enumerate(batches)]


def test_losses_equal_only_when_every_step_matches_the_run_without_the_failure():
    cut = 4.5
    same = _log([24] * 7)
    assert be.compare_losses(same, cut)["losses_equal"] is True
    # the global batch shrinks after the cut (torchrun, torchft, dlrover): the losses differ from step 5 on
    shrunk = _log([24] * 4 + [18] * 3)
    got = be.compare_losses(shrunk, cut)
    assert got["losses_equal"] is False and "first differs at step 5 (global batch 18)" in got["losses_note"]
    # one loss off by 1e-4 relative is caught; a step never logged is named
    off = [dict(x) for x in same]
    off[5]["loss"] *= 1 + 1e-4
    assert "first differs at step 6" in be.compare_losses(off, cut)["losses_note"]
    gap = [x for x in same if x["step"] != 3]
    got = be.compare_losses(gap, cut)
    assert got["losses_equal"] is False and "steps never logged [3]" in got["losses_note"]
    # a run that started smaller (torchft before its 4th group joined) is compared with a replay that did too
    assert be.compare_losses(_log([18, 18] + [24] * 5), cut)["losses_equal"] is True


def test_updates_done_again_count_the_steps_logged_before_the_cut_from_the_resumed_one_on():
    before = [{"step": s, "t": float(s)} for s in range(1, 7)]          # steps 1..6 before the cut at 6.5
    assert be.redone(before, 6.5, {"step": 7}) == 0                      # resumed from the newest state
    assert be.redone(before, 6.5, {"step": 5}) == 2                      # steps 5 and 6 done again
    assert be.redone(before, 6.5, {"step": 1}) == 6


def test_replay_equals_the_bench_script_under_gloo(tmp_path):
    """The replay is the computation bench/scripts/elastic_train.py does: one real gloo process, 5 steps at
    1 x 1 x GA 6 (global batch 6), losses equal within the bench's tolerance."""
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}
    for k in [k for k in env if k.startswith("PODRUN_")]:
        del env[k]
    r = subprocess.run([sys.executable, be.SCRIPT, "--dir", str(tmp_path), "--batch", "1", "--grad-accum", "6",
                        "--steps", "5", "--sleep", "0"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    logged = [json.loads(line) for line in (tmp_path / "steps.log").read_text().splitlines()]
    assert [x["step"] for x in logged] == [1, 2, 3, 4, 5] and {x["global_batch"] for x in logged} == {6}
    ref = be.reference_losses((6,) * 5)
    assert all(abs(x["loss"] - ref[i]) <= be.LOSS_RTOL * abs(ref[i]) for i, x in enumerate(logged)), (logged, ref)
    assert ref != be.reference_losses((6, 6, 12, 6, 6))                   # the replay depends on the batches


def test_a_peer_that_cannot_run_is_a_row_that_says_why():
    results = {("podrun", "h3"): [{"subject": "podrun", "resumed_s": 6.0, "redone": 0, "global_batch_before": 24,
                                   "global_batch_after": 24, "losses_equal": True, "max_rel": 1e-7,
                                   "losses_note": "9 steps", "restarted": True}],
               ("dlrover", "h3"): [{"subject": "dlrover", "resumed_s": None, "why": "master unreachable"}]}
    rows = {r["benchmark"]: r for r in be.rows(results, quick=True)}
    assert "dlrover: master unreachable" in rows["elastic_vs_dlrover"]["note"]
    assert rows["elastic_vs_dlrover"]["peer_value"] is None and rows["elastic_vs_dlrover"]["value"] == 6.0
    assert "per-step losses equal a run without the failure: yes" in rows["elastic_vs_torchrun"]["note"]
    assert "torchrun: not run" in rows["elastic_vs_torchrun"]["note"]


def test_missing_peer_venv_is_named_with_the_command_that_makes_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PODRUN_BENCH_PEERS", str(tmp_path / "none"))
    why = be.peer_missing("torchft")
    assert str(tmp_path / "none" / "bin" / "torchft_lighthouse") in why and "bench/install_peers.sh" in why
    assert be.peer_missing("podrun") is None
