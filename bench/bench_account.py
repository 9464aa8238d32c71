"""The run's account (summary.json's ``account``) against the wall measured outside podrun, on the 5 kinds of run
the issue names: clean, a worker crash with a restart, a cut host with elastic recovery (real OpenSSH hosts in
network namespaces, tests.harness.NetnsHosts), a hang ended, Ctrl-C. Each row: the account's wall (the sum of its
categories) beside the seconds from podrun's start to its exit as this process saw them, and the categories.

    python -m bench account            # each kind once
    python -m bench --quick account    # the same (one run per kind is the measurement)
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.rows import row, scratch

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "resnet18_cifar10"
DIGITS = ["--data", "digits", "--image-size", "8", "--checkpoint-every", "10", "--quiet"]
PODRUN = [sys.executable, "-m", "podrun"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _step(run_dir: Path) -> int:
    """The newest step in the run's metrics.jsonl (0: none yet)."""
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    steps = [r.get("step", 0) for r in map(_json, lines) if r.get("kind") == "step"]
    return max(steps, default=0)


def _json(line: str) -> dict:
    try:
        r = json.loads(line)
    except ValueError:
        return {}
    return r if isinstance(r, dict) else {}


def _workers(word: str) -> list[int]:
    """pids of the train.py workers whose command line holds ``word`` (not their agents)."""
    found = []
    for d in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0") if d.isdigit() else []
        except OSError:
            continue
        if len(argv) > 1 and argv[1].endswith(b"train.py") and word.encode() in argv:
            found.append(int(d))
    return sorted(found)


def _launch(argv: list[str], run_dir: Path, act=None, timeout: float = 600) -> float:
    """Run podrun ARGV to its end, doing ``act(proc)`` once it trains; the wall seconds from its start to its exit."""
    t0 = time.time()
    p = subprocess.Popen([*PODRUN, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         stdin=subprocess.DEVNULL, env=ENV)
    try:
        if act is not None:
            act(p)
        p.wait(timeout=timeout)
        return time.time() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def _until(pred, timeout: float = 300) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise RuntimeError("the run did not get there in time")
        time.sleep(0.1)


def _digits(d: Path, name: str, *extra: str) -> tuple[list[str], Path]:
    return (["launch", "--global-batch", "32", "--runs-dir", str(d), "--run-id", name, *extra, str(RECIPE),
             *DIGITS, "--seed", str(4100 + len(name))], d / name)


def _kinds(d: Path):
    """(kind, run dir, wall) of each kind of run, one after another."""
    argv, rd = _digits(d, "clean", "--master-port", "0")
    yield "clean", rd, _launch([*argv, "--steps", "40"], rd)

    argv, rd = _digits(d, "crash", "--max-restarts", "1")
    seed = argv[-1]

    def crash(p):
        _until(lambda: _step(rd) >= 12)
        os.kill(_workers(seed)[-1], signal.SIGKILL)
    yield "worker crash, --max-restarts 1", rd, _launch([*argv, "--steps", "40"], rd, crash)

    argv, rd = _digits(d, "ctrlc")

    def interrupt(p):
        _until(lambda: _step(rd) >= 12)
        p.send_signal(signal.SIGINT)
    yield "Ctrl-C at step 12", rd, _launch([*argv, "--steps", "400"], rd, interrupt)

    rd = d / "hang"
    yield "hang ended (--hang-timeout 4)", rd, _launch(
        ["launch", "--devices-per-host", "2", "--runs-dir", str(d), "--run-id", "hang", "--hang-timeout", "4", "--",
         sys.executable, str(ROOT / "tests" / "launch" / "scripts" / "hang.py"), "--mode", "sleep"], rd)

    from tests.harness import NetnsHosts

    with NetnsHosts(4) as hosts:
        rd = d / "cut"

        def cut(p):
            _until(lambda: _step(rd) >= 8)
            hosts.isolate("h3")
        yield "cut host, --elastic 2", rd, _launch(
            ["launch", "--hosts", ",".join(hosts.hosts), "--devices-per-host", "1", "--transport", "ssh",
             "--ssh-config", hosts.ssh_config_path, "--python", hosts.python, "--runs-dir", str(d), "--run-id", "cut",
             "--master-port", "29970", "--keepalive", "2", "--global-batch", "12", "--elastic", "2",
             "--max-restarts", "2", "--", sys.executable, str(ROOT / "tests" / "elastic" / "train_groupnorm.py"),
             "--steps", "30", "--sleep", "0.15"], rd, cut)


def run(quick: bool) -> list[dict]:  # noqa: ARG001 - one run of each kind either way
    out = []
    load = os.getloadavg()[0]
    with scratch("account") as d:
        for kind, rd, wall in _kinds(d):
            acc = json.loads((rd / "summary.json").read_text())["account"]
            secs = {k: v for k, v in acc["seconds"].items() if v > 0}
            note = (f"goodput {acc['goodput']:.1%}; " + ", ".join(f"{k} {v:.2f}" for k, v in secs.items())
                    + f"; sum {sum(acc['seconds'].values()):.2f}; {len(acc['attempts'])} attempt(s); "
                    f"load {load:.1f} at the start")
            out.append(row(f"{kind}: the account's wall vs podrun's wall", "account (sum of its categories)",
                           acc["wall_s"], "s", note, "start to exit, measured outside", wall, digits=3))
    return out


if __name__ == "__main__":
    from bench.rows import run_alone

    run_alone(run)
