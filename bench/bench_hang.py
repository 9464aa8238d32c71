"""Hangs (issue 20): the time from a rank's stall to the merged stacks on podrun's console, against torchrun
on the same script (which says nothing until gloo's collective timeout, 30 min by default: it is cut off at
CAP_S here); and the cost of the watch (progress reports, the faulthandler hook) on the step time, podrun
against torchrun running the same gloo loop, interleaved."""
from __future__ import annotations

import os
import re
import select
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.rows import rows_for, scratch

ROOT = Path(__file__).resolve().parents[1]
HANG = str(ROOT / "tests" / "launch" / "scripts" / "hang.py")
STEP = str(ROOT / "bench" / "scripts" / "step_time.py")
WINDOW = 5.0
CAP_S = 60.0


def _torchrun() -> list[str]:
    """torchrun under this interpreter (the one whose podrun the script imports)."""
    return [sys.executable, "-m", "torch.distributed.run"]


def _lines_until(p: subprocess.Popen, patterns: list[str], cap: float) -> dict[str, float]:
    """Read p's merged output; the time each pattern first appears (perf_counter), until all or ``cap``."""
    fd = p.stdout.fileno()
    seen: dict[str, float] = {}
    buf = b""
    deadline = time.perf_counter() + cap
    while len(seen) < len(patterns) and time.perf_counter() < deadline:
        r, _, _ = select.select([fd], [], [], 0.05)
        if not r:
            if p.poll() is not None:
                break
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
        now = time.perf_counter()
        for pat in patterns:
            if pat not in seen and pat.encode() in buf:
                seen[pat] = now
    return seen


def stall_to_stacks(tmp: Path, launcher: str) -> float | None:
    """Seconds from the stall (rank 1 printed step 4 and sleeps; every rank waits from then on) to the merged
    stacks on the console; None when they did not come within CAP_S."""
    if launcher == "podrun":
        argv = [sys.executable, "-m", "podrun", "launch", "--devices-per-host", "2", "--runs-dir", str(tmp / "runs"),
                "--hang-timeout", str(WINDOW), "--", sys.executable, HANG, "--mode", "sleep"]
    else:
        argv = [*_torchrun(), "--standalone", "--nproc-per-node", "2", HANG, "--mode", "sleep"]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp, start_new_session=True)
    try:
        seen = _lines_until(p, ["step 4 rank 1", "odd ranks first"], 120 + CAP_S)
    finally:
        p.terminate()                     # torchrun ends its workers (in sessions of their own) on SIGTERM
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
    if "step 4 rank 1" not in seen or "odd ranks first" not in seen:
        return None
    return seen["odd ranks first"] - seen["step 4 rank 1"]


def step_ms(tmp: Path, launcher: str, steps: int) -> float:
    """The median step time (ms) of STEP under ``launcher``: "podrun" (reports each step, --hang-timeout 30),
    "podrun-unwatched" (no reports, --hang-timeout off) or "torchrun"."""
    if launcher.startswith("podrun"):
        watched = launcher == "podrun"
        argv = [sys.executable, "-m", "podrun", "launch", "--devices-per-host", "2", "--runs-dir", str(tmp / "runs"),
                "--hang-timeout", "30" if watched else "off", "--", sys.executable, STEP, str(steps), "4096",
                "1" if watched else "0"]
    else:
        argv = [*_torchrun(), "--standalone", "--nproc-per-node", "2", STEP, str(steps), "4096"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=tmp)
    m = re.search(r"STEP_MS ([0-9.]+)", out.stdout)
    if not m:
        raise RuntimeError(f"{launcher}: no STEP_MS line: {out.stderr[-2000:]}")
    return float(m.group(1))


_row = rows_for("hang")


def run(quick: bool) -> list[dict]:
    repeats = 1 if quick else 3
    steps = 200 if quick else 1000
    with scratch("hang") as tmp:
        for sub in [f"p{k}" for k in range(repeats)] + ["t"]:
            (tmp / sub).mkdir()
        pod = [stall_to_stacks(tmp / f"p{k}", "podrun") for k in range(repeats)]
        tr = stall_to_stacks(tmp / "t", "torchrun")
        ok = [x for x in pod if x is not None]
        stall = _row(f"stall to merged stacks, --hang-timeout {WINDOW:g}", statistics.median(ok) if ok else None, "s",
                     f"2 ranks, rank 1 sleeps at step 5; median of {repeats}; torchrun: "
                     + ("none within " if tr is None else "") + f"{CAP_S:g} s (it waits for gloo's timeout)",
                     "torchrun", tr)
        pm, um, tm = [], [], []
        for k in range(repeats):
            (tmp / f"s{k}").mkdir()
            pm.append(step_ms(tmp / f"s{k}", "podrun", steps))
            um.append(step_ms(tmp / f"s{k}", "podrun-unwatched", steps))
            tm.append(step_ms(tmp / f"s{k}", "torchrun", steps))
        runs = "; ".join(f"{a:.2f}/{b:.2f}/{c:.2f}" for a, b, c in zip(pm, um, tm))
        what = (f"2 ranks, {steps} steps of 4 matmuls 256x256 + all_reduce 4096 floats; median step, median of "
                f"{repeats} interleaved runs (watched/unwatched/torchrun ms: {runs})")
    return [stall, _row("step time, watched (a report each step)", statistics.median(pm), "ms", what,
                        "podrun unwatched (no report, --hang-timeout off)", statistics.median(um)),
            _row("step time, watched (a report each step)", statistics.median(pm), "ms", what, "torchrun",
                 statistics.median(tm))]


if __name__ == "__main__":
    from bench.rows import run_alone

    run_alone(run)
