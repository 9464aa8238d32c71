"""summary.json's one typed reader (podrun.rundir.summary): what layout.write_summary writes reads back field by
field, an earlier launch's attempts are carried into the next summary unchanged, a damaged file reads as absent;
and the elastic re-plan over it and the step log does no I/O."""
from __future__ import annotations

import ast
import json
from pathlib import Path

from hypothesis import given, strategies as st

from podrun.rundir.account import CATEGORIES
from podrun.rundir.layout import SUMMARY
from podrun.rundir.summary import Attempt, RunStatus, Summary, read_summary, save

RECORD = {
    "run_id": "r1", "exit_code": 1, "status": "failed", "transport": "local", "restart_count": 1,
    "command": ["python", "t.py"], "master": "127.0.0.1:29500",
    "root_cause": {"instance": 1, "host": "b", "local_rank": 0, "exit_code": 1, "reason": "exit 1"},
    "instances": [{"index": 0, "host": "a", "status": "ok", "exit_code": 0, "workers": {"0": 0}},
                  {"index": 1, "host": "b", "status": "failed", "exit_code": 1, "workers": {"0": 1}}],
    "heartbeat": {"period_s": 1.0}, "timings": {"started": 1.0, "ended": 3.5, "duration_s": 2.5, "all_ready_s": 0.5},
    "hang": None, "slow_ranks": [], "host_busy": {"a": [[1, 0.5]]}, "step_split": {}, "max_restarts": 1,
    "attempts": [{"launch": 0, "restart_count": 0, "exit_code": 1, "status": "failed", "root_cause": None},
                 {"launch": 1, "restart_count": 1, "exit_code": 1, "status": "failed",
                  "root_cause": {"host": "b", "reason": "exit 1"}, "plan": "plan-1.json"}],
    "elastic": {"min_hosts": 1, "replans": [{"restart": 1, "at_step": 4, "old": {}, "new": {}}, "not a record"]},
    "account": {"wall_s": 2.0, "goodput": 0.5, "seconds": {c: 0.0 for c in CATEGORIES} | {"training": 1.0,
                                                                                            "idle": 1.0},
                "attempts": [], "since": 1.0, "until": 3.0},
}
# the records of a launch that started nothing: a failed check (the first attempt's), an agent not started
PREFLIGHT = {"run_id": "r2", "exit_code": 2, "status": "preflight_failed", "transport": "ssh",
             "problems": ["b: python3 not found"]}
START = {"run_id": "r3", "exit_code": 2, "status": "start_failed", "transport": "ssh", "error": "no agent",
         "attempts": []}


def test_what_is_written_reads_back(tmp_path):
    """Read back typed (the status an enum, after a resume too), and written again the very same record."""
    save(tmp_path, Summary.from_dict(RECORD))
    assert json.loads((tmp_path / SUMMARY).read_text()) == RECORD
    assert list(json.loads((tmp_path / SUMMARY).read_text())) == list(RECORD)      # the keys in their order
    s = read_summary(tmp_path)
    assert (s.run_id, s.status, s.exit_code, s.transport, s.restart_count) == ("r1", RunStatus.FAILED, 1, "local", 1)
    assert s.command == ("python", "t.py") and s.root_cause == RECORD["root_cause"]
    assert s.instances == tuple(RECORD["instances"]) and (s.duration_s, s.all_ready_s) == (2.5, 0.5)
    assert [a.to_dict() for a in s.attempts] == RECORD["attempts"] and s.attempts[0].status is RunStatus.FAILED
    assert s.replans == (RECORD["elastic"]["replans"][0],) and s.account.until == 3.0
    for record in (PREFLIGHT, START):
        assert Summary.from_dict(record).to_dict() == record and list(Summary.from_dict(record).to_dict()) == \
            list(record)


def test_a_damaged_or_absent_summary_reads_as_none(tmp_path):
    problems: list[str] = []
    assert read_summary(tmp_path, problems) is None and problems == []
    (tmp_path / SUMMARY).write_text("[1, 2]")
    assert read_summary(tmp_path, problems) is None and problems == [f"{tmp_path / SUMMARY}: not a JSON object"]
    (tmp_path / SUMMARY).write_bytes(b"\xff{")
    assert read_summary(tmp_path) is None
    assert Summary.from_dict({"attempts": "x", "instances": [1], "timings": 3, "elastic": []}) == Summary()
    assert Attempt.from_dict({"launch": "1", "status": "gone", "started": "x", "exit_code": True}) == Attempt()


_ints = st.none() | st.integers()


@given(st.fixed_dictionaries({"restart_count": _ints, "exit_code": _ints,
                              "status": st.none() | st.sampled_from([s.value for s in RunStatus]),
                              "root_cause": st.none() | st.dictionaries(st.text(max_size=3), _ints, max_size=3)},
                             optional={"launch": st.integers(), "plan": st.text(max_size=8),
                                       "started": st.floats(allow_nan=False)}))
def test_an_attempt_round_trips(a):
    """An earlier launch's attempt is carried into the next summary as it was (``launch`` 0 when it had none)."""
    assert Attempt.from_dict(a).to_dict() == {"launch": 0, **a}
    assert json.loads(json.dumps(Attempt.from_dict(a).to_dict())) == {"launch": 0, **a}


def io_of(path: Path) -> list[str]:
    """What a module does that reads or writes files: imports of os, pathlib, shutil, io, safefs; calls of open()."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [f"{node.module}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom) else []
        out += [n for n in names if n.split(".")[0] in ("os", "pathlib", "shutil", "io") or "safefs" in n]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open":
            out.append("open()")
    return out


def test_the_replan_is_pure():
    replan = Path(__file__).resolve().parents[2] / "podrun" / "elastic" / "replan.py"
    assert io_of(replan) == []


def test_the_purity_check_can_fail(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("import os.path\nfrom podrun import safefs\n\ndef f():\n    return open('x')\n")
    assert sorted(io_of(p)) == ["open()", "os.path", "podrun.safefs"]
