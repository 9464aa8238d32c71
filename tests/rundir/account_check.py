"""The run's account checked on a real run's summary.json: the fault tests call it on the runs they make."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from podrun.rundir.account import CATEGORIES

ROUNDING = 0.01           # summary.json's seconds are rounded to the millisecond, eight of them summed
SKEW_S = 0.05             # a process's start read from /proc against the uptime: 10 ms ticks, the two files' reads


def process_start(pid: int) -> float:
    """When process ``pid`` started, wall clock, read as podrun reads its own (/proc's start against the uptime):
    call it while the process lives."""
    ticks = int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def assert_adds_up(run_dir: str | Path, around: tuple[float, float] | None = None,
                   started: float | None = None) -> dict:
    """summary.json's account: every category present and none below 0, and their sum the account's own span
    (``until - since``: the moments podrun took at its start and at its last record, so a category left out or
    a second counted twice shows, however loaded the machine); each attempt's sum its own span (ended -
    started). ``around``: the test's clock read before it started podrun and after podrun ended: the account's
    span lies within it (how much of it podrun's exit, the fork and the test's own wake-up took is the machine's
    load, not podrun's, so no bound on the difference). ``started``: podrun's process start as the test read it
    (process_start): the account begins there. Returns the account."""
    s = json.loads((Path(run_dir) / "summary.json").read_text())
    acc = s["account"]
    secs = acc["seconds"]
    assert set(secs) == set(CATEGORIES) and min(secs.values()) >= 0, acc
    assert abs(sum(secs.values()) - acc["wall_s"]) <= ROUNDING, acc
    assert abs(acc["until"] - acc["since"] - acc["wall_s"]) <= ROUNDING, (acc["until"] - acc["since"], acc)
    mine = [a for a in s["attempts"] if a["launch"] == s["attempts"][-1]["launch"]]
    assert len(acc["attempts"]) == len(mine), (acc, mine)
    for a, part in zip(mine, acc["attempts"]):
        assert abs(sum(part["seconds"].values()) - (a["ended"] - a["started"])) <= ROUNDING, (a, part)
        assert min(part["seconds"].values()) >= 0, part
        assert acc["since"] <= a["started"] <= a["ended"] <= acc["until"], (a, acc)
    if around is not None:
        assert around[0] - SKEW_S <= acc["since"] and acc["until"] <= around[1], (around, acc)
    if started is not None:
        assert abs(acc["since"] - started) <= SKEW_S, (started, acc)
    return acc
