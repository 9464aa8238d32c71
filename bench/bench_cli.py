"""CLI start: `podrun plan` vs `torchrun --help` vs `python -c pass`, interleaved, medians over repeats; with
PODRUN_BASELINE=DIR (a checkout of an earlier podrun) also this podrun vs that one, both as `python -m podrun`
with PYTHONPATH set to their own tree."""
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


def _time(argv: list[str], env: dict | None = None) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env)
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
    base = os.environ.get("PODRUN_BASELINE")
    if base:
        rows += _vs_baseline(base, repeats)
    return rows


def _vs_baseline(base: str, repeats: int) -> list[dict]:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = {"this podrun": here, f"baseline podrun ({base})": base}
    commands = {"plan --pod 256 efficientnet_b4": ["plan", "--pod", "256", "efficientnet_b4"], "--help": ["--help"],
                "launch --dry-run -- true": ["launch", "--dry-run", "--", "true"]}
    envs = {name: dict(os.environ, PYTHONPATH=tree) for name, tree in trees.items()}
    times = {(t, c): [] for t in trees for c in commands}
    for t in trees:
        for args in commands.values():
            _time([sys.executable, "-m", "podrun", *args], envs[t])
    for _ in range(repeats):
        for c, args in commands.items():
            for t in trees:
                times[(t, c)].append(_time([sys.executable, "-m", "podrun", *args], envs[t]))
    this, old = trees
    rows = []
    for c in commands:
        a, b = statistics.median(times[(this, c)]), statistics.median(times[(old, c)])
        rows.append({"benchmark": "cli_vs_baseline", "subject": f"{this}: podrun {c}", "value": round(a, 4),
                     "peer": f"{old}: podrun {c}", "peer_value": round(b, 4), "ratio": round(a / b, 3),
                     "unit": "s (median)", "note": f"{repeats} interleaved repeats, python -m podrun, PYTHONPATH per tree"})
    return rows
