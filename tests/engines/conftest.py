"""Helpers for engine/transport tests: run the real `podrun` CLI, collect RESULT lines."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.harness.podrun_proc import run_podrun, with_env

HERE = Path(__file__).resolve().parent
ALLREDUCE = str(HERE / "allreduce_check.py")


def podrun(args, *, cwd, env=None, timeout=120) -> subprocess.CompletedProcess:
    return run_podrun(*args, cwd=cwd, env=with_env(**(env or {})), timeout=timeout, stdin=subprocess.DEVNULL)


def results(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        i = line.find("RESULT ")
        if i >= 0:
            out.append(json.loads(line[i + len("RESULT "):]))
    return out


def assert_allreduce_job_done(run_dir: Path, res: list[dict], transport: str,
                              status: subprocess.CompletedProcess) -> None:
    """A submitted 3-rank ALLREDUCE job finished well: every rank summed 6 in a world of 3 inside the submit's
    run, summary.json says exit 0 over ``transport``, and ``status`` (`podrun status RUN --json`) says COMPLETED."""
    assert all(r["sum"] == 6.0 and r["world"] == 3 for r in res), res
    assert all(r["env"]["PODRUN_RUN_DIR"] == str(run_dir) for r in res)   # the job's run is the submit's run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["exit_code"] == 0 and summary["transport"] == transport
    assert status.returncode == 0, status.stderr
    info = json.loads(status.stdout)
    assert info["state"] == "COMPLETED" and info["exit_code"] == 0 and info["summary"]["status"] == "ok"


@pytest.fixture
def allreduce_script() -> str:
    return ALLREDUCE


def assert_forked_per_host(res: list[dict], hosts: list[str], per_host: int) -> None:
    """Import once per host: ``per_host`` ALLREDUCE ranks on each of ``hosts``, every one forked by its host's zygote
    (PODRUN_WARM names it, and it is the rank's parent), one zygote a host."""
    assert sorted(r["host"] for r in res) == sorted(h for h in hosts for _ in range(per_host)), res
    for r in res:
        assert r["env"]["PODRUN_WARM"] == str(r["parent"]), r
    zygotes = {h: {r["parent"] for r in res if r["host"] == h} for h in hosts}
    assert all(len(z) == 1 for z in zygotes.values()) and len(set.union(*zygotes.values())) == len(hosts), zygotes
