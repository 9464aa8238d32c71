"""CLI start: `podrun plan` vs `torchrun --help` vs `python -c pass`, interleaved, medians over repeats."""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time


def _script(name: str) -> str:
    """The console script itself, not a pyenv shim (a shim adds a bash start to every run)."""
    path = os.path.join(sysconfig.get_path("scripts"), name)
    return path if os.path.exists(path) else shutil.which(name) or name


def _time(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def run(quick: bool) -> list[dict]:
    repeats = 5 if quick else 21
    subjects = {
        "podrun plan": [_script("podrun"), "plan", "--pod", "256", "efficientnet_b4"],
        "podrun --help": [_script("podrun"), "--help"],
        "torchrun --help": [_script("torchrun"), "--help"],
        "python -c pass": [sys.executable, "-c", "pass"],
    }
    times: dict[str, list[float]] = {k: [] for k in subjects}
    for argv in subjects.values():        # warm the page cache once
        _time(argv)
    for _ in range(repeats):              # interleaved, so noise hits every subject alike
        for name, argv in subjects.items():
            times[name].append(_time(argv))
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = []
    for name in ("podrun plan", "podrun --help"):
        for peer in ("torchrun --help", "python -c pass"):
            rows.append({"benchmark": "cli start", "subject": name, "value": round(med[name], 4), "peer": peer,
                         "peer_value": round(med[peer], 4), "ratio": round(med[name] / med[peer], 3), "unit": "s (median)",
                         "note": f"{repeats} interleaved repeats"})
    return rows
