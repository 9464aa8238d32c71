"""Engine registry and the horovod engine (horovod itself is FAKE here: it does not build against torch 2.13)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from podrun.errors import LaunchError, PlanError
from podrun.launch.engines import check_engine, engine_names, run_outer_command
from podrun.launch.engines.horovod import horovod_available, horovod_command, require_horovod


def local_plan(devices: int):
    from podrun.cli.options import resolve_plan

    return resolve_plan(None, hosts_opt="localhost", devices_per_host=devices, environ={})[0]


def test_engine_registry_names_and_unknown():
    assert engine_names() == ["torch", "poprun", "horovod"]
    with pytest.raises(PlanError, match="unknown engine 'deepspeed'") as e:
        check_engine("deepspeed")
    assert e.value.exit_code == 2


def test_horovod_detected_or_refused_clearly():
    """With horovod importable (checked by importing it in a fresh Python), --engine horovod is accepted
    and builds its mpirun command; without it, it says so (exit 2) instead of failing in a worker."""
    present = subprocess.run([sys.executable, "-c", "import horovod"], capture_output=True).returncode == 0
    assert horovod_available() == present
    if present:
        require_horovod()
        cmd = horovod_command(local_plan(2), [sys.executable, "-c", "pass"])
        assert cmd[cmd.index("-np") + 1] == "2"
        return
    with pytest.raises(LaunchError, match="horovod package is not importable") as e:
        require_horovod()
    assert e.value.exit_code == 2
    assert "horovod" in (e.value.hint or "")
    with pytest.raises(LaunchError, match="horovod package is not importable"):
        horovod_command(local_plan(2), [sys.executable, "-c", "pass"])


def test_fake_horovod_detected_when_importable(tmp_path, monkeypatch):
    (tmp_path / "horovod").mkdir()
    (tmp_path / "horovod" / "__init__.py").write_text("# FAKE horovod for the detection contract\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert horovod_available()


@pytest.mark.timeout(60)
def test_fake_horovod_command_runs_one_rank_per_worker_under_real_mpirun(tmp_path):
    """horovod's launch path is real mpirun with one rank per worker (the FAKE part is only horovod)."""
    plan = local_plan(2)
    code = "import os; print('RANKS', os.environ['OMPI_COMM_WORLD_RANK'], os.environ['OMPI_COMM_WORLD_SIZE'])"
    cmd = horovod_command(plan, [sys.executable, "-c", code], check=False)
    assert cmd[cmd.index("-np") + 1] == "2" and cmd[cmd.index("--map-by") + 1] == "ppr:2:node"
    log = tmp_path / "out.log"
    rc = run_outer_command(cmd, log_path=log)
    assert rc == 0
    ranks = sorted(line.split()[1:] for line in log.read_text().splitlines() if line.startswith("RANKS"))
    assert ranks == [["0", "2"], ["1", "2"]]


@pytest.mark.timeout(60)
def test_run_outer_command_returns_failing_code(tmp_path):
    assert run_outer_command([sys.executable, "-c", "import sys; sys.exit(7)"]) == 7
    assert run_outer_command([sys.executable, "-c", "import os,signal; os.kill(os.getpid(), signal.SIGTERM)"]) == 143
    with pytest.raises(LaunchError):
        run_outer_command([str(tmp_path / "missing-launcher")])


@pytest.mark.timeout(60)
def test_fake_horovod_launch_exports_run_contract_and_logs(tmp_path):
    """launch_horovod runs real mpirun (horovod FAKE: check=False); each rank sees the run-wide names."""
    from podrun.launch.engines.horovod import launch_horovod
    from podrun.launch.options import LaunchOptions, TransportOptions
    from podrun.launch.run import build_request

    plan = local_plan(2)
    # rank 1 fails only once rank 0 has said its line (the marker file): mpirun ends every rank at the first
    # failure, so a rank 1 that failed first would take rank 0 down before it printed
    said = tmp_path / "rank0-said"
    code = ("import os,sys,time; r = os.environ['OMPI_COMM_WORLD_RANK']; "
            "print('HVD', r, os.environ['PODRUN_RUN_ID'], os.environ['PODRUN_NUM_REPLICAS'], os.getcwd(), flush=True); "
            f"m = {str(said)!r}\n"
            "if r == '0': open(m, 'w').close()\n"
            "else:\n"
            "    t = time.monotonic()\n"
            "    while not os.path.exists(m) and time.monotonic() - t < 30: time.sleep(0.02)\n"
            "    sys.exit(4)")
    req = build_request(plan, [sys.executable, "-c", code], transport="local", runs_dir=str(tmp_path / "runs"),
                        run_id="hvd1", options=LaunchOptions(transports=TransportOptions(workdir=str(tmp_path))))
    argv, rc = launch_horovod(req, dry_run=True)
    assert rc is None and "-x" in argv and "PODRUN_RUN_ID" in argv
    argv, rc = launch_horovod(req, check=False)
    assert rc == 4                                         # mpirun reports the failing rank's code
    lines = [line.split() for line in (tmp_path / "runs" / "hvd1" / "horovod.log").read_text().splitlines()
             if line.startswith("HVD")]
    assert sorted(x[1] for x in lines) == ["0", "1"]
    assert all(x[2:] == ["hvd1", "2", str(tmp_path)] for x in lines)


def test_resolve_engine_defaults_and_poprun_options():
    from podrun.launch.engines import resolve_engine
    from podrun.launch.options import EngineOptions
    from podrun.specs import load_cluster

    assert resolve_engine(EngineOptions(), load_cluster("local"))[:2] == ("torch", None)
    name, transport, popts, _ = resolve_engine(EngineOptions(vipu_partition="p1", num_ilds=2),
                                               load_cluster("ipu-pod64"))
    assert (name, transport, popts.vipu_partition, popts.num_ilds) == ("poprun", "poprun", "p1", 2)
    assert resolve_engine(EngineOptions(engine="horovod", mpi_args="--tag-output -x A"))[3] == ("--tag-output", "-x", "A")


def test_engine_views_come_from_the_env_contract(tmp_path):
    """horovod's env is the run-wide part of what the agent gives each worker (one home: podrun.wire.worker_env),
    and every rank of the run agrees on it."""
    from podrun.launch.engines.horovod import horovod_env
    from podrun.launch.run import build_request
    from podrun.wire.worker_env import RUN_WIDE_NAMES, SNAPSHOT_KEY_NAME

    req = build_request(local_plan(2), ["true"], transport="local", runs_dir=str(tmp_path / "runs"), run_id="v1",
                        env=(("EXTRA", "1"),), max_restarts=3)
    env = horovod_env(req)
    assert set(env) == set(RUN_WIDE_NAMES) | {"EXTRA", SNAPSHOT_KEY_NAME}      # the run's key: an --env pair
    workers = req.worker_envs(0)
    for name in RUN_WIDE_NAMES:
        if name != "MASTER_PORT":          # rank 0's differs behind the store relay
            assert {w[name] for w in workers} == {env[name]}, name
    assert env["TORCHELASTIC_MAX_RESTARTS"] == "3" and env["TORCHELASTIC_RUN_ID"] == "v1"


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
