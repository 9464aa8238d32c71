"""The metrics endpoint's cost beside the controller's own: `podrun launch --metrics-port 0` with 64 light ranks
(bench/scripts/metrics_ranks.py: a report every 0.3 s with busy time and step split, as the recipes' runner sends),
scraped every second (15 times Prometheus's default) by a client here; over a window of steady reports, the CPU
the scrapes took (the endpoint's own podrun_metrics_cpu_seconds_total, the thread time of each scrape) against the
controller process's CPU (every thread's scheduler run time, /proc/PID/task/TID/schedstat), in the same run."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from bench.rows import row

HERE = Path(__file__).resolve().parent
RANKS_SCRIPT = str(HERE / "scripts" / "metrics_ranks.py")
COUNTER = re.compile(r"^podrun_metrics_cpu_seconds_total\{[^}]*\} (\S+)$", re.M)


def _cpu(pid: int) -> float:
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass
    return total / 1e9


def one(ranks: int, window: float, interval: float, tmp: Path) -> tuple[float, float, int]:
    """(scrape CPU ms/s, controller CPU ms/s, series in a scrape) over ``window`` s of steady reports."""
    runs = tmp / f"runs-{time.monotonic_ns()}"
    steps = int((window + 60) / 0.3)
    argv = [sys.executable, "-m", "podrun", "launch", "--devices-per-host", str(ranks), "--runs-dir", str(runs),
            "--run-id", "m", "--hang-timeout", "off", "--metrics-port", "0", "--", sys.executable, RANKS_SCRIPT,
            str(steps), "0.3"]
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp, env=env,
                         start_new_session=True)
    got: list[tuple[float, str]] = []
    stop = threading.Event()
    try:
        target = runs / "m" / "prometheus-targets.json"
        deadline = time.monotonic() + 120
        while not target.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        import json

        url = f"http://{json.loads(target.read_text())[0]['targets'][0]}/metrics"

        def scrape() -> None:
            while not stop.wait(interval):
                try:
                    with urllib.request.urlopen(url, timeout=10) as r:
                        got.append((time.monotonic(), r.read().decode()))
                except OSError:
                    pass
        threading.Thread(target=scrape, daemon=True).start()
        deadline = time.monotonic() + 180          # every rank reporting: a split series for each
        while time.monotonic() < deadline and not (got and got[-1][1].count("podrun_rank_busy_seconds{") >= ranks):
            time.sleep(0.5)
        if not got or got[-1][1].count("podrun_rank_busy_seconds{") < ranks:
            raise RuntimeError(f"not every one of {ranks} ranks reported")
        time.sleep(2.0)
        n0, c0, t0 = len(got), _cpu(p.pid), time.monotonic()
        time.sleep(window)
        c1, t1 = _cpu(p.pid), time.monotonic()
        while len(got) < n0 + 2:
            time.sleep(0.1)
        first, last = got[n0 - 1], got[-1]
        s0, s1 = (float(COUNTER.search(x[1]).group(1)) for x in (first, last))
        series = sum(1 for line in last[1].splitlines() if line.startswith("podrun_"))
        # the counter in a scrape holds the scrapes before it: from the scrape before the window to the last one
        return (s1 - s0) * 1000 / (last[0] - first[0]), (c1 - c0) * 1000 / (t1 - t0), series
    finally:
        stop.set()
        p.terminate()
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait()


def run(quick: bool) -> list[dict]:
    ranks = 16 if quick else 64
    rounds = 1 if quick else 3
    window = 5.0 if quick else 15.0
    scrape, ctrl, series = [], [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds):
            a, b, series = one(ranks, window, 1.0, Path(tmp))
            scrape.append(a)
            ctrl.append(b)
    note = (f"{ranks} light ranks on this machine (one host: the rank series are the large set), a report each "
            f"0.3 s each with busy time and split; scraped every 1 s, {series} series a scrape; {window:g} s window, "
            f"median of {rounds}; at Prometheus's default 15 s the share is 1/15 of this")
    return [row("metrics", f"scrapes of the metrics endpoint, {ranks} ranks, every 1 s", scrape, "ms CPU/s", note,
                "the controller process, the same run", ctrl, digits=4)]
