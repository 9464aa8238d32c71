"""Engine registry and the horovod engine (horovod itself is FAKE here: it does not build against torch 2.13)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from podrun.errors import LaunchError, PlanError
from podrun.launch.engines import ENGINES, engine_of
from podrun.launch.engines.horovod import horovod_available, require_horovod
from tests.engines.conftest import podrun


def local_plan(devices: int):
    from podrun.cli.options import resolve_plan

    return resolve_plan(None, hosts_opt="localhost", devices_per_host=devices, environ={})[0]


def test_engine_registry_names_and_unknown():
    assert list(ENGINES) == ["torch", "poprun", "horovod"]
    assert [engine_of(n).transport for n in ENGINES] == [None, "poprun", "mpirun"]
    with pytest.raises(PlanError, match="unknown engine 'deepspeed'") as e:
        engine_of("deepspeed")
    assert e.value.exit_code == 2


def test_horovod_detected_or_refused_clearly(tmp_path):
    """With horovod importable (checked by importing it in a fresh Python), --engine horovod is accepted;
    without it, a launch says so (exit 2) before anything starts instead of failing in a worker."""
    present = subprocess.run([sys.executable, "-c", "import horovod"], capture_output=True).returncode == 0
    assert horovod_available() == present
    if present:
        require_horovod()
        return
    with pytest.raises(LaunchError, match="horovod package is not importable") as e:
        engine_of("horovod").require()
    assert e.value.exit_code == 2
    assert "horovod" in (e.value.hint or "")
    r = podrun(["launch", "--engine", "horovod", "--hosts", "localhost", "--runs-dir", str(tmp_path / "runs"),
                "--", sys.executable, "-c", "pass"], cwd=tmp_path)
    assert r.returncode == 2 and "horovod package is not importable" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "runs").exists()                          # nothing started, nothing written


@pytest.fixture
def fake_horovod(tmp_path, monkeypatch):
    """A FAKE horovod package, importable here and in the podrun processes the test starts."""
    (tmp_path / "fake" / "horovod").mkdir(parents=True)
    (tmp_path / "fake" / "horovod" / "__init__.py").write_text("# FAKE horovod for the detection contract\n")
    monkeypatch.syspath_prepend(str(tmp_path / "fake"))
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path / "fake"), os.getcwd(), os.environ.get("PYTHONPATH", "")])}


def test_fake_horovod_detected_when_importable(fake_horovod):
    assert horovod_available()
    engine_of("horovod").require()


def test_horovod_dry_run_is_the_mpirun_transport_one_agent_per_rank(tmp_path):
    """A dry run checks nothing (horovod may be absent) and prints the mpirun transport's command."""
    r = podrun(["launch", "--engine", "horovod", "--hosts", "localhost", "--devices-per-host", "2", "--dry-run",
                "--json", "--", sys.executable, "-c", "pass"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    (cmd,) = rec["commands"]
    assert rec["transport"] == "mpirun" and cmd["host"] == "mpirun"
    assert "-np 2" in cmd["command"] and "ppr:2:node" in cmd["command"] and "--rank-from-env" in cmd["command"]


@pytest.mark.timeout(120)
def test_fake_horovod_runs_under_the_supervisor(tmp_path, fake_horovod):
    """--engine horovod runs real mpirun (horovod FAKE) under the Supervisor: one rank per worker, each with Open
    MPI's rank variables and the run's contract; summary.json with the root cause; --max-restarts restarts it."""
    # rank 1 fails only once rank 0 has said its line (the marker file): the run ends every rank at the first
    # failure, so a rank 1 that failed first would take rank 0 down before it printed
    said = tmp_path / "rank0-said"
    code = ("import os,sys,time; r = os.environ['OMPI_COMM_WORLD_RANK']; "
            "print('HVD', r, os.environ['RANK'], os.environ['PODRUN_RUN_ID'], os.environ['PODRUN_NUM_REPLICAS'], "
            f"os.getcwd(), flush=True); m = {str(said)!r}\n"
            "if r == '0': open(m, 'w').close(); time.sleep(30)\n"
            "else:\n"
            "    t = time.monotonic()\n"
            "    while not os.path.exists(m) and time.monotonic() - t < 30: time.sleep(0.02)\n"
            "    sys.exit(4)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = podrun(["launch", "--engine", "horovod", "--hosts", "localhost", "--devices-per-host", "2",
                "--master-port", str(port), "--max-restarts", "1", "--runs-dir", str(tmp_path / "runs"),
                "--run-id", "hvd1", "--", sys.executable, "-c", code], cwd=tmp_path, env=fake_horovod)
    assert r.returncode == 4, r.stderr
    lines = [line.split("HVD ", 1)[1].split() for line in r.stdout.splitlines() if "HVD " in line]
    assert {x[0] for x in lines} == {"0", "1"}, r.stdout
    assert all(x[0] == x[1] and x[2:] == ["hvd1", "2", str(tmp_path)] for x in lines)   # MPI rank == RANK
    summary = json.loads((tmp_path / "runs" / "hvd1" / "summary.json").read_text())
    assert summary["exit_code"] == 4 and summary["transport"] == "mpirun"
    assert [a["exit_code"] for a in summary["attempts"]] == [4, 4]                   # restarted once
    assert summary["root_cause"]["exit_code"] == 4 and "root cause" in r.stderr


def test_resolve_engine_defaults_and_poprun_options():
    from podrun.launch.engines import resolve_engine
    from podrun.launch.options import EngineOptions, PoprunOptions
    from podrun.specs import load_cluster

    assert resolve_engine(EngineOptions(), load_cluster("local"))[:2] == ("torch", None)
    name, transport, popts, _ = resolve_engine(EngineOptions(poprun=PoprunOptions(vipu_partition="p1", num_ilds=2)),
                                               load_cluster("ipu-pod64"))
    assert (name, transport, popts.vipu_partition, popts.num_ilds) == ("poprun", "poprun", "p1", 2)
    name, transport, _, mpi_args = resolve_engine(EngineOptions(engine="horovod", mpi_args="--tag-output -x A"))
    assert (name, transport, mpi_args) == ("horovod", "mpirun", ("--tag-output", "-x", "A"))


def test_engines_and_request_import_neither_click_nor_the_agent():
    """No click options in the engines package; the launch request computes worker envs without the agent."""
    code = ("import sys, tempfile\n"
            "import podrun.launch.engines, podrun.launch.engines.poprun, podrun.launch.engines.horovod\n"
            "from podrun.cli.options import resolve_plan\n"
            "from podrun.launch.run import build_request\n"
            "req = build_request(resolve_plan(None, hosts_opt='localhost', devices_per_host=2, environ={})[0], ['true'],"
            " transport='local', runs_dir=tempfile.mkdtemp())\n"
            "assert req.worker_envs(0)[1]['RANK'] == '1'\n"
            "bad = [m for m in ('podrun.host.agent', 'torch') if m in sys.modules]\n"
            "assert not bad, bad\n"
            "import podrun.launch.engines as e\n"
            "assert not hasattr(e, 'engine_options') and not hasattr(e, 'pop_engine_options')\n")
    import subprocess

    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
