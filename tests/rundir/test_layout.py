"""The run directory's file names are spelled once, in podrun/rundir/layout.py: a module elsewhere in podrun/ that
spells one as a string literal (or an f-string of a per-instance or per-attempt name) is named here."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from podrun.rundir import layout

PKG = Path(__file__).resolve().parents[2] / "podrun"
# the names a literal is checked against: those that read as file names (the plain words, "command", "stacks",
# "errors", "zygote", "checkpoints", stand for other things too and are left to review)
NAMES = {v for k, v in vars(layout).items() if k.isupper() and isinstance(v, str) and re.search(r"[.-]", v)
         and not v.startswith("/")}
PATTERNS = [re.compile(re.escape(f("{}")).replace(re.escape("{}"), r"\{\}")) for f in (layout.instance_log,
                                                                                      layout.plan_of)]


def spelled(root: Path = PKG) -> list[str]:
    """'path:line: name' for each run-directory file name spelled outside root/rundir/."""
    out = []
    for path in sorted(root.rglob("*.py")):
        if "rundir" in path.relative_to(root).parts[:1]:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
                if any(p.fullmatch(text) for p in PATTERNS):
                    out.append(f"{path.relative_to(root)}:{node.lineno}: {text}")
            elif isinstance(node, ast.Constant) and node.value in NAMES:
                out.append(f"{path.relative_to(root)}:{node.lineno}: {node.value}")
    return sorted(out)


def test_every_run_directory_name_is_spelled_only_in_the_layout():
    assert len(NAMES) >= 12 and {"summary.json", "plan.json", "metrics.jsonl", "control.pid"} <= NAMES
    assert spelled() == []


def test_the_check_finds_a_name_spelled_elsewhere(tmp_path):
    """The check can fail: a literal file name and an f-string of an instance's log are named."""
    (tmp_path / "launch").mkdir()
    (tmp_path / "rundir").mkdir()
    (tmp_path / "launch" / "x.py").write_text('import os\np = os.path.join("d", "summary.json")\n'
                                              'q = f"instance-{3}.log"\nok = "summary"\n')
    (tmp_path / "rundir" / "layout.py").write_text('SUMMARY = "summary.json"\n')
    assert spelled(tmp_path) == ["launch/x.py:2: summary.json", "launch/x.py:3: instance-{}.log"]


def test_each_name_is_defined_once():
    values = [v for k, v in vars(layout).items() if k.isupper() and isinstance(v, str)]
    assert len(values) == len(set(values))
    assert layout.instance_log(2) == "instance-2.log" and layout.plan_of(0) == "plan-0.json"


def test_the_layout_stands_on_the_safe_file_module_alone():
    """wire/, host/, launch/, runtime/ and train/ all take their names from the layout: it imports none of them."""
    from tests.package.test_import_graph import imports_of

    assert {m.split(".")[1] for m in imports_of("podrun.rundir.layout") if "." in m} <= {"safefs", "errors",
                                                                                        "redaction"}
