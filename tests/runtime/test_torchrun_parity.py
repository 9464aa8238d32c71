"""torchrun parity of the env contract: one script under real `torchrun` and under `podrun launch`, same plan
(the local cluster's workers on this machine), every torch-relevant variable compared."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from podrun.wire.worker_env import TORCHRUN_NAMES, world_size
from tests.harness.podrun_proc import PODRUN
from tests.launch.helpers import run_dir
from tests.ports import free_port

pytestmark = [pytest.mark.torch, pytest.mark.timeout(240)]

DUMP = str(Path(__file__).with_name("env_dump.py"))

# Variables that legitimately differ, and why (values not compared)
DIFFER = {
    "TORCHELASTIC_RUN_ID": "torchrun's --rdzv-id ('none' for its static rendezvous); podrun's is the run id",
    "TORCHELASTIC_ERROR_FILE": "each launcher's own per-worker file: torchrun's in a temporary directory, "
                               "podrun's in the run directory",
    "TORCHELASTIC_SIGNALS_TO_HANDLE": "the signals each launcher's agent forwards: torchrun's --signals-to-handle "
                                      "(SIGQUIT too), podrun's agent's SIGTERM,SIGINT,SIGHUP,SIGUSR1",
}
# of those, the ones podrun need not set (none: a worker sees every name torchrun sets)
OPTIONAL_UNDER_PODRUN: frozenset[str] = frozenset()


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_NAMES and not k.startswith(("PODRUN_", "TORCH"))}
    env.pop("OMP_NUM_THREADS", None)
    return env


def _dumps(d: Path, n: int) -> list[dict[str, str]]:
    files = sorted(d.glob("*.json"), key=lambda p: int(p.stem))
    assert [int(p.stem) for p in files] == list(range(n)), files
    return [json.loads(p.read_text()) for p in files]


def test_env_under_podrun_matches_torchrun(tmp_path):
    from podrun.cli.options import resolve_plan

    plan = resolve_plan(None, environ={})[0]          # the local cluster: one CPU worker per core
    n = world_size(plan)
    base = _base_env()
    port = free_port(2)
    tr_dir, pr_dir = tmp_path / "torchrun-env", tmp_path / "podrun-env"   # no folder named podrun in the cwd
    tr_dir.mkdir()
    pr_dir.mkdir()
    tr = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(n),
                         "--master-addr", "127.0.0.1", "--master-port", str(port), DUMP],
                        env={**base, "ENV_DUMP_DIR": str(tr_dir)}, capture_output=True, text=True, timeout=180,
                        cwd=tmp_path)
    assert tr.returncode == 0, tr.stdout + tr.stderr
    pr = subprocess.run([*PODRUN, "launch", "--nproc-per-node", str(n), "--master-addr", "127.0.0.1", "--master-port",
                         str(port), "--runs-dir", str(tmp_path / "runs"), "--", sys.executable, DUMP],
                        env={**base, "ENV_DUMP_DIR": str(pr_dir)}, capture_output=True, text=True, timeout=180,
                        cwd=tmp_path)
    assert pr.returncode == 0, pr.stdout + pr.stderr
    rd = run_dir(tmp_path / "runs")
    tr_envs, pr_envs = _dumps(tr_dir, n), _dumps(pr_dir, n)

    # torch-relevant: what torchrun added to its workers' environment, and torchrun's names in the contract
    added = {k for e in tr_envs for k, v in e.items() if base.get(k) != v and k != "ENV_DUMP_DIR"}
    keys = added | set(TORCHRUN_NAMES)
    assert {"RANK", "ROLE_RANK", "GROUP_WORLD_SIZE", "TORCHELASTIC_ERROR_FILE"} <= added
    assert ("OMP_NUM_THREADS" in added) == (n > 1)      # torchrun sets it with more than one worker
    for rank, (t, p) in enumerate(zip(tr_envs, pr_envs)):
        for k in sorted(keys):
            assert k in t, f"rank {rank}: torchrun did not set {k}"
            if k in OPTIONAL_UNDER_PODRUN:
                continue
            assert k in p, f"rank {rank}: podrun does not set {k} (torchrun: {t[k]!r})"
            if k in DIFFER:
                continue
            if k == "OMP_NUM_THREADS" and len(os.sched_getaffinity(0)) != n:
                continue       # podrun shares the agent's cores (checked below); equal to torchrun's 1 when n == cores
            assert p[k] == t[k], f"rank {rank}: {k} torchrun={t[k]!r} podrun={p[k]!r}"
        # podrun: the cores this host's agent may use, shared by the host's workers
        assert p["OMP_NUM_THREADS"] == str(max(1, len(os.sched_getaffinity(0)) // n)), (rank, p["OMP_NUM_THREADS"])
        assert p["TORCHELASTIC_RUN_ID"] == rd.name
        assert p["TORCHELASTIC_ERROR_FILE"].startswith(str(rd) + os.sep)
    assert len({p["TORCHELASTIC_ERROR_FILE"] for p in pr_envs}) == n        # one file per worker
