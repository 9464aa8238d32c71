"""One row of a benchmark table: a subject's figure beside its peer's, their ratio, the unit and a note; a
benchmark's scratch folder."""
from __future__ import annotations

import functools
import statistics
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path


def _figure(value, digits: int):
    """A number, or the median of a list of runs, rounded; None (nothing measured) stays None."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        if not value:
            return None
        value = statistics.median(value)
    return round(float(value), digits)


def row(benchmark: str, subject: str, value, unit: str, note: str, peer: str | None = None, peer_value=None,
        *, digits: int = 3) -> dict:
    """The table row every benchmark writes; ``value`` and ``peer_value`` are numbers or lists of runs (their median).
    The ratio is value / peer_value, None when either is missing or the peer's is 0."""
    v, pv = _figure(value, digits), _figure(peer_value, digits)
    ratio = None if v is None or pv is None or pv == 0 else round(v / pv, 3)
    return {"benchmark": benchmark, "subject": subject, "value": v, "peer": peer, "peer_value": pv, "ratio": ratio,
            "unit": unit, "note": note}


def measured(runs: dict[str, list[dict]]) -> tuple[dict[str, list[dict]], str]:
    """Interleaved runs by mode: the ones that measured (no ``why``), and what the note adds for the others
    ("; not measured: MODE: WHY; ..."; "" when every run measured)."""
    whys = [f"{x['mode']}: {x['why']}" for xs in runs.values() for x in xs if "why" in x]
    return ({m: [x for x in xs if "why" not in x] for m, xs in runs.items()},
            "; not measured: " + "; ".join(whys) if whys else "")


def rows_for(benchmark: str, *, digits: int = 3):
    """row() with the benchmark named once: ``rows_for("hang")(subject, value, unit, note, peer, peer_value)``."""
    return functools.partial(row, benchmark, digits=digits)


@contextmanager
def scratch(benchmark: str):
    """A folder of this run's own for one benchmark's files (podrun-bench-NAME-*), removed when the block leaves."""
    with tempfile.TemporaryDirectory(prefix=f"podrun-bench-{benchmark}-") as d:
        yield Path(d)


def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def print_table(rows: list[dict]) -> None:
    cols = ["benchmark", "subject", "value", "peer", "peer_value", "ratio", "unit", "note"]
    cells = [[fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))


def run_alone(run, quick: bool | None = None) -> None:
    """`python -m bench.bench_NAME [--quick]`: one benchmark's table, as `python -m bench NAME` prints it (no JSON);
    quick: when given, instead of --quick on the command line."""
    print_table(run(quick="--quick" in sys.argv[1:] if quick is None else quick))
