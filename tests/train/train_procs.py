"""Helpers for the training tests: start N real worker processes with torchrun-style env on loopback."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from tests.ports import free_port

WORKER = Path(__file__).with_name("worker.py")


LAUNCHER_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def outside_env(**extra: str) -> dict:
    """This test's environment without what any launcher sets (podrun, Slurm, MPI, PopDist, torchrun)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PODRUN_", "SLURM_", "OMPI_", "PMI_", "POPDIST_")) and k not in LAUNCHER_NAMES}
    env.update(extra)
    return env


def train_opts(run_dir, **kw) -> dict:
    """A worker's options: the digits data, small and deterministic, logged under run_dir; kw add or override."""
    return {"data": "digits", "image_size": 8, "num_classes": 10, "global_batch": 32, "lr": 0.1,
            "deterministic": True, "eval_every": 0, "console": False, "run_dir": str(run_dir), **kw}


# the elastic and snapshot resumes' optimizer: SGD with momentum, a cosine schedule, seed 11
SGD_COSINE = {"lr": 0.2, "optimizer": "sgd", "momentum": 0.9, "weight_decay": 1e-4, "schedule": "cosine",
              "warmup_epochs": 0.05, "seed": 11}


SAVER = """
import sys, torch
from podrun.train import checkpoint as ckpt
for step in range(1, 100000):
    ckpt.save({"step": step, "w": torch.full((4_000_000,), float(step))}, sys.argv[1], step, keep=2)
"""


def kill_a_save_in_flight(d: Path, timeout: float) -> None:
    """Start a process that saves checkpoints into d without end; kill -9 it while a save is in flight (its
    temporary file in d) after at least one save completed."""
    import signal

    from podrun.train import checkpoint as ckpt

    p = subprocess.Popen([sys.executable, "-c", SAVER, str(d)])
    try:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if ckpt.list_checkpoints(d) and any(f.name.startswith(".ckpt-") for f in d.iterdir()):
                break
            time.sleep(0.002)
        else:
            raise AssertionError("never saw a save in flight")
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.wait()


@contextmanager
def lock_holder(run_dir: Path, run: str):
    """A process that holds run_dir's writer lock for run (as a train.py would) until the with block leaves."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom podrun.rundir.lock import DirLock\n"
                               "DirLock(sys.argv[1], sys.argv[2], 'run directory').acquire()\n"
                               "print('held', flush=True)\ntime.sleep(600)", str(run_dir), run],
                              env=outside_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()
        holder.wait()


def worker_env(rank: int, world: int, port: int, extra: dict | None = None) -> dict:
    env = outside_env()
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
               GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    env.update(extra or {})
    return env


def start_workers(world: int, opts: dict | list, *, script: Path | None = None, argv: list[str] | None = None,
                  extra_env: dict | None = None, cwd: str | None = None) -> list[subprocess.Popen]:
    port = free_port()
    cmd = [sys.executable, str(script or WORKER)] + (argv if argv is not None else [json.dumps(opts)])
    return [subprocess.Popen(cmd, env=worker_env(r, world, port, extra_env), cwd=cwd,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for r in range(world)]


def wait_all(procs: list[subprocess.Popen], timeout: float = 120) -> list[str]:
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for i, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"worker {i} exited {p.returncode}:\n{out[-3000:]}"
    return outs


def run_workers(world: int, opts: dict, timeout: float = 120, **kw) -> list[str]:
    return wait_all(start_workers(world, opts, **kw), timeout)



def wait_for_step(run_dir: Path, step: int, procs: list[subprocess.Popen], timeout: float = 120) -> int:
    """The highest step in ``run_dir``'s metrics once it is >= ``step``; fails if a worker ends first."""
    from podrun.rundir.metrics import read_metrics

    deadline = time.time() + timeout
    while time.time() < deadline:
        if (run_dir / "metrics.jsonl").exists():
            done = [r["step"] for r in read_metrics(run_dir) if r.get("kind") == "step"]
            if done and max(done) >= step:
                return max(done)
        for p in procs:
            assert p.poll() is None, f"a worker ended before step {step}:\n{p.communicate()[0][-2000:]}"
        time.sleep(0.01)
    raise AssertionError(f"step {step} not reached in {timeout}s")


def kill_mid_run(world: int, opts: dict, run_dir: Path, step: int) -> int:
    """Start ``world`` workers on ``opts``, kill -9 every one once ``run_dir`` logged ``step``, and check they
    died of it before the run ended; returns the highest step logged."""
    import signal

    from podrun.rundir.metrics import read_metrics

    victims = start_workers(world, opts)
    seen = wait_for_step(run_dir, step, victims)
    for p in victims:
        p.send_signal(signal.SIGKILL)
    for p in victims:
        p.wait()
    assert all(p.returncode == -signal.SIGKILL for p in victims)
    assert not any(r.get("event") == "end" for r in read_metrics(run_dir)), "the run finished before it was killed"
    return seen


def assert_same_final_weights(run_dir: Path, ref_dir: Path, rtol: float, atol: float) -> tuple[dict, dict]:
    """The newest checkpoints of two runs hold the same model weights; returns both states."""
    import torch

    from podrun.train import checkpoint as ckpt

    a = torch.load(ckpt.list_checkpoints(run_dir / "checkpoints")[-1], weights_only=False)
    b = torch.load(ckpt.list_checkpoints(ref_dir / "checkpoints")[-1], weights_only=False)
    for k in b["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=rtol, atol=atol)
    return a, b
