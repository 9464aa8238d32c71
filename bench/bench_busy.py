"""Slow ranks (issue 20): the cost of the busy clock (podrun.runtime.steps.StepClock: a post-accumulate-grad hook per parameter
that notes when the last gradient is ready; DDP's own all-reduce untouched) on the step time, against DDP with no
hook on the same loop, interleaved; and how much of the step the busy time covers."""
from __future__ import annotations

import os
import re
import socket
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "bench" / "scripts" / "busy_cost.py")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one(mode: str, steps: int) -> tuple[float, float]:
    """(median step ms, median busy ms) of a 2-rank run on loopback."""
    port = _port()
    procs = []
    for rank in range(2):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
               "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "PYTHONPATH": str(ROOT)}
        procs.append(subprocess.Popen([sys.executable, SCRIPT, mode, str(steps)], env=env, stdout=subprocess.PIPE,
                                      text=True))
    outs = [p.communicate(timeout=600)[0] for p in procs]
    m = re.search(r"STEP_MS ([0-9.]+) BUSY_MS ([0-9.a-z]+)", outs[0])
    if m is None or any(p.returncode for p in procs):
        raise RuntimeError(f"busy_cost.py failed: {outs}")
    return float(m[1]), float(m[2])


def run(quick: bool) -> list[dict]:
    repeats, steps = (1, 50) if quick else (5, 300)
    hooked, plain, busy = [], [], []
    for _ in range(repeats):
        h, b = one("hook", steps)
        p, _ = one("plain", steps)
        hooked.append(h)
        plain.append(p)
        busy.append(b)
    runs = "; ".join(f"{a:.2f}/{b:.2f}" for a, b in zip(hooked, plain))
    hm, pm = statistics.median(hooked), statistics.median(plain)
    return [
        {"benchmark": "busy", "subject": "DDP step, busy clock on", "value": round(hm, 3), "peer":
         "DDP's built-in all-reduce (no hook)", "peer_value": round(pm, 3), "ratio": round(hm / pm, 3), "unit": "ms",
         "note": f"2 ranks, gloo on loopback, 6 x Linear(768, 768), batch 32, {steps} steps; median step, median of "
                 f"{repeats} interleaved runs (hook/plain ms: {runs})"},
        {"benchmark": "busy", "subject": "busy time of the hooked step", "value": round(statistics.median(busy), 3),
         "peer": "its wall step time", "peer_value": round(hm, 3), "ratio": round(statistics.median(busy) / hm, 3),
         "unit": "ms", "note": "even ranks: the part of the step before the last bucket's all-reduce"},
    ]


if __name__ == "__main__":
    from bench.rows import run_alone

    run_alone(run)
