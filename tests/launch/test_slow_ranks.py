"""Slow ranks (issue 20 item 5): a rank whose own busy time per step (podrun.runtime.steps.StepClock: its work before the
gradient all-reduce, not the wall step time every DDP rank shares) stays well above the others' is named on
the console and in summary.json with its host; even ranks name none. Real processes, real DDP over gloo."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from podrun.launch.slow_ranks import SLOW_FACTOR, SLOW_WINDOW
from podrun.train.data import TEST_INPUT_DELAY_ENV
from tests.launch.helpers import SCRIPTS, podrun, run_dir, summary
from tests.ports import free_port

pytestmark = [pytest.mark.timeout(180), pytest.mark.torch]
SLOW = str(SCRIPTS / "slow_rank.py")
ROOT = Path(__file__).resolve().parents[2]
STEPS = SLOW_WINDOW + 8
RECIPE = str(ROOT / "recipes" / "resnet18_cifar10")


def _launch(tmp_path, base: float, slow_rank: int, extra: float):
    runs = tmp_path / "runs"
    cp = podrun("launch", "--devices-per-host", "3", "--runs-dir", str(runs), "--",
                sys.executable, SLOW, str(STEPS), str(base), str(slow_rank), str(extra), timeout=150)
    assert cp.returncode == 0, cp.stderr
    return cp, summary(runs)


def test_a_rank_with_a_slow_data_step_is_named_with_its_host(tmp_path):
    """Rank 2's data step takes 0.5 s more: every rank's wall step time is the same (DDP), its busy time is
    not; podrun names rank 2 on localhost once, with its busy time against the others' median and the cause its
    step split gives (input: the script reports through podrun.runtime.steps, the hook for a user's script). Only what
    the sleeps guarantee is bounded (busy at least the sleep); the others' busy time, which a loaded machine
    stretches, is checked only through the rule's own ratio."""
    cp, s = _launch(tmp_path, 0.1, 2, 0.5)
    named = [l for l in cp.stderr.splitlines() if re.match(r"podrun: rank \d+ on \S+ is slow:", l)]
    assert len(named) == 1, cp.stderr
    m = re.match(r"podrun: rank 2 on localhost is slow: busy ([0-9.]+) s per step against a median of ([0-9.]+) s "
                 r"on the other ranks \(([0-9.]+)x\)", named[0])
    assert m, named[0]
    busy, median, ratio = float(m[1]), float(m[2]), float(m[3])
    assert busy >= 0.6 and median >= 0.1 and ratio >= SLOW_FACTOR, named[0]
    assert ratio == pytest.approx(busy / median, rel=0.1), named[0]
    assert not re.search(r"\d+\.\d{4,}", named[0]), named[0]          # rounded for people
    assert "; the cause: input: it waits " in named[0], named[0]
    assert [(r["rank"], r["host"]) for r in s["slow_ranks"]] == [(2, "localhost")], s["slow_ranks"]
    rec = s["slow_ranks"][0]
    assert rec["busy_s"] >= 0.6 and rec["others_median_s"] >= 0.1 and rec["ratio"] >= SLOW_FACTOR
    assert rec["ratio"] == pytest.approx(rec["busy_s"] / rec["others_median_s"], rel=0.01)
    assert rec["steps"] == SLOW_WINDOW and rec["from_step"] >= SLOW_WINDOW and rec["until_step"] is None
    assert rec["cause"] == "input" and rec["cause_s"] >= 0.6 and rec["cpus"] >= 1, rec
    split = s["step_split"]["ranks"]
    assert split["2"]["input"] >= 0.6 and split["0"]["comm"] >= 0.4, split       # the others wait for it: comm
    (pts,) = s["host_busy"].values()        # the host's own work per step over the run: the report's per-host line
    assert list(s["host_busy"]) == ["localhost"] and 1 <= len(pts) <= STEPS and all(b >= 0.1 for _, b in pts), pts


def test_even_ranks_name_none(tmp_path):
    """Every rank's data step takes the same 0.3 s: no rank is named, summary.json's slow_ranks is empty."""
    cp, s = _launch(tmp_path, 0.3, -1, 0.0)
    assert " is slow:" not in cp.stderr, cp.stderr
    assert s["slow_ranks"] == []


def test_the_recipe_runner_reports_busy_time_and_a_slow_rank_is_named(tmp_path):
    """The real training loop (podrun.train, GA 2 with no_sync, DDP over gloo, 3 ranks): rank 1's forward
    passes take 0.4 s more; podrun names rank 1 on localhost from the runner's own busy-time reports, with the
    cause its step split gives: compute. summary.json keeps each rank's mean split."""
    opts = dict(data="digits", image_size=8, num_classes=10, steps=STEPS + 4, global_batch=6, grad_accum=2,
                lr=0.1, optimizer="sgd", eval_every=0, console=False, resume=False, checkpoint_every=0, seed=3)
    runs = tmp_path / "runs"
    cp = podrun("launch", "--devices-per-host", "3", "--global-batch", "6", "--grad-accum", "2",
                "--runs-dir", str(runs), "--", sys.executable, str(SCRIPTS / "slow_recipe.py"), json.dumps(opts),
                "1", "0.4", timeout=170, env={"PYTHONPATH": str(ROOT)})
    assert cp.returncode == 0, cp.stderr
    assert re.search(r"^podrun: rank 1 on localhost is slow: busy [0-9.]+ s per step.*; the cause: compute: its "
                     r"forward and backward take \d+ ms per step \(the other ranks \d+ ms\)", cp.stderr,
                     re.M), cp.stderr
    s = summary(runs)
    assert [(r["rank"], r["host"]) for r in s["slow_ranks"]] == [(1, "localhost")], s["slow_ranks"]
    rec = s["slow_ranks"][0]
    assert rec["busy_s"] >= 0.8 and rec["ratio"] >= SLOW_FACTOR, rec     # 2 forwards x 0.4 s at least
    assert rec["cause"] == "compute" and rec["cause_s"] >= 0.8, rec
    split = s["step_split"]["ranks"]
    assert sorted(split) == ["0", "1", "2"] and split["1"]["compute"] >= 0.8 and split["1"]["host"] == "localhost"
    assert s["step_split"]["input_bound"] is None and "input-bound" not in cp.stderr


def test_a_rank_whose_loader_is_slow_is_named_with_the_cause_input(tmp_path):
    """The digits recipe (resnet18: BatchNorm, whose buffers DDP broadcasts before every forward, where the fast rank
    waits for the slow one), 2 ranks: rank 1's loader takes 0.3 s more per batch (the loader's test knob,
    podrun.train.data.TEST_INPUT_DELAY_ENV); podrun names rank 1 with the cause input, its wait and its cores, within
    SLOW_WINDOW steps; the run is not input-bound (rank 0 waits for nothing). `podrun report --json` shows the
    measured split beside the plan's estimate."""
    runs = tmp_path / "runs"
    cp = podrun("launch", "--devices-per-host", "2", "--global-batch", "8", "--runs-dir", str(runs), RECIPE,
                "--data", "digits", "--image-size", "8", "--steps", str(SLOW_WINDOW + 2), "--eval-every", "0",
                "--keep-checkpoints", "0", timeout=170, env={"PYTHONPATH": str(ROOT), TEST_INPUT_DELAY_ENV: "1=0.3"})
    assert cp.returncode == 0, cp.stderr
    assert re.search(r"^podrun: rank 1 on localhost is slow: .*; the cause: input: it waits \d+ ms per step for "
                     r"input \(the other ranks \d+ ms\); it has \d+ cores? for its compute and makes its batches "
                     r"in its training thread", cp.stderr, re.M), cp.stderr
    s = summary(runs)
    (rec,) = s["slow_ranks"]
    assert (rec["rank"], rec["cause"]) == (1, "input") and rec["cause_s"] >= 0.3 and rec["loaders"] == 0, rec
    assert rec["from_step"] <= SLOW_WINDOW, rec
    split = s["step_split"]["ranks"]
    assert split["1"]["input"] >= 0.25 and split["0"]["input"] < 0.1 and s["step_split"]["input_bound"] is None
    assert split["0"]["comm"] >= 0.2, split            # rank 0 waits for rank 1 (buffers, all-reduce): comm
    rep_ = podrun("report", str(run_dir(runs)), "--json", "--no-plot", env={"PYTHONPATH": str(ROOT)})
    assert rep_.returncode == 0, rep_.stderr
    got = json.loads(rep_.stdout)["step_split"]
    assert got["ranks"] == 2 and got["slowest"]["rank"] == "1" and got["measured"]["input"] >= 0.1, got
    assert got["estimate"]["input"] == 0.0 and got["estimate"]["compute"] > 0 and got["furthest_off"]["term"], got


@pytest.mark.cluster
def test_a_slow_rank_on_another_host_is_named_with_that_host(ssh_hosts, tmp_path):
    """3 real OpenSSH hosts (one rank each): rank 2's data step takes 0.5 s more; podrun names rank 2 on h3."""
    names = ssh_hosts.hosts[:3]
    runs = tmp_path / "runs"
    cp = podrun("launch", "--hosts", ",".join(names), "--devices-per-host", "1", "--transport", "ssh",
                "--ssh-config", ssh_hosts.ssh_config_path, "--python", ssh_hosts.python, "--runs-dir", str(runs),
                "--master-port", str(free_port()), "--", sys.executable, SLOW, str(STEPS), "0.1", "2", "0.5",
                timeout=150)
    assert cp.returncode == 0, cp.stderr
    assert re.search(rf"^podrun: rank 2 on {names[2]} is slow: busy", cp.stderr, re.M), cp.stderr
    assert " is slow:" not in cp.stderr.replace(f"rank 2 on {names[2]} is slow:", ""), cp.stderr
    s = summary(runs)
    assert [(r["rank"], r["host"]) for r in s["slow_ranks"]] == [(2, names[2])], s["slow_ranks"]
