"""The controller's steady-state cost: CPU per host per second of `podrun launch --transport ssh` while every worker
sleeps (heartbeats only), on namespace hosts with real sshd (tests.harness.NetnsHosts), with the heartbeat period
fixed at 0.5 s (the period every run had before it followed the host count) against the default, interleaved.
The controller's figure is its own process plus its ssh clients (both run on the controller's node)."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.rows import row



def _cpu(pid: int) -> tuple[float, float]:
    """(CPU seconds of ``pid`` itself, every thread, of its live descendants), from the scheduler's run time in
    nanoseconds (/proc/PID/task/TID/schedstat: the clock ticks of /proc/PID/stat are 10 ms, too coarse here)."""
    from podrun.proctl import proc_stats

    stats = {p: f for p, f in proc_stats()}
    kids: dict[int, list[int]] = {}
    for p, f in stats.items():
        kids.setdefault(int(f[1]), []).append(p)

    def own(p: int) -> float:
        total = 0
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/schedstat") as f:
                    total += int(f.read().split()[0])
        except OSError:
            pass
        return total / 1e9

    below, todo = 0.0, list(kids.get(pid, []))
    while todo:
        p = todo.pop()
        below += own(p)
        todo.extend(kids.get(p, []))
    return own(pid), below


def _wait_up(p: subprocess.Popen, n: int, cap: float) -> bool:
    """Read p's stdout until ``n`` workers said "up" (or ``cap`` seconds)."""
    fd, buf, deadline = p.stdout.fileno(), b"", time.monotonic() + cap
    while time.monotonic() < deadline and buf.count(b" up\n") < n:
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            chunk = os.read(fd, 65536)
            if not chunk:
                return False
            buf += chunk
    return buf.count(b" up\n") >= n


def steady(hosts, tmp: Path, extra: list[str], window: float) -> tuple[float, float, dict]:
    """One launch on every host, a worker per host sleeping: once every worker is up (and 2 s more), the
    controller's CPU over ``window`` seconds -> (ms per host per second: controller alone, with its ssh clients),
    and the run's heartbeat settings."""
    import json

    n = len(hosts.hosts)
    runs = tmp / f"runs-{time.monotonic_ns()}"
    argv = [sys.executable, "-m", "podrun", "launch", "--hosts", ",".join(hosts.hosts), "--devices-per-host", "1",
            "--transport", "ssh", "--ssh-config", hosts.ssh_config_path, "--ssh-client", "openssh",
            "--python", hosts.python, "--runs-dir", str(runs), "--hang-timeout", "off", *extra, "--",
            hosts.python, "-c", "import time; print('up', flush=True); time.sleep(3600)"]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True, cwd=tmp)
    try:
        if not _wait_up(p, n, 120):
            raise RuntimeError(f"not every worker of {n} hosts came up ({' '.join(extra) or 'default'})")
        time.sleep(2.0)
        a0, b0 = _cpu(p.pid)
        t0 = time.monotonic()
        time.sleep(window)
        a1, b1 = _cpu(p.pid)
        dt = time.monotonic() - t0
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    summary = json.loads(next(runs.glob("*/summary.json")).read_text())
    per = 1000.0 / n / dt
    return (a1 - a0) * per, ((a1 - a0) + (b1 - b0)) * per, summary["heartbeat"]


def run(quick: bool) -> list[dict]:
    from tests.harness import NetnsHosts

    sizes = [16] if quick else [16, 32, 64]
    rounds = 1 if quick else 2
    window = 5.0 if quick else 10.0
    rows = []
    for size in sizes:
        fixed_own, fixed_all, new_own, new_all = [], [], [], []
        with NetnsHosts(size) as hosts, tempfile.TemporaryDirectory() as tmp:
            for _ in range(rounds):       # interleaved: the load of the other helpers falls on both alike
                a, b, _ = steady(hosts, Path(tmp), ["--heartbeat", "0.5"], window)
                fixed_own.append(a)
                fixed_all.append(b)
                a, b, hb = steady(hosts, Path(tmp), [], window)
                new_own.append(a)
                new_all.append(b)
        setting = f"{hb['period_s']:g} s x {hb['misses']:g} = {hb['bound_s']:g} s"
        note = (f"{size} hosts x 1 sleeping worker, {window:g} s at steady state, median of {rounds}; "
                f"default heartbeat at {size} hosts: {setting}; 0.1 ms/host/s = 1 % of a core per 100 hosts")
        rows.append(row("steady", f"controller process, {size} hosts, default heartbeat", new_own, "ms CPU/host/s",
                        note, "--heartbeat 0.5", fixed_own, digits=4))
        rows.append(row("steady", f"controller + its ssh clients, {size} hosts, default heartbeat", new_all,
                        "ms CPU/host/s", note, "--heartbeat 0.5", fixed_all, digits=4))
    return rows
