"""No function in podrun/ takes more than MAX_PARAMETERS parameters (self and cls not counted, keyword-only
counted, *args and **kwargs one each): a longer list is an options object waiting to be written."""
from __future__ import annotations

import ast
from pathlib import Path

MAX_PARAMETERS = 12
PACKAGE = Path(__file__).resolve().parents[2] / "podrun"


def parameter_count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    if names[:1] in (["self"], ["cls"]):
        names = names[1:]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def too_long(root: Path = PACKAGE, limit: int = MAX_PARAMETERS) -> list[str]:
    """file:line:function (count) for every function of ``root`` over ``limit`` parameters."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and parameter_count(node) > limit:
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}:{node.name} ({parameter_count(node)})")
    return found


def test_no_function_takes_more_than_twelve_parameters():
    found = too_long()
    assert not found, f"over {MAX_PARAMETERS} parameters (take an options object):\n" + "\n".join(found)


def test_the_count_is_the_rule():
    fn = ast.parse("def f(self, a, b=1, *rest, c, d=2, **kw): pass").body[0]
    assert parameter_count(fn) == 6                   # a, b, *rest, c, d, **kw
    fn = ast.parse("def g(cls_, /, x): pass").body[0]
    assert parameter_count(fn) == 2
