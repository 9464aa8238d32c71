"""summary.json's one typed reader (podrun.rundir.summary): what layout.write_summary writes reads back field by
field, an earlier launch's attempts are carried into the next summary unchanged, a damaged file reads as absent;
and the elastic re-plan over it and the step log does no I/O."""
from __future__ import annotations

import ast
import json
from pathlib import Path

from hypothesis import given, strategies as st

from podrun.rundir.layout import SUMMARY, write_summary
from podrun.rundir.summary import Attempt, Summary, read_summary

RECORD = {
    "run_id": "r1", "exit_code": 1, "status": "failed", "transport": "local", "restart_count": 1,
    "command": ["python", "t.py"], "master": "127.0.0.1:29500",
    "root_cause": {"instance": 1, "host": "b", "local_rank": 0, "exit_code": 1, "reason": "exit 1"},
    "instances": [{"index": 0, "host": "a", "status": "ok", "exit_code": 0, "workers": {"0": 0}},
                  {"index": 1, "host": "b", "status": "failed", "exit_code": 1, "workers": {"0": 1}}],
    "timings": {"started": 1.0, "ended": 3.5, "duration_s": 2.5, "all_ready_s": 0.5},
    "attempts": [{"launch": 0, "restart_count": 0, "exit_code": 1, "status": "failed", "root_cause": None},
                 {"launch": 1, "restart_count": 1, "exit_code": 1, "status": "failed",
                  "root_cause": {"host": "b", "reason": "exit 1"}, "plan": "plan-1.json"}],
    "elastic": {"min_hosts": 1, "replans": [{"restart": 1, "at_step": 4, "old": {}, "new": {}}, "not a record"]},
}


def test_what_is_written_reads_back(tmp_path):
    write_summary(tmp_path, RECORD)
    s = read_summary(tmp_path)
    assert (s.run_id, s.status, s.exit_code, s.transport, s.restart_count) == ("r1", "failed", 1, "local", 1)
    assert s.command == ["python", "t.py"] and s.root_cause == RECORD["root_cause"]
    assert s.instances == tuple(RECORD["instances"]) and (s.duration_s, s.all_ready_s) == (2.5, 0.5)
    assert [a.to_dict() for a in s.attempts] == RECORD["attempts"]
    assert s.replans == (RECORD["elastic"]["replans"][0],)


def test_a_damaged_or_absent_summary_reads_as_none(tmp_path):
    problems: list[str] = []
    assert read_summary(tmp_path, problems) is None and problems == []
    (tmp_path / SUMMARY).write_text("[1, 2]")
    assert read_summary(tmp_path, problems) is None and problems == [f"{tmp_path / SUMMARY}: not a JSON object"]
    (tmp_path / SUMMARY).write_bytes(b"\xff{")
    assert read_summary(tmp_path) is None
    assert Summary.from_dict({"attempts": "x", "instances": [1], "timings": 3, "elastic": []}) == Summary()


_values = st.none() | st.integers() | st.text(max_size=5)


@given(st.fixed_dictionaries({"restart_count": _values, "exit_code": _values, "status": _values,
                              "root_cause": st.none() | st.dictionaries(st.text(max_size=3), _values, max_size=3)},
                             optional={"launch": _values, "plan": st.text(max_size=8)}))
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
