"""Every Python process podrun starts for itself goes through podrun.pystart: a reading of podrun/'s and bench/'s source
(its AST) finds no other command line that starts an interpreter with an option of its own (``[python, "-c", ...]``,
``[sys.executable, "-m", ...]``, ``-I``...), no exec or subprocess of ``sys.executable`` itself, and no boot built
outside it; in bench/, whose peers (torchrun, ``python -c pass``, the podrun CLI as a user runs it) are the user's
own starts, no helper module of podrun's (``-m podrun.X``) started another way."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOME = "podrun/pystart.py"
STARTS = {("subprocess", "Popen"), ("subprocess", "run"), ("subprocess", "call"), ("subprocess", "check_call"),
          ("subprocess", "check_output"), ("os", "execv"), ("os", "execve"), ("os", "execvp"), ("os", "execvpe"),
          ("os", "execl"), ("os", "execlp"), ("os", "spawnv"), ("os", "posix_spawn"), ("os", "posix_spawnp"),
          ("asyncio", "create_subprocess_exec")}
BOOTS = {"lean_boot", "module_code", "safe_code"}     # pystart's boots: only its builders pair them with flags


def _interpreter(node: ast.AST) -> bool:
    """``sys.executable``, or a value named like an interpreter (``python``, ``req.python``, ``python_``)."""
    if isinstance(node, ast.Attribute) and node.attr == "executable" and isinstance(node.value, ast.Name) \
            and node.value.id == "sys":
        return True
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.rstrip("_").lower().endswith("python")


def _const(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def bypasses_in(source: str, name: str, *, bench: bool = False) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(source)):
        where = f"{name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, (ast.List, ast.Tuple)) and len(node.elts) >= 2 and _interpreter(node.elts[0]):
            words = [_const(e) for e in node.elts[1:]]
            if bench:
                if any(a == "-m" and (b or "").startswith("podrun.") for a, b in zip(words, words[1:])):
                    out.append(f"{where}: a podrun helper module started without podrun.pystart")
            elif (words[0] or "").startswith("-"):
                out.append(f"{where}: [python, {words[0]!r}, ...] built outside podrun.pystart")
        elif isinstance(node, ast.Call):
            f = node.func
            base = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else None
            called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if called in BOOTS:
                out.append(f"{where}: {called}() outside podrun.pystart's builders")
            elif (base, called) in STARTS and not bench and node.args and (
                    _interpreter(node.args[0]) or isinstance(node.args[0], (ast.List, ast.Tuple)) and node.args[0].elts
                    and _interpreter(node.args[0].elts[0])):
                out.append(f"{where}: {base}.{called} of an interpreter outside podrun.pystart")
    return out


def bypasses(root: Path = ROOT) -> list[str]:
    out = []
    for tree, bench in (("podrun", False), ("bench", True)):
        for path in sorted((root / tree).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel != HOME:
                out += bypasses_in(path.read_text(encoding="utf-8"), rel, bench=bench)
    return out


def test_podrun_starts_python_only_through_pystart():
    assert bypasses() == []


def test_the_check_finds_every_way_around(tmp_path):
    """The check can fail: each form is named with its line; the user's own starts and bench's peers are not."""
    src = "\n".join([
        "subprocess.Popen([sys.executable, '-c', code])", "argv = [python, '-m', 'podrun.host.zygote']",
        "os.execv(sys.executable, argv)", "subprocess.run((self.python, '-I', '-S', '-c', c))",
        "x = lean_boot(root, v)", "cmd = [req.python, '-c', probe]", "subprocess.run([sys.executable, *rest])",
    ])
    found = bypasses_in(src, "m.py")
    assert sorted({int(f.split(":")[1]) for f in found}) == list(range(1, 8)), found
    assert bypasses_in("[python, script, *args]\n[python, recipe]\nsubprocess.run(['ssh', host, line])\n"
                       "[self.name, *self.args]\n", "m.py") == []
    assert bypasses_in("[sys.executable, '-m', 'podrun.host.agent']\n", "b.py", bench=True) != []
    assert bypasses_in("[sys.executable, '-m', 'podrun', 'launch']\n[sys.executable, '-I', '-S', '-c', 'pass']\n"
                       "subprocess.run([sys.executable, '-c', 'pass'])\n", "b.py", bench=True) == []
    for tree in ("podrun", "bench"):
        (tmp_path / tree).mkdir()
    (tmp_path / "podrun" / "pystart.py").write_text("subprocess.Popen([sys.executable, '-c', c])\n")
    (tmp_path / "podrun" / "other.py").write_text("x = 1\nsubprocess.Popen([sys.executable, '-c', c])\n")
    (tmp_path / "bench" / "b.py").write_text("p = subprocess.Popen([sys.executable, '-m', 'podrun.host.agent'])\n")
    assert sorted(bypasses(tmp_path)) == [
        "bench/b.py:1: a podrun helper module started without podrun.pystart",
        "podrun/other.py:2: [python, '-c', ...] built outside podrun.pystart",
        "podrun/other.py:2: subprocess.Popen of an interpreter outside podrun.pystart"]


def test_a_helper_imports_podrun_from_its_own_place_never_from_its_working_directory(tmp_path):
    """In a directory that holds a planted ``podrun/__init__.py``, each of pystart's command lines (code, module,
    the lean agent's boot with podrun elsewhere: its safe fallback, a job script's `podrun launch` line) imports the
    real podrun, while ``python -c`` and ``python -m podrun`` themselves (what the helpers and the job scripts were
    started with) import the planted one; the helper's arguments stay its own."""
    import json
    import os
    import shlex
    import subprocess
    import sys

    from podrun import pystart

    (tmp_path / "podrun").mkdir()
    (tmp_path / "podrun" / "__init__.py").write_text("raise SystemExit('planted podrun ran')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    show = "import sys, podrun; print(podrun.__file__, sys.argv[1:])"
    raw = subprocess.run([sys.executable, "-c", show, "a"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert "planted podrun ran" in raw.stderr
    for argv in (pystart.safe(sys.executable, "a", code=show), pystart.safe(sys.executable, "a", code=show, root=None),
                 pystart.safe(sys.executable, "a", code="\n" + show)):
        cp = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True)
        assert cp.stdout.split() == [str(ROOT / "podrun" / "__init__.py"), "['a']"], (argv, cp.stderr)
    cp = subprocess.run(pystart.safe(sys.executable, "--version", module="podrun"), cwd=tmp_path, env=env,
                        capture_output=True, text=True)
    assert cp.returncode == 0 and "planted" not in cp.stderr, cp.stderr
    # a helper's command line is known as one (what start() and a joining copy take): one line before one-line code
    lean, code = pystart.isolated(sys.executable, []), pystart.safe(sys.executable, code="pass")
    assert pystart.is_helper(lean) and pystart.is_helper(code) and "\n" not in code[2]
    assert pystart.is_helper(pystart.target(sys.executable, "module", "".join(["pod", "run"])))   # not `is`
    assert not pystart.is_helper(pystart.target(sys.executable, "module", "podrunner"))
    assert not any(pystart.is_helper(a) for a in ([sys.executable, "-c", "pass"], [sys.executable, "-I", "-S", "-c"],
                                                  [sys.executable, "x.py", code[2]], [sys.executable, "-m", code[2]],
                                                  [sys.executable, "-I", "-S", "-c", "pass"], lean[:4], code[:2]))
    # the lean boot where podrun is not at its path becomes the safe agent: its --help, not the planted podrun
    cp = subprocess.run(pystart.isolated(sys.executable, ["--help"], root=str(tmp_path / "nothing")), cwd=tmp_path,
                        env=env, capture_output=True, text=True)
    assert cp.returncode == 0 and "--plan" in cp.stdout, cp.stderr
    # a job script's `podrun launch`, run in the job's working directory (a shared one): the exec line podrun script
    # wrote, as the job's shell runs it, plans the job with the real podrun; the same line as `PYTHON -m podrun launch`
    # (what job scripts ran before) runs the planted one
    cp = subprocess.run([sys.executable, "-m", "podrun", "script", "--scheduler", "slurm", "--nodes", "2", "--json",
                         "--", "true"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert cp.returncode == 0, cp.stderr
    line = next(x for x in json.loads(cp.stdout)["script"].splitlines() if x.startswith("exec "))
    job = {**env, "SLURM_JOB_NODELIST": "c[01-02]", "SLURM_JOB_ID": "7"}
    marker = tmp_path / "planted-ran"
    (tmp_path / "podrun" / "__init__.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nraise SystemExit('planted podrun ran')\n")
    dry = line[len("exec "):].replace(" launch ", f" launch --dry-run --json --runs-dir {tmp_path / 'runs'} ", 1)
    cp = subprocess.run(["bash", "-c", dry], cwd=tmp_path, env=job, capture_output=True, text=True)
    assert cp.returncode == 0 and not marker.exists(), (dry, cp.stderr)
    assert [i["host"] for i in json.loads(cp.stdout)["instances"]] == ["c01", "c02"], cp.stdout
    old = dry.replace(shlex.join(pystart.safe(sys.executable, "launch", module="podrun", root=None)),
                      f"{shlex.quote(sys.executable)} -m podrun launch", 1)
    assert old != dry
    cp = subprocess.run(["bash", "-c", old], cwd=tmp_path, env=job, capture_output=True, text=True)
    assert marker.exists() and "planted podrun ran" in cp.stderr, (old, cp.stderr)
