"""Each rank's step split (issue 43): the typed split on the progress channel, the user hook (podrun.runtime.steps)
on a real pipe and off outside podrun, the pure classifier of a slow rank's cause and of an input-bound run, and
the report's measured split beside the plan's estimate. The real runs are in tests/launch/test_slow_ranks.py."""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from podrun.launch.slow_ranks import INPUT_BOUND_SHARE, SLOW_WINDOW, StepSplits, cause_of, input_bound
from podrun.rundir.report import step_split
from podrun.rundir.summary import Summary
from podrun.runtime import progress, steps
from podrun.wire.protocol import StepSplit

S = StepSplit


@pytest.mark.parametrize("rec, want", [
    ({"input": 0.1, "compute": 0.2, "comm": 0, "optim": 0.01, "cpus": 4, "loaders": 1}, S(0.1, 0.2, 0, 0.01, 4, 1)),
    ({"input": 0.1, "compute": 0.2, "comm": 0, "optim": 0.01, "cpus": True}, S(0.1, 0.2, 0, 0.01)),
    ({"input": -1, "compute": 0.2, "comm": 0, "optim": 0}, None),
    ({"input": "1", "compute": 0.2, "comm": 0, "optim": 0}, None),
    ({"input": float("inf"), "compute": 0.2, "comm": 0, "optim": 0}, None),
    ({"compute": 0.2, "comm": 0, "optim": 0}, None),
    ([0.1, 0.2], None),
])
def test_a_split_reads_back_or_is_dropped(rec, want):
    got = S.from_dict(rec)
    assert got == want
    if got is not None:
        assert S.from_dict(json.loads(json.dumps(got.to_dict()))) == got


OTHERS = [S(0.002, 0.10, 0.30, 0.01), S(0.003, 0.11, 0.31, 0.01), S(0.002, 0.09, 0.29, 0.01)]


@pytest.mark.parametrize("mine, cause", [
    (S(0.300, 0.10, 0.00, 0.01), "input"),          # the others wait for it in comm; its own excess is input
    (S(0.002, 0.45, 0.00, 0.01), "compute"),
    (S(0.002, 0.10, 0.60, 0.01), "comm"),
    (S(0.002, 0.10, 0.30, 0.20), "optim"),
    (S(0.002, 0.10, 0.30, 0.01), None),              # no part above the others': no cause
])
def test_the_cause_is_the_part_with_the_largest_excess(mine, cause):
    got = cause_of(mine, OTHERS)
    assert (got[0] if got else None) == cause
    assert cause_of(mine, []) is None


@pytest.mark.parametrize("shares, bound", [
    ((0.5, 0.4, 0.35), True),
    ((0.5, 0.4, INPUT_BOUND_SHARE - 0.01), False),    # one rank fed well enough: not the run's bound
    ((0.0, 0.0), False),
])
def test_input_bound_needs_every_rank_over_the_share(shares, bound):
    means = {r: S(x, 1.0 - x, 0.0, 0.0) for r, x in enumerate(shares)}
    rec = input_bound(means)
    assert (rec is not None) == bound
    if bound:
        assert rec["min_share"] == pytest.approx(min(shares)) and rec["ranks"] == len(shares)


def test_the_input_bound_run_is_named_once_and_the_means_kept():
    """Two ranks waiting 60 % of their step for input: named once their windows are full, never again;
    summary.json's step_split holds each rank's mean over the run."""
    splits, named = StepSplits(), []
    for i in range(3 * SLOW_WINDOW):
        for rank in (0, 1):
            rec = splits.add(rank, f"h{rank}", S(0.06, 0.03, 0.0, 0.01, 2, 0))
            if rec is not None:
                named.append((i, rank))
    assert named == [(SLOW_WINDOW, 0)]          # at the first rank's report once every window is full
    out = splits.to_dict()
    assert out["input_bound"]["min_share"] == pytest.approx(0.6)
    assert out["ranks"]["1"] == {"host": "h1", "reports": 3 * SLOW_WINDOW, "input": 0.06, "compute": 0.03,
                                 "comm": 0.0, "optim": 0.01, "cpus": 2, "loaders": 0}


@pytest.fixture
def channel(monkeypatch):
    """The progress channel on a real pipe, as the agent gives a worker (PODRUN_PROGRESS_FD)."""
    r, w = os.pipe()
    monkeypatch.setenv(progress.FD_ENV, str(w))
    monkeypatch.setattr(progress, "_state", {"fd": None, "checked": False, "last": 0.0, "phase": None})
    monkeypatch.setattr(steps, "_hook", steps._Hook())
    yield r
    os.close(r)
    os.close(w)


