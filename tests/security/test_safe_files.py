"""Every file or directory podrun creates or writes goes through podrun.safefs: a reading of podrun/'s source (its AST)
finds no other way to make or write one (open() for writing, Path.write_*, Path.mkdir, os.open for writing,
os.mkdir/makedirs, shutil's copies, tempfile's makers, os.replace/rename, a figure or tensor saved to a path)."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "podrun"
HOME = "safefs.py"
WRITE_FLAGS = {"O_CREAT", "O_WRONLY", "O_RDWR", "O_APPEND", "O_TRUNC"}
BANNED_CALLS = {  # module attribute -> why
    ("os", "mkdir"): "os.mkdir", ("os", "makedirs"): "os.makedirs", ("os", "replace"): "os.replace",
    ("os", "rename"): "os.rename", ("os", "symlink"): "os.symlink", ("os", "link"): "os.link",
    ("os", "mkfifo"): "os.mkfifo", ("shutil", "copy"): "shutil.copy", ("shutil", "copy2"): "shutil.copy2",
    ("shutil", "copyfile"): "shutil.copyfile", ("shutil", "copytree"): "shutil.copytree",
    ("shutil", "move"): "shutil.move", ("tempfile", "mktemp"): "tempfile.mktemp",
    ("tempfile", "mkstemp"): "tempfile.mkstemp", ("tempfile", "mkdtemp"): "tempfile.mkdtemp",
    ("tempfile", "NamedTemporaryFile"): "tempfile.NamedTemporaryFile",
    ("tempfile", "TemporaryDirectory"): "tempfile.TemporaryDirectory", ("tempfile", "TemporaryFile"):
    "tempfile.TemporaryFile",
}
BANNED_METHODS = {"write_text", "write_bytes", "mkdir", "touch", "symlink_to", "hardlink_to", "rename", "replace"}


def _mode_writes(call: ast.Call, pos: int) -> bool:
    if any(k.arg == "opener" for k in call.keywords):
        return True           # an opener chooses its own flags
    mode = call.args[pos] if len(call.args) > pos else next((k.value for k in call.keywords if k.arg == "mode"), None)
    if mode is None:
        return False
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return bool(set(mode.value) & set("wax+"))
    return True               # a mode computed at run time: cannot be shown to read only


def _literal_mode_writes(call: ast.Call) -> bool:
    """Path.open's mode, where it is written out (a method named open with another first argument is not Path's)."""
    mode = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "mode"), None)
    return isinstance(mode, ast.Constant) and isinstance(mode.value, str) and bool(set(mode.value) & set("wax+"))


def _flag_names(node: ast.AST) -> set[str]:
    return {n.attr if isinstance(n, ast.Attribute) else n.id for n in ast.walk(node)
            if isinstance(n, (ast.Attribute, ast.Name))}


def bypasses_in(source: str, name: str) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        where = f"{name}:{node.lineno}"
        if isinstance(f, ast.Name) and f.id == "open" and _mode_writes(node, 1):
            out.append(f"{where}: open() for writing")
        elif isinstance(f, ast.Attribute):
            base = f.value.id if isinstance(f.value, ast.Name) else None
            if base == "os" and f.attr == "open" and len(node.args) > 1 and _flag_names(node.args[1]) & WRITE_FLAGS:
                out.append(f"{where}: os.open for writing")
            elif (base, f.attr) in BANNED_CALLS:
                out.append(f"{where}: {BANNED_CALLS[base, f.attr]}")
            elif base not in ("os", "shutil", "tempfile", "dataclasses") and f.attr in BANNED_METHODS and (
                    f.attr not in ("replace", "rename") or (len(node.args) == 1 and not node.keywords)):
                out.append(f"{where}: .{f.attr}()")      # Path's replace/rename take one argument; str's two
            elif base not in ("os", "io") and f.attr == "open" and _literal_mode_writes(node) \
                    and not any(k.arg == "fileobj" for k in node.keywords):
                out.append(f"{where}: .open() for writing")     # tarfile.open(fileobj=F): writes into F, opened elsewhere
            elif f.attr == "savefig" and not any(k.arg == "format" for k in node.keywords):
                out.append(f"{where}: savefig to a path (give it safefs.replacing's file, with format=)")
            elif (base, f.attr) in (("torch", "save"), ("np", "save"), ("numpy", "save")) and len(node.args) > 1 \
                    and isinstance(node.args[1], (ast.Constant, ast.JoinedStr, ast.BinOp, ast.Call)):
                out.append(f"{where}: {base}.save to a path")
    return out


def bypasses(root: Path = PKG) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel != HOME:
            out += bypasses_in(path.read_text(encoding="utf-8"), rel)
    return out


def test_podrun_makes_and_writes_files_only_through_safefs():
    assert bypasses() == []


def test_the_check_finds_every_way_around(tmp_path):
    """The check can fail: each banned form is named with its line."""
    src = "\n".join([
        "open(p, 'w')", "open(p, 'ab')", "open(p, mode='r+')", "open(p, 'r', opener=o)", "open(p, m)",
        "os.open(p, os.O_WRONLY | os.O_CREAT, 0o600)", "os.open(p, O_RDWR)", "Path(p).write_text('x')",
        "p.write_bytes(b'')", "p.mkdir(exist_ok=True)", "os.mkdir(p)", "os.makedirs(p, exist_ok=True)",
        "shutil.copy(a, b)", "shutil.copyfile(a, b)", "tempfile.mktemp()", "tempfile.mkdtemp()", "p.open('w')",
        "os.replace(a, b)", "p.touch()", "fig.savefig(path, dpi=90)", "torch.save(s, d / 'x.pt')",
        "tarfile.open(name=path, mode='w')",
    ])
    found = bypasses_in(src, "m.py")
    assert [f.split(":")[1] for f in found] == [str(i) for i in range(1, 23)], found
    assert bypasses_in("open(p)\nopen(p, 'rb')\nos.open(p, os.O_RDONLY)\np.read_text()\nos.fdopen(fd, 'w')\n"
                       "fig.savefig(f, format='png')\ntorch.save(s, f)\n's'.replace('a', 'b')\n"
                       "tarfile.open(fileobj=f, mode='w')\n", "m.py") == []
    (tmp_path / "safefs.py").write_text("open(p, 'w')\n")
    (tmp_path / "other.py").write_text("x = 1\nos.makedirs(p)\n")
    assert bypasses(tmp_path) == ["other.py:2: os.makedirs"]
