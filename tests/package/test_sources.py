"""Sources a stranger can follow: every figure's source names a public document, and no file in the project
points at a file the repository does not hold (a note kept outside it, such as a design or reference file)."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

from podrun.specs import project_root

ROOT = project_root()
TOP_FILES = ("README.md", "pyproject.toml", "Makefile")
TREES = ("podrun", "docs", "tests", "bench", "cluster_specs", "recipes", ".ci")
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".txt", ".cfg", ""}
MARKDOWN = re.compile(r"(?<![\w/.:-])([\w][\w./-]*\.md)\b")
# a file name in a source: a word with a document or data suffix
FILE_NAME = re.compile(r"\b[\w./-]+\.(?:md|txt|pdf|py|ya?ml|json|csv|ipynb)\b")


def project_files() -> list[Path]:
    files = [ROOT / name for name in TOP_FILES if (ROOT / name).is_file()]
    for tree in TREES:
        for p in sorted((ROOT / tree).rglob("*")):
            if p.is_file() and p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts:
                files.append(p)
    return files


def held(name: str, where: Path, basenames: set[str]) -> bool:
    """A name resolves to a file of the repository: from the root, from the naming file's folder, or, for a
    bare file name (docs link to each other as elastic.md), as a file of that name anywhere in it."""
    return (ROOT / name).is_file() or (where.parent / name).is_file() or ("/" not in name and name in basenames)


def test_every_markdown_file_the_project_names_is_in_the_repository():
    files = project_files()
    assert len(files) > 100, f"only {len(files)} project files found under {ROOT}: the walk is broken"
    basenames = {p.name for p in files}
    missing = []
    for path in files:
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if "://" in line:            # a URL names a page elsewhere, not a file of this repository
                line = re.sub(r"\S+://\S+", "", line)
            for name in MARKDOWN.findall(line):
                if not held(name, path, basenames):
                    missing.append(f"{path.relative_to(ROOT)}:{lineno}: {name}")
    assert not missing, "files named that the repository does not hold:\n" + "\n".join(missing)


def _sources(node):
    """Every `source` value and `sources` item of a loaded spec or recipe, at any depth."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "source" and isinstance(value, str):
                yield value
            elif key == "sources" and isinstance(value, list):
                yield from (v for v in value if isinstance(v, str))
            else:
                yield from _sources(value)
    elif isinstance(node, list):
        for value in node:
            yield from _sources(value)


def test_every_source_in_the_specs_and_recipes_names_a_public_document():
    texts = sorted((ROOT / "cluster_specs").glob("*.yaml")) + sorted((ROOT / "recipes").glob("*/recipe.yaml"))
    assert len(texts) >= 8, texts
    bad, count = [], 0
    for path in texts:
        for source in _sources(yaml.safe_load(path.read_text())):
            count += 1
            if not source.strip():
                bad.append(f"{path.relative_to(ROOT)}: an empty source")
            for name in FILE_NAME.findall(source):
                if not (ROOT / name).is_file():
                    bad.append(f"{path.relative_to(ROOT)}: source {source!r} names the file {name}")
    assert count > 30, f"only {count} sources found: the walk is broken"
    assert not bad, "sources a reader cannot follow:\n" + "\n".join(bad)


def test_the_checks_catch_a_note_outside_the_repository():
    """The two checks above fail on the kind of line they exist for (the name is built here, so that this
    file does not itself name a missing file)."""
    note = "OUTSIDE-NOTES" + ".md"
    assert MARKDOWN.findall(f"# 1 host ({note}: POD16 1 host)") == [note]
    assert not held(note, ROOT / "cluster_specs" / "ipu-pod16.yaml", {p.name for p in project_files()})
    assert held("elastic.md", ROOT / "README.md", {"elastic.md"})
    assert FILE_NAME.findall(f"{note}, ABCI (2 x EDR)") == [note]
    assert list(_sources({"a": {"source": "x"}, "sources": ["y", 3]})) == ["x", "y"]