def test_the_hook_sends_the_mean_split_of_its_steps(channel, monkeypatch):
    """A user's script, three steps of phases on a clock the test moves (no sleeps: the figures are exact under any
    load): step 1's report goes; step 2's is merged (closer than MIN_INTERVAL_S to the last), so step 3's (the last
    step, always sent) carries the mean of steps 2 and 3, neither their sum nor step 3's alone nor all three's."""
    now = [0.0]
    monkeypatch.setattr(steps, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    for i, (inp, compute) in enumerate([(0.010, 0.005), (0.020, 0.010), (0.040, 0.030)], start=1):
        with steps.phase("input"):
            now[0] += inp
        with steps.phase("compute"):
            now[0] += compute
        with steps.phase("optim"):
            pass
        assert steps.step(i, 3, loss=1.5) == (i != 2)
    recs = [json.loads(line) for line in os.read(channel, 8192).decode().splitlines()]
    assert [r["step"] for r in recs] == [1, 3] and recs[1]["loss"] == 1.5
    split = S.from_dict(recs[1]["split"])
    assert (split.input, split.compute, split.comm, split.optim) == pytest.approx((0.030, 0.020, 0.0, 0.0))
    assert recs[1]["busy_seconds"] == pytest.approx(split.input + split.compute, abs=1e-5)
    with pytest.raises(ValueError, match="phase 'data'"):
        steps.phase("data")


def test_the_hook_is_a_no_op_outside_podrun(monkeypatch):
    monkeypatch.delenv(progress.FD_ENV, raising=False)
    monkeypatch.setattr(progress, "_state", {"fd": None, "checked": False, "last": 0.0, "phase": None})
    assert steps.phase("input") is steps.phase("compute")          # one shared null context: no clock read
    with steps.phase("input"):
        pass
    assert steps.step(1, 2) is False and not steps.enabled()


PLAN = {"estimate": {"step_seconds": 0.12, "allreduce_seconds": 0.04, "allreduce_hidden_fraction": 0.5,
                     "assumptions": ["per-device rate 100 img/s (published)"]}}


@pytest.mark.parametrize("measured, term", [
    ({"input": 0.30, "compute": 0.10, "comm": 0.02, "optim": 0.0}, "input"),
    ({"input": 0.00, "compute": 0.40, "comm": 0.02, "optim": 0.0}, "compute"),
    ({"input": 0.00, "compute": 0.10, "comm": 0.30, "optim": 0.0}, "comm"),
])
def test_the_report_sets_the_split_beside_the_estimate(measured, term):
    """The plan estimated compute 0.1 s (device rate) and comm 0.02 s (half of a 0.04 s all-reduce hidden), input
    and optim free: the term furthest from what was measured names the assumption that was wrong."""
    launch = Summary.from_dict({"step_split": {"ranks": {"0": {"host": "h1", **measured},
                                                         "1": {"host": "h2", **measured, "compute": 0.0}}}})
    got = step_split(launch, PLAN)
    assert got["estimate"]["compute"] == pytest.approx(0.1) and got["estimate"]["comm"] == pytest.approx(0.02)
    assert got["furthest_off"]["term"] == term and got["slowest"]["rank"] == "0"
    assert step_split(launch, {"estimate": {"step_seconds": 0.0}})["estimate"] is None     # a bare command's plan
    assert step_split(Summary(), PLAN) is None


def test_the_report_sets_a_measured_input_estimate_beside_the_measured_input():
    """A plan made with an input measurement (podrun calibrate --data: input 0.3 s, compute 0.1 s of a CPU step of
    0.42 s) is set beside a run that waited 0.3 s for input: input is not off; compute, 0.4 s measured, is."""
    plan = {"estimate": {**PLAN["estimate"], "step_seconds": 0.42, "compute_seconds": 0.1, "input_seconds": 0.3}}
    launch = Summary.from_dict({"step_split": {"ranks": {"0": {"host": "h1", "input": 0.3, "compute": 0.4,
                                                               "comm": 0.02, "optim": 0.0}}}})
    got = step_split(launch, plan)
    assert got["estimate"]["input"] == pytest.approx(0.3) and got["estimate"]["compute"] == pytest.approx(0.1)
    assert got["furthest_off"]["term"] == "compute"
    launch = Summary.from_dict({"step_split": {"ranks": {"0": {"host": "h1", "input": 0.9, "compute": 0.1,
                                                               "comm": 0.02, "optim": 0.0}}}})
    got = step_split(launch, plan)
    assert got["furthest_off"]["term"] == "input"
    assert got["furthest_off"]["assumption"] == "the measured input rate (podrun calibrate --data)"
