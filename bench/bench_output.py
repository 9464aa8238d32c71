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
import tempfile
import threading
import time
from pathlib import Path

from bench.rows import row
from tests.faults.memory import OUTPUT, _slow_console, podrun_output, vm_hwm_mb
from tests.ports import free_port


def _torchrun() -> str:
    path = os.path.join(sysconfig.get_path("scripts"), "torchrun")
    return path if os.path.exists(path) else shutil.which("torchrun") or "torchrun"


def torchrun_output(tmp: Path, mb: int, mode: str, k: int) -> dict:
    go, done = tmp / f"tgo-{mode}-{k}", tmp / f"tdone-{mode}-{k}"
    t0 = time.perf_counter()
    p = subprocess.Popen([_torchrun(), "--standalone", "--nproc-per-node", "1", OUTPUT, str(mb), mode, str(go),
                          str(done)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    threading.Thread(target=_slow_console, args=(p.stdout.fileno(),), daemon=True).start()
    try:
        while not done.exists():
            if p.poll() is not None:
                raise AssertionError(f"torchrun ended with {p.returncode} before the output was written")
            time.sleep(0.02)
        r = {"wall_s": time.perf_counter() - t0, "torchrun_mb": vm_hwm_mb(p.pid)}
        go.touch()
        assert p.wait(timeout=60) == 0
        return r
    finally:
        go.touch()
        if p.poll() is None:
            p.kill()
            p.wait()


def bare_output(tmp: Path, mb: int, mode: str, k: int) -> float:
    """The worker alone, writing to the same console: the floor for the wall time."""
    go, done = tmp / f"bgo-{mode}-{k}", tmp / f"bdone-{mode}-{k}"
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, OUTPUT, str(mb), mode, str(go), str(done)], stdout=subprocess.PIPE)
    threading.Thread(target=_slow_console, args=(p.stdout.fileno(),), daemon=True).start()
    try:
        while not done.exists():
            if p.poll() is not None:
                raise AssertionError(f"the worker ended with {p.returncode} before the output was written")
            time.sleep(0.02)
        return time.perf_counter() - t0
    finally:
        go.touch()
        p.wait(timeout=60)


def _row(subject, value, unit, peer, peer_value, note):
    return row("worker output", subject, value, unit, note, peer, peer_value)


def run(quick: bool) -> list[dict]:
    mb = 20 if quick else 200
    repeats = 1 if quick else 3
    rows = []
    with tempfile.TemporaryDirectory(prefix="podrun-bench-output-") as d:
        tmp = Path(d)
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
            rows.append(_row(f"podrun wall, {what}", med(pr, "wall_s"), "s", "torchrun wall", med(tr, "wall_s"),
                             note))
            rows.append(_row(f"podrun wall, {what}", med(pr, "wall_s"), "s", "the worker alone",
                             statistics.median(br), note))
            rows.append(_row(f"podrun peak RSS, {what}", max(r["podrun_mb"] for r in pr), "MB",
                             "torchrun peak RSS", max(r["torchrun_mb"] for r in tr), note.replace("median", "max")))
            rows.append(_row(f"agent peak RSS, {what}", max(r["agent_mb"] for r in pr), "MB",
                             "torchrun peak RSS", max(r["torchrun_mb"] for r in tr), note.replace("median", "max")))
    return rows


if __name__ == "__main__":
    from bench.run import print_table

    print_table(run("--quick" in sys.argv))
