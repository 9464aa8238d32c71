"""Numbers for people on the console ("35.6 s", "2,346", "0.0123"); torch-free and rich-free, so the runner and the CLI share it."""
from __future__ import annotations


def human_seconds(x: float) -> str:
    """35.557 -> "35.6 s"; 130 -> "2 min 10 s"; 7500 -> "2 h 05 min"."""
    if x != x or x < 0:
        return "?"
    if x < 60:
        return f"{x:.1f} s" if x < 9.95 or x != int(x) else f"{x:.0f} s"
    if x < 3600:
        m, s = divmod(int(round(x)), 60)
        return f"{m} min {s} s" if s else f"{m} min"
    h, m = divmod(int(round(x / 60)), 60)
    return f"{h} h {m:02d} min"


def human_number(x: float) -> str:
    """2345.678 -> "2,346"; 12.345 -> "12.3"; 0.012345 -> "0.0123": three significant digits or whole."""
    if x != x:
        return "nan"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def human_value(key: str, value):
    """A record's field for a console line: seconds (a key ending in ``seconds`` or ``_s``) as ``human_seconds``,
    other floats as ``human_number``, anything else as it is."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if key.endswith("seconds") or key.endswith("_s"):
        return human_seconds(float(value))
    return human_number(value) if isinstance(value, float) else value
