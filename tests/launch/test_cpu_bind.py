"""--cpu-bind and each worker's share of cores: the rule, its refusals, a real local run, and job scripts' cores."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from podrun.jobscript.job import JobScriptError, node_cpus
from podrun.launch.transports.srun import step_cpus
from podrun.wire.agent_args import CpuBind, CpuBindError
from podrun.wire.worker_env import cpu_sets, numa_domains
from tests.launch.helpers import podrun, run_dir

AUTO = CpuBind("auto")


@pytest.mark.parametrize(("bind", "cores", "workers", "domains", "expect"), [
    # ABCI: 40 cores in 2 NUMA nodes, 4 GPUs: ranks 0-1 on node 0, 2-3 on node 1, 10 cores each
    (AUTO, range(40), 4, numa_domains(range(40), 2), [tuple(range(i, i + 10)) for i in range(0, 40, 10)]),
    (AUTO, range(10), 3, None, [(0, 1, 2, 3), (4, 5, 6), (7, 8, 9)]),      # the first ranks a core more
    (AUTO, range(2), 3, None, [(0,), (1,), (0,)]),                          # more ranks than cores: in turn
    (AUTO, [4, 5, 6, 7], 2, [(0, 1, 2, 3), (4, 5, 6, 7)], [(4, 5), (6, 7)]),  # the allowed cores of the domains
    (CpuBind.parse("1,0"), range(2), 2, None, [(1,), (0,)]),
    (CpuBind(), range(8), 2, None, None),
])
def test_each_local_rank_gets_its_cores(bind, cores, workers, domains, expect):
    assert cpu_sets(bind, cores, workers, domains) == expect


@pytest.mark.parametrize(("text", "words"), [("0-3,x", "'x' is not a core"), ("3-1", "low to high"),
                                             ("0,,1", "local rank 1 no core")])
def test_a_list_that_does_not_read_is_refused(text, words):
    with pytest.raises(CpuBindError, match=words):
        CpuBind.parse(text)


@pytest.mark.parametrize(("text", "words"), [("0", "1 core set(s) for 2 worker(s)"),
                                             ("0,4096", "core 4096 is not one of the host's usable cores"),
                                             ("many", "'many' is not a core")])
def test_a_cpu_bind_that_does_not_fit_this_machine_is_exit_2(tmp_path, text, words):
    cp = podrun("launch", "--devices-per-host", "2", "--cpu-bind", text, "--dry-run", "--runs-dir",
                str(tmp_path / "runs"), "--", sys.executable, "-c", "pass")
    assert cp.returncode == 2 and words in cp.stderr and "Traceback" not in cp.stderr, cp.stderr
    assert cp.stderr.startswith(f"podrun: error: --cpu-bind {text}")


AFFINITY = ("import json, os; print('CORES', json.dumps([int(os.environ['LOCAL_RANK']), "
            "sorted(os.sched_getaffinity(0)), int(os.environ['OMP_NUM_THREADS']), int(os.environ['PODRUN_CPUS'])]))")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two workers on disjoint cores need two cores")
@pytest.mark.timeout(60)
def test_cpu_bind_auto_gives_two_local_workers_disjoint_cores(tmp_path):
    """A real local run: each worker runs on its own cores (sched_getaffinity inside it), its OMP_NUM_THREADS is
    their count, --dry-run shows them, and the instance log has one line per worker with its rank and cores."""
    argv = ("launch", "--devices-per-host", "2", "--cpu-bind", "auto", "--runs-dir", str(tmp_path / "runs"))
    dry = podrun(*argv, "--dry-run", "--", sys.executable, "-c", AFFINITY)
    assert dry.returncode == 0 and "--cpu-bind auto" in dry.stdout and "PODRUN_CPU_SET=" in dry.stdout, dry.stderr
    cp = podrun(*argv, "--", sys.executable, "-c", AFFINITY)
    assert cp.returncode == 0, cp.stderr
    seen = {}
    for line in cp.stdout.splitlines():
        if "CORES " in line:
            rank, cores, omp, share = json.loads(line.split("CORES ", 1)[1])
            seen[rank] = set(cores)
            assert omp == share == len(cores), line
    assert sorted(seen) == [0, 1] and seen[0] and seen[1] and not seen[0] & seen[1], cp.stdout
    log = (run_dir(tmp_path / "runs") / "instance-0.log").read_text()
    for rank in (0, 1):
        assert f"--cpu-bind: local rank {rank} (rank {rank}) on cores" in log, log


SPEC = SimpleNamespace(scheduler="slurm", cpu=SimpleNamespace(cores=40, numa_nodes=2), path="abci.yaml", name="abci")


@pytest.mark.parametrize(("given", "spec", "expect"), [
    (None, SPEC, 40), (8, SPEC, 8), (None, SimpleNamespace(**{**vars(SPEC), "scheduler": "none"}), None),
    (None, None, None), (None, SimpleNamespace(**{**vars(SPEC), "cpu": None}), JobScriptError)])
def test_a_job_asks_each_node_for_the_specs_cores_or_cpus_per_node(given, spec, expect):
    """--cpus-per-node wins; a scheduled cluster's spec gives its cores; this machine's spec (scheduler none) asks
    none; a scheduled spec without cores is exit 2 naming it and --cpus-per-node."""
    if expect is JobScriptError:
        with pytest.raises(JobScriptError, match="abci.yaml gives no cpu.cores") as err:
            node_cpus(given, spec)
        assert "--cpus-per-node" in err.value.hint and err.value.exit_code == 2
    else:
        assert node_cpus(given, spec) == expect


@pytest.mark.parametrize(("env", "per_node", "expect"), [
    ({"SLURM_CPUS_PER_TASK": "40"}, 4, 10), ({"SRUN_CPUS_PER_TASK": "8", "SLURM_CPUS_PER_TASK": "40"}, 1, 8),
    ({"SLURM_CPUS_PER_TASK": "2"}, 4, 1), ({}, 1, None)])
def test_the_srun_step_shares_the_jobs_cores_among_its_tasks(env, per_node, expect):
    assert step_cpus(env, per_node) == expect


def test_a_spec_without_cores_in_a_job_script_is_exit_2(tmp_path):
    spec = tmp_path / "c.yaml"
    data = yaml.safe_load((Path(__file__).parents[2] / "cluster_specs" / "dgx-h100.yaml").read_text())
    spec.write_text(yaml.safe_dump({k: v for k, v in data.items() if k != "cpu"}))
    cp = podrun("script", "--scheduler", "slurm", "--cluster", str(spec), "--nodes", "1", "--", "python", "t.py")
    assert cp.returncode == 2 and "gives no cpu.cores" in cp.stderr and "--cpus-per-node" in cp.stderr, cp.stderr
    ok = podrun("script", "--scheduler", "slurm", "--cluster", str(spec), "--nodes", "1", "--cpus-per-node", "16",
                "--", "python", "t.py")
    assert ok.returncode == 0 and "#SBATCH --cpus-per-task=16" in ok.stdout, ok.stderr
