"""`podrun launch --engine ... / --mpi-args` through the real CLI (poprun is a FAKE: see fake_poprun.py)."""
from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from tests.engines.conftest import podrun

FAKE = Path(__file__).resolve().parent / "fake_poprun.py"
WORKER = ("import os, sys; print('ENV', os.environ['POPDIST_INSTANCE_INDEX'], os.environ['PODRUN_INSTANCE_INDEX'], "
          "os.environ['RANK'], os.environ['POPDIST_NUM_TOTAL_REPLICAS'], flush=True); "
          "sys.exit(int(os.environ.get('FAIL_ON', '-1') == os.environ['PODRUN_INSTANCE_INDEX']) * 6)")


@pytest.fixture
def fake_poprun_env(tmp_path):
    d = tmp_path / "bin"
    d.mkdir()
    exe = d / "poprun"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{d}{os.pathsep}{os.environ['PATH']}", "FAKE_POPRUN_RECORD": str(tmp_path / "argv.json"),
            "IPUOF_VIPU_API_HOST": "vipu.test", "IPUOF_VIPU_API_PARTITION_ID": "p-test"}   # as a POD job has them


def test_fake_poprun_cli_dry_run_is_the_poprun_line(tmp_path, fake_poprun_env):
    r = podrun(["launch", "--pod", "256", "--dry-run", "--vipu-partition", "p256", "--json",
                "recipes/efficientnet_b4"], cwd=os.getcwd(), env=fake_poprun_env)
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    (cmd,) = rec["commands"]
    assert rec["transport"] == "poprun" and cmd["host"] == "poprun"
    for flag in ("--num-instances=16", "--num-replicas=128", "--ipus-per-replica=2", "--num-ilds=4",
                 "--vipu-partition=p256", "--numa-aware=1"):
        assert flag in cmd["command"], flag
    assert not os.path.exists("runs/" + rec["run_id"])          # a dry run writes nothing


def test_fake_poprun_cli_runs_agents_with_popdist_env(tmp_path, fake_poprun_env):
    args = ["launch", "--cluster", "ipu-pod16", "--hosts", "a,b", "--runs-dir", str(tmp_path / "runs"),
            "--", sys.executable, "-c", WORKER]
    r = podrun(args, cwd=tmp_path, env=fake_poprun_env)
    assert r.returncode == 0, r.stderr
    envs = sorted(l.split("ENV ", 1)[1] for l in r.stdout.splitlines() if "ENV " in l)
    assert envs == ["0 0 0 32", "1 1 1 32"]      # popdist index == podrun index == RANK; 2 x 16 IPUs, 1 per replica
    recorded = json.load(open(fake_poprun_env["FAKE_POPRUN_RECORD"]))
    assert "--num-instances=2" in recorded["argv"] and "--host=a,b" in recorded["argv"]
    assert {"--vipu-server-host=vipu.test", "--vipu-partition=p-test"} <= set(recorded["argv"])   # from the env


def test_fake_poprun_cli_fail_fast_exit_code_and_root_cause(tmp_path, fake_poprun_env):
    env = dict(fake_poprun_env, FAIL_ON="1")
    r = podrun(["launch", "--cluster", "ipu-pod16", "--hosts", "a,b", "--runs-dir", str(tmp_path / "runs"),
                "--", sys.executable, "-c", WORKER], cwd=tmp_path, env=env)
    assert r.returncode == 6, r.stderr
    assert "root cause: instance 1" in r.stderr
    (summary,) = (tmp_path / "runs").glob("*/summary.json")          # poprun runs under the Supervisor
    rec = json.loads(summary.read_text())
    assert rec["transport"] == "poprun" and rec["exit_code"] == 6 and rec["root_cause"]["instance"] == 1


def test_mpirun_dry_run_passes_mpi_args_through(tmp_path):
    r = podrun(["launch", "--transport", "mpirun", "--hosts", "a,b", "--mpi-args", "--mca btl tcp,self --tag-output",
                "--dry-run", "--json", "--", "true"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (cmd,) = json.loads(r.stdout)["commands"]
    assert "--mca btl tcp,self --tag-output" in cmd["command"]


def test_poprun_with_transport_is_refused(tmp_path):
    r = podrun(["launch", "--engine", "poprun", "--transport", "ssh", "--pod", "16", "--dry-run", "--", "true"],
               cwd=tmp_path)
    assert r.returncode == 2 and "drop --transport" in r.stderr and "Traceback" not in r.stderr


def test_fake_poprun_cli_without_vipu_partition_is_refused_before_it_starts(tmp_path, fake_poprun_env):
    """No V-IPU server or partition from an option, the POD job's env or the spec: a real launch is refused (exit 2,
    one paragraph, nothing started: the FAKE poprun records nothing); --dry-run shows the line and says so; the
    option wins over the environment."""
    env = {k: v for k, v in fake_poprun_env.items() if not k.startswith("IPUOF_")}
    env.update(IPUOF_VIPU_API_HOST="", IPUOF_VIPU_API_PARTITION_ID="")
    args = ["launch", "--cluster", "ipu-pod16", "--hosts", "a", "--runs-dir", str(tmp_path / "runs"), "--", "true"]
    r = podrun(args, cwd=tmp_path, env=env)
    assert r.returncode == 2 and "--vipu-partition" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not os.path.exists(env["FAKE_POPRUN_RECORD"])
    r = podrun([*args[:-2], "--dry-run", "--", "true"], cwd=tmp_path, env=env)
    assert r.returncode == 0 and "this line fails" in r.stdout + r.stderr, r.stdout + r.stderr
    r = podrun([*args[:-2], "--dry-run", "--json", "--vipu-partition", "mine", "--", "true"], cwd=tmp_path,
               env=fake_poprun_env)
    (cmd,) = json.loads(r.stdout)["commands"]
    assert "--vipu-partition=mine" in cmd["command"] and "--vipu-server-host=vipu.test" in cmd["command"]
