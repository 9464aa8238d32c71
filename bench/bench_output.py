"""Worker output: podrun's and its agent's peak RSS and the wall time for 200 MB of worker output (quick:
20 MB), as 1 KiB lines and as one line without a newline, against torchrun running the same worker.

The worker (tests/faults/scripts/output.py) writes the output, then waits, so each launcher's peak RSS
(VmHWM) is read while it is alive. The launcher's stdout is read at 50 MB/s, a terminal's pace
(tests/faults/memory.py). Wall time: from the launcher's start to the last line logged (podrun: in
instance-0.log; torchrun, which logs nothing and lets the worker write to the console itself: to the
worker having written it). The worker alone on the same console is the floor for the wall time. Repeats are interleaved
(podrun, torchrun, worker alone, podrun, ...)."""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from bench.rows import rows_for, scratch
from tests.faults.memory import OUTPUT, finish, on_slow_console, podrun_output, until_written, vm_hwm_mb
from tests.ports import free_port


def _torchrun() -> str:
    path = os.path.join(sysconfig.get_path("scripts"), "torchrun")
    return path if os.path.exists(path) else shutil.which("torchrun") or "torchrun"


def torchrun_output(tmp: Path, mb: int, mode: str, k: int) -> dict:
    go, done = tmp / f"tgo-{mode}-{k}", tmp / f"tdone-{mode}-{k}"
    t0 = time.perf_counter()
    with on_slow_console([_torchrun(), "--standalone", "--nproc-per-node", "1", OUTPUT, str(mb), mode, str(go),
                          str(done)], go, stderr=subprocess.DEVNULL) as p:
        until_written(p, done.exists, "torchrun")
        r = {"wall_s": time.perf_counter() - t0, "torchrun_mb": vm_hwm_mb(p.pid)}
        assert finish(p, go) == 0
        return r


def bare_output(tmp: Path, mb: int, mode: str, k: int) -> float:
    """The worker alone, writing to the same console: the floor for the wall time."""
    go, done = tmp / f"bgo-{mode}-{k}", tmp / f"bdone-{mode}-{k}"
    t0 = time.perf_counter()
    with on_slow_console([sys.executable, OUTPUT, str(mb), mode, str(go), str(done)], go) as p:
        until_written(p, done.exists, "the worker")
        wall = time.perf_counter() - t0
        finish(p, go)
        return wall


_row = rows_for("worker output")


def run(quick: bool) -> list[dict]:
    mb = 20 if quick else 200
    repeats = 1 if quick else 3
    rows = []
    with scratch("output") as tmp:
        for mode in ("lines", "oneline"):
            pr, tr, br = [], [], []
            for k in range(repeats):
                sub = tmp / f"{mode}-{k}"
                sub.mkdir()
                pr.append(podrun_output(sub, mb, mode, free_port(2)))
                tr.append(torchrun_output(sub, mb, mode, k))
                br.append(bare_output(sub, mb, mode, k))
            what = f"{mb} MB as {'1 KiB lines' if mode == 'lines' else 'one line, no newline'}"
            note = f"{what}; median of {repeats}"
            med = lambda rs, key: statistics.median(r[key] for r in rs)  # noqa: E731
            rows.append(_row(f"podrun wall, {what}", med(pr, "wall_s"), "s", note, "torchrun wall", med(tr, "wall_s")))
            rows.append(_row(f"podrun wall, {what}", med(pr, "wall_s"), "s", note, "the worker alone",
                             statistics.median(br)))
            peak = max(r["torchrun_mb"] for r in tr)
            rows.append(_row(f"podrun peak RSS, {what}", max(r["podrun_mb"] for r in pr), "MB",
                             note.replace("median", "max"), "torchrun peak RSS", peak))
            rows.append(_row(f"agent peak RSS, {what}", max(r["agent_mb"] for r in pr), "MB",
                             note.replace("median", "max"), "torchrun peak RSS", peak))
    return rows


if __name__ == "__main__":
    from bench.rows import run_alone

    run_alone(run)
