"""Helpers for the training tests: start N real worker processes with torchrun-style env on loopback."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.ports import free_port

WORKER = Path(__file__).with_name("worker.py")


def worker_env(rank: int, world: int, port: int, extra: dict | None = None) -> dict:
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(("PODRUN_", "SLURM_", "OMPI_", "PMI_")) or k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
            env.pop(k)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
               GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    env.update(extra or {})
    return env


def start_workers(world: int, opts: dict, *, script: Path | None = None, argv: list[str] | None = None,
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

