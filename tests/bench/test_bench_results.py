"""bench/RESULTS.md's tables against the JSON each names: every table sits under a "JSON:" line that names the
file a `python -m bench --keep NAME` run wrote (bench/results/), and every figure in it is that file's.

A table measured before the JSON was kept says so instead ("JSON: not kept (measured YYYY-MM-DD ...)"), and
only a date before KEPT_SINCE may say it: a figure measured since must name its JSON. Figures quoted in the
prose are not parsed; each repeats a table's cell or a JSON row's value.
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS_MD = ROOT / "bench" / "RESULTS.md"
KEPT_SINCE = "2026-11-25 09:23"  # from then on, `python -m bench --keep` commits the JSON behind a figure (UTC)
STANDARD = ["benchmark", "podrun", "value", "peer", "peer value", "ratio", "unit", "note"]
JSON_LINE = re.compile(r"^JSON: (?:\[(?P<link>[^\]]+)\]\([^)]*\)|(?P<path>bench/results/\S+\.json)|"
                       r"not kept \(measured (?P<date>\d{4}-\d{2}-\d{2}(?: \d{2}:\d{2})?)[^)]*\))(?:\s.*)?$")
NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?(?:e-?\d+)?(?![\w])")


@dataclass
class Table:
    line: int                                  # 1-based line of the header in RESULTS.md
    header: list[str]
    rows: list[tuple[int, list[str]]] = field(default_factory=list)
    source: str | None = None                  # the JSON path, "not kept", or None (no JSON line)
    kept_date: str | None = None


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def tables(text: str) -> list[Table]:
    """Every markdown table, with the JSON line that governs it (the last one above it in its section)."""
    out: list[Table] = []
    source = date = None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            source = date = None               # a new section: its tables name their own JSON
        m = JSON_LINE.match(line.strip())
        if m:
            source = m["link"] or m["path"] or "not kept"
            date = m["date"]
        elif line.startswith("|") and i + 1 < len(lines) and re.match(r"^\|[-| :]+\|$", lines[i + 1].strip()):
            t = Table(i + 1, cells(line), source=source, kept_date=date)
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                t.rows.append((i + 1, cells(lines[i])))
                i += 1
            out.append(t)
            continue
        elif line.startswith("JSON:"):
            raise AssertionError(f"RESULTS.md:{i + 1}: a JSON line this test cannot read: {line!r}")
        i += 1
    return out


def number(text: str) -> tuple[float, float] | None:
    """A table cell's number and half a unit of its last shown digit (the rounding it allows)."""
    t = text.replace(",", "")
    try:
        v = float(t)
    except ValueError:
        return None
    decimals = len(t.split(".")[1].split("e")[0]) if "." in t else 0
    return v, 0.5 * 10 ** -decimals * (10 ** int(t.split("e")[1]) if "e" in t else 1) + 1e-9


def same(cell: str, value) -> bool:
    """A table cell shows ``value`` (a JSON row's), rounded as shown; '-' for none."""
    if value is None:
        return cell in ("-", "")
    if isinstance(value, str):
        return cell == value.replace("|", "\\|")
    n = number(cell)
    return n is not None and abs(n[0] - value) <= n[1] + abs(value) * 1e-12


def json_numbers(obj) -> list[float]:
    if isinstance(obj, bool):
        return []
    if isinstance(obj, (int, float)):
        return [float(obj)]
    if isinstance(obj, str):
        return [float(x.replace(",", "")) for x in NUMBER.findall(obj)]
    if isinstance(obj, dict):
        return [n for v in obj.values() for n in json_numbers(v)]
    if isinstance(obj, list):
        return [n for v in obj for n in json_numbers(v)]
    return []


