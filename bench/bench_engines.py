"""Engines: `podrun submit --wait` vs plain `sbatch --wait` on a real 3-node Slurm, and `podrun launch
--transport mpirun` vs plain `mpirun` across 3 real SSH hosts; interleaved, medians over repeats."""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench.rows import row


def _time(argv, *, env=None, cwd=None, timeout=30.0) -> float | None:
    """Seconds argv took, or None when it hung past ``timeout`` (its process group is then killed)."""
    import signal

    t0 = time.perf_counter()
    p = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        _, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return None
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:6])} ... exited {p.returncode}: {err[-500:]}")
    return time.perf_counter() - t0


def _interleaved(subjects: dict, repeats: int, **kw) -> tuple[dict[str, float], dict[str, int]]:
    """Medians of the runs that ended, and how many runs of each subject hung."""
    times = {k: [] for k in subjects}
    hung = {k: 0 for k in subjects}
    for argv in subjects.values():          # warm up once
        _time(argv, **kw)
    for _ in range(repeats):
        for name, argv in subjects.items():
            t = _time(argv, **kw)
            if t is None:
                hung[name] += 1
            else:
                times[name].append(t)
    return {k: statistics.median(v) if v else float("nan") for k, v in times.items()}, hung


def _row(bench, subject, value, peer, peer_value, note):
    return row(bench, subject, value, "s (median)", note, peer, peer_value)


def bench_slurm(repeats: int) -> list[dict]:
    from tests.harness.slurm import SlurmCluster

    with SlurmCluster(nodes=3) as sl, tempfile.TemporaryDirectory() as tmp:
        podrun = [sys.executable, "-m", "podrun", "submit", "--scheduler", "slurm", "--nodes", "3", "--wait",
                  "--poll", "0.2", "--runs-dir", os.path.join(tmp, "runs"), "--", "true"]
        plain = ["sbatch", "--wait", "-N3", "--ntasks-per-node=1", f"--output={tmp}/%j.out", "--wrap", "srun true"]
        med, hung = _interleaved({"podrun": podrun, "sbatch": plain}, repeats, env=sl.env, cwd=tmp)
    return [_row("slurm submit to job end, 3 nodes", "podrun submit --wait -- true (srun, agents, supervisor)",
                 med["podrun"], "sbatch --wait --wrap 'srun true'", med["sbatch"],
                 f"{repeats} interleaved repeats; real slurmctld + 3 slurmd in namespaces; hung > 30 s: "
                 f"podrun {hung['podrun']}, sbatch {hung['sbatch']}")]


def bench_mpirun(repeats: int) -> list[dict]:
    from podrun.launch.transports.mpirun import MpiOptions, mpirun_command
    from tests.harness import NetnsHosts

    with NetnsHosts(3) as hosts, tempfile.TemporaryDirectory() as tmp:
        cfg = str(hosts.ssh_config_path)
        podrun = [sys.executable, "-m", "podrun", "launch", "--transport", "mpirun", "--hosts",
                  ",".join(hosts.hosts), "--devices-per-host", "1", "--ssh-config", cfg, "--runs-dir",
                  os.path.join(tmp, "runs"), "--", "true"]
        plain = mpirun_command(hosts.hosts, 1, ["true"], options=MpiOptions(ssh_config=cfg))
        nopre = podrun[:4] + ["--no-preflight"] + podrun[4:]
        med, hung = _interleaved({"podrun": podrun, "nopre": nopre, "mpirun": plain}, repeats, cwd=tmp, timeout=15.0)
    return [_row("mpirun launch to end, 3 hosts", "podrun launch --transport mpirun --no-preflight -- true",
                 med["nopre"], "mpirun --map-by ppr:1:node true", med["mpirun"],
                 f"{repeats} interleaved repeats; podrun's CLI and agent start included; hung at "
                 f"teardown > 15 s: podrun {hung['nopre']}/{repeats}, plain mpirun {hung['mpirun']}/{repeats}"),
            _row("mpirun launch to end, 3 hosts", "podrun launch --transport mpirun -- true (preflight, agents)",
                 med["podrun"], "mpirun --map-by ppr:1:node true", med["mpirun"],
                 f"{repeats} interleaved repeats; real sshd hosts in namespaces, Open MPI 5 (PyPI); medians of "
                 f"the runs that ended; hung at teardown > 15 s: podrun {hung['podrun']}/{repeats}, "
                 f"plain mpirun {hung['mpirun']}/{repeats}")]


def run(quick: bool) -> list[dict]:
    repeats = 3 if quick else 7
    return bench_slurm(repeats) + bench_mpirun(repeats)


if __name__ == "__main__":
    from bench.rows import run_alone

    run_alone(run)
