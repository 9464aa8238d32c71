"""The run's account checked on a real run's summary.json: the fault tests call it on the runs they make."""
from __future__ import annotations

import json
from pathlib import Path

from podrun.rundir.account import CATEGORIES

TOLERANCE = 0.01          # the account's wall against the wall measured outside podrun: within 1 %,
EXIT_S = 0.25             # or this: podrun's end after its last summary.json (the outcome printed, its exit)


def assert_adds_up(run_dir: str | Path, wall: float | None = None) -> dict:
    """summary.json's account: every category present and none below 0, their sum its wall (to the rounding),
    each attempt's sum its own span (ended - started), and the whole within TOLERANCE (or EXIT_S) of ``wall`` (the
    seconds the test measured around podrun's process) when given. Returns the account."""
    s = json.loads((Path(run_dir) / "summary.json").read_text())
    acc = s["account"]
    secs = acc["seconds"]
    assert set(secs) == set(CATEGORIES) and min(secs.values()) >= 0, acc
    assert abs(sum(secs.values()) - acc["wall_s"]) <= 0.01, acc
    mine = [a for a in s["attempts"] if a["launch"] == s["attempts"][-1]["launch"]]
    assert len(acc["attempts"]) == len(mine), (acc, mine)
    for a, part in zip(mine, acc["attempts"]):
        assert abs(sum(part["seconds"].values()) - (a["ended"] - a["started"])) <= 0.01, (a, part)
        assert min(part["seconds"].values()) >= 0, part
    if wall is not None:
        assert abs(acc["wall_s"] - wall) <= max(TOLERANCE * wall, EXIT_S), (acc["wall_s"], wall, acc)
    return acc