def check_table(t: Table) -> list[str]:
    """What in table ``t`` its JSON does not show (empty when every figure is the JSON's)."""
    if t.source is None:
        return [f"RESULTS.md:{t.line}: a table with no 'JSON:' line above it in its section"]
    if t.source == "not kept":
        if t.kept_date >= (KEPT_SINCE if len(t.kept_date) > 10 else KEPT_SINCE[:10]):
            return [f"RESULTS.md:{t.line}: measured {t.kept_date}, since JSON is kept: name the "
                    f"bench/results file (python -m bench --keep NAME)"]
        return []
    path = ROOT / t.source if t.source.startswith("bench/") else RESULTS_MD.parent / t.source
    if not path.is_file():
        return [f"RESULTS.md:{t.line}: names {t.source}, which is not in the repository"]
    record = json.loads(path.read_text())
    problems = []
    if t.header == STANDARD:
        for line, row in t.rows:
            keys = dict(zip(STANDARD, row))
            match = [r for r in record["rows"] if same(keys["benchmark"], r.get("benchmark"))
                     and same(keys["podrun"], r.get("subject")) and same(keys["peer"], r.get("peer"))
                     and same(keys["unit"], r.get("unit"))]
            if not match:
                problems.append(f"RESULTS.md:{line}: no row of {t.source} has benchmark, subject, peer and unit "
                                f"{[keys[k] for k in ('benchmark', 'podrun', 'peer', 'unit')]}")
                continue
            for col, key in (("value", "value"), ("peer value", "peer_value"), ("ratio", "ratio")):
                if not any(same(keys[col], r.get(key)) for r in match):
                    problems.append(f"RESULTS.md:{line}: {col} {keys[col]} is not {t.source}'s "
                                    f"{[r.get(key) for r in match]}")
    else:                                       # another layout: each number shown is one of the JSON's
        have = json_numbers(record)
        for line, row in t.rows:
            for cell in row:
                for tok in NUMBER.findall(cell):
                    n = number(tok)
                    if n is not None and not any(abs(n[0] - h) <= n[1] for h in have):
                        problems.append(f"RESULTS.md:{line}: {tok} is in no field of {t.source}")
    return problems


def test_every_table_names_its_json_and_shows_its_figures():
    found = tables(RESULTS_MD.read_text())
    assert len(found) >= 10, f"only {len(found)} tables found: the parser no longer reads RESULTS.md"
    problems = [p for t in found for p in check_table(t)]
    assert not problems, "\n".join(problems)
    kept = [t for t in found if t.source not in (None, "not kept")]
    assert kept, "no table names a JSON file"


# -- the checker itself, on small documents -----------------------------------------------------------------

HEADER = "| " + " | ".join(STANDARD) + " |\n|" + "---|" * len(STANDARD) + "\n"


@pytest.fixture
def record(tmp_path, monkeypatch):
    path = tmp_path / "bench" / "results" / "x-20261125-1000.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"rows": [{"benchmark": "b", "subject": "podrun s", "value": 1.23456,
                                          "peer": "p", "peer_value": 2468.0, "ratio": 0.5002, "unit": "s",
                                          "note": "n"}]}))
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    return "bench/results/x-20261125-1000.json"


@pytest.mark.parametrize("row,ok", [
    ("| b | podrun s | 1.235 | p | 2,468 | 0.500 | s | n |", True),
    ("| b | podrun s | 1.236 | p | 2,468 | 0.500 | s | n |", False),      # a figure copied wrong
    ("| b | podrun s | 1.235 | p | 2,469 | 0.500 | s | n |", False),
    ("| b | podrun t | 1.235 | p | 2,468 | 0.500 | s | n |", False),      # a row the run did not make
])
def test_a_figure_that_is_not_its_json_is_found(record, row, ok):
    t, = tables(f"## x\n\nJSON: {record}\n\n" + HEADER + row + "\n")
    assert (check_table(t) == []) == ok, check_table(t)


def test_a_table_without_json_or_kept_since_the_json_is_refused(record):
    assert check_table(tables("## x\n\n" + HEADER + "| b | s | 1 | - | - | - | s | n |\n")[0])
    assert check_table(tables("## x\nJSON: not kept (measured 2026-11-25)\n" + HEADER + "| b | s | 1 | - | - | - | s | n |\n")[0])
    assert check_table(tables("## x\nJSON: not kept (measured 2026-11-25 10:00 UTC)\n" + HEADER + "| b | s | 1 | - | - | - | s | n |\n")[0])
    assert not check_table(tables("## x\nJSON: not kept (measured 2026-11-25 02:00 UTC)\n" + HEADER + "| b | s | 1 | - | - | - | s | n |\n")[0])
    assert not check_table(tables("## x\nJSON: not kept (measured 2026-11-21)\n" + HEADER + "| b | s | 1 | - | - | - | s | n |\n")[0])
    assert check_table(tables("## x\nJSON: bench/results/missing.json\n" + HEADER + "| b | s | 1 | - | - | - | s | n |\n")[0])
