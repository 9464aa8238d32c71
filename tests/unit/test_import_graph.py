"""The launch modules' imports (read from their source, function-level imports included) form no circle between
the agent and the store it hosts: both take the process controls from podrun.launch.proctl."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "podrun"


def imports_of(module: str, root: Path = PKG.parent) -> set[str]:
    """Every podrun module ``module`` imports anywhere in its source (``from a import b`` counts a and a.b)."""
    path = root / (module.replace(".", "/") + ".py")
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return {m for m in out if m.startswith("podrun")}


def test_agent_and_agent_store_import_no_circle():
    assert "podrun.launch.agent_store" in imports_of("podrun.launch.agent")
    assert "podrun.launch.agent" not in imports_of("podrun.launch.agent_store")
    assert "podrun.launch.agent" not in imports_of("podrun.launch.transports.local")


def test_the_check_sees_an_import_inside_a_function(tmp_path):
    """The check can fail: a function-level import is found."""
    (tmp_path / "podrun").mkdir()
    (tmp_path / "podrun" / "m.py").write_text("def f():\n    from podrun.launch.agent import x\n")
    assert "podrun.launch.agent" in imports_of("podrun.m", tmp_path)
