"""The README's set-up command timed from a fresh clone: `git clone`, a new venv, the install
(`pip install torch==2.13.0 -e '.[train]'`, torch from this machine's local file, the rest from the package
registries) and the main run (`podrun launch recipes/resnet18_cifar10 --data digits`), each with its CPU time.
--quick: the clone and a 2-step run with this interpreter (no venv, no install)."""
from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from bench.rows import rows_for, run_alone, scratch

ROOT = Path(__file__).resolve().parents[1]
INSTALL = ["-m", "pip", "install", "-q", "torch==2.13.0", "-e", ".[train]"]   # the README's, run by the venv's pip
RUN = ["launch", "recipes/resnet18_cifar10", "--data", "digits"]             # the README's main run


def _timed(argv: list[str], cwd: Path, env: dict | None = None) -> tuple[float, float]:
    """Run ``argv`` to its end (output kept for a failure); (wall seconds, CPU seconds of it and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}: {(r.stderr or r.stdout)[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _accuracy(runs: Path) -> str:
    """The run's last validation accuracy, as `podrun report` reads it."""
    from podrun.rundir.report import newest_run, read_run, summarize

    summary = summarize(read_run(newest_run(runs)).records)
    acc = summary.get("final_val_accuracy")
    return f"validation accuracy {acc:.3f}" if acc is not None else "no validation"


def run(quick: bool) -> list[dict]:
    row = rows_for("first_hour", digits=1)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    load = f"load average {os.getloadavg()[0]:.1f} at the start, {os.cpu_count()} cores"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    rows = []
    with scratch("first_hour") as d:
        clone = d / "podrun"
        wall, cpu = _timed(["git", "clone", "-q", "--no-checkout", str(ROOT), str(clone)], d)
        wall2, cpu2 = _timed(["git", "checkout", "-q", head], clone)
        rows.append(row(f"git clone (commit {head})", wall + wall2, "s", f"CPU {cpu + cpu2:.1f} s; {load}"))
        if quick:
            python = sys.executable
            env["PYTHONPATH"] = str(clone)
            argv = [python, "-m", "podrun", *RUN, "--steps", "2"]
        else:
            wall, cpu = _timed([sys.executable, "-m", "venv", str(d / "venv")], d)
            rows.append(row("python -m venv (fresh, no site packages)", wall, "s", f"CPU {cpu:.1f} s"))
            python = str(d / "venv" / "bin" / "python")
            wall, cpu = _timed([python, *INSTALL], clone, env)
            rows.append(row("install: pip install torch==2.13.0 -e '.[train]'", wall, "s",
                            f"CPU {cpu:.1f} s; torch from the local file, the rest from the registries"))
            argv = [str(d / "venv" / "bin" / "podrun"), *RUN]
        wall, cpu = _timed(argv, clone, env)
        what = " ".join(["podrun", *argv[argv.index("launch"):]])
        rows.append(row(f"run: {what}", wall, "s", f"CPU {cpu:.1f} s (controller, agent, workers); "
                                                     f"{_accuracy(clone / 'runs')}"))
    return rows


if __name__ == "__main__":
    run_alone(run)
