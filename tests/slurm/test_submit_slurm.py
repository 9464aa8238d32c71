"""podrun submit / status / cancel and the srun transport on a real Slurm (slurmctld + 3 slurmd in namespaces)."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from podrun import pystart
from tests.engines.conftest import ALLREDUCE, assert_allreduce_job_done, assert_forked_per_host, results
from tests.harness.podrun_proc import PODRUN, run_podrun
from tests.launch.helpers import (ENV_UNTIL, SNAPSHOT_KEY, ArgvWatch, assert_env_off_argv, secret_values, wait_until,
                                  worker_saw)
from tests.launch.helpers import run_dir as only_run_dir      # these tests name their run dir run_dir

pytestmark = [pytest.mark.slurm, pytest.mark.cluster]


def podrun(sl, args, cwd, timeout=120, env=None):
    return run_podrun(*args, cwd=cwd, env={**sl.env, **(env or {})}, timeout=timeout, stdin=subprocess.DEVNULL)


def job_output(run_dir: Path, ext: str) -> str:
    return "".join(p.read_text() for p in run_dir.glob(f"*.{ext}"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["srun", "mpirun"])
def test_submit_three_nodes_srun_allreduce(slurm_cluster, tmp_path, transport):
    """submit --wait: one instance per node through srun, a gloo all_reduce across the 3 nodes. With --transport
    mpirun on these nodes, which run no sshd (ssh to them is refused), Open MPI starts its daemons through Slurm
    (srun ... prted): the preflight probes no node over ssh and the line `script --transport mpirun` writes runs."""
    import socket

    sl = slurm_cluster
    if transport == "mpirun":
        for node in sl.nodes[:3]:          # no sshd on the nodes: ssh cannot reach them
            with pytest.raises(OSError):
                socket.create_connection((sl.fabric.nodes[node].address, 22), timeout=5).close()
    p = podrun(sl, ["submit", "--scheduler", "slurm", "--nodes", "3", "--wait", "--runs-dir", str(tmp_path / "runs"),
                    *(["--transport", transport] if transport != "srun" else []),
                    "--", sys.executable, ALLREDUCE], cwd=tmp_path)
    run_dir = only_run_dir(tmp_path / "runs")
    assert p.returncode == 0, p.stdout + p.stderr + job_output(run_dir, "err")
    rec = json.loads((run_dir / "job.json").read_text())
    assert p.stdout.split()[0] == rec["job_id"] and rec["scheduler"] == "slurm" and rec["nodes"] == 3
    script = (run_dir / "job.sh").read_text()
    assert "#SBATCH --nodes=3" in script and f"--transport {transport}" in script
    res = sorted(results(job_output(run_dir, "out")), key=lambda r: r["rank"])
    assert [r["host"] for r in res] == sl.nodes[:3], job_output(run_dir, "out") + job_output(run_dir, "err")
    assert_allreduce_job_done(run_dir, res, transport, podrun(sl, ["status", str(run_dir), "--json"], cwd=tmp_path))
    joins = json.loads((run_dir / "summary.json").read_text())["joins"]   # the agents joined over TCP
    assert (joins["joined"], joins["expected"], joins["refused"]) == (3, 3, {}), joins


@pytest.mark.timeout(120)
def test_submit_wait_returns_failing_worker_exit_code(slurm_cluster, tmp_path):
    """A worker exits 3 on node2: the job fails with exit code 3 and --wait exits 3."""
    sl = slurm_cluster
    p = podrun(sl, ["submit", "--scheduler", "slurm", "--nodes", "3", "--wait", "--runs-dir", str(tmp_path / "runs"),
                    "--env", "FAIL_RANK=1", "--env", "FAIL_CODE=3", "--", sys.executable, ALLREDUCE], cwd=tmp_path)
    run_dir = only_run_dir(tmp_path / "runs")
    assert p.returncode == 3, p.stdout + p.stderr + job_output(run_dir, "err")
    job = json.loads((run_dir / "job.json").read_text())["job_id"]
    assert sl.job(job)["ExitCode"] == "3:0"
    err = job_output(run_dir, "err")
    assert "root cause: instance 1 on node2" in err, err
    st = podrun(sl, ["status", job, "--scheduler", "slurm", "--json"], cwd=tmp_path)
    assert json.loads(st.stdout)["state"] == "FAILED" and json.loads(st.stdout)["exit_code"] == 3
    assert json.loads(st.stdout)["native"] == "FAILED"          # Slurm's JobState, as it is
    st = podrun(sl, ["status", str(run_dir)], cwd=tmp_path)      # the run's root cause, as summary.json holds it
    assert st.returncode == 0 and "FAILED, exit code 3" in st.stdout, st.stdout + st.stderr
    assert "root cause: instance 1 on node2" in st.stdout, st.stdout


@pytest.mark.timeout(60)
def test_a_held_job_cancelled_is_cancelled_with_slurms_exit_code(slurm_cluster, tmp_path):
    """A job held before it ran (sbatch -H), cancelled: CANCELLED with the exit code scontrol gives it (0:0 is 0,
    not one made up), in cancel's answer and in status's, text and JSON."""
    sl = slurm_cluster
    job = sl.sbatch(["-H", "-N1", "--output=/dev/null", f"--chdir={tmp_path}", "--wrap", "true"])
    c = podrun(sl, ["cancel", job, "--scheduler", "slurm", "--json"], cwd=tmp_path)
    assert c.returncode == 0, c.stdout + c.stderr
    out = json.loads(c.stdout)
    code, _, sig = sl.job(job)["ExitCode"].partition(":")
    said = 128 + int(sig) if int(sig) else int(code)
    assert (out["was"], out["state"], out["exit_code"], out["native"]) == ("PENDING", "CANCELLED", said, "CANCELLED")
    st = podrun(sl, ["status", job, "--scheduler", "slurm"], cwd=tmp_path)
    assert st.returncode == 0 and f"job {job} (slurm): CANCELLED, exit code {said}" in st.stdout, st.stdout


@pytest.mark.timeout(120)
def test_cancel_ends_running_job_everywhere(slurm_cluster, tmp_path):
    """podrun cancel on a running 3-node job: the job ends and nothing of it is left on any node."""
    sl = slurm_cluster
    marker = f"podruncancel{os.getpid()}x{int(time.time())}"
    code = f"import time; tag='{marker}'; time.sleep(300)"
    p = podrun(sl, ["submit", "--scheduler", "slurm", "--nodes", "3", "--runs-dir", str(tmp_path / "runs"),
                    "--json", "--", sys.executable, "-c", code], cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    rec = json.loads(p.stdout)
    nodes = sl.nodes[:3]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if all(sl.processes(n, marker) for n in nodes):
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"workers never started on every node: { {n: sl.processes(n, marker) for n in nodes} }\n"
                    + job_output(Path(rec["run_dir"]), "err"))
    st = podrun(sl, ["status", rec["run_dir"]], cwd=tmp_path)
    assert "RUNNING" in st.stdout, st.stdout + st.stderr
    c = podrun(sl, ["cancel", rec["run_dir"], "--json"], cwd=tmp_path)
    assert c.returncode == 0, c.stdout + c.stderr
    out = json.loads(c.stdout)
    assert out["was"] == "RUNNING" and out["state"] == "CANCELLED" and out["final"]
    # The workers and agents end within Slurm's KillWait (2 s here) and a margin; a node's slurmstepd lives on while it
    # reports the step's end to slurmctld (MessageTimeout 5 s here, retried under load), so it has a longer bound.
    for pattern, seconds in ((f"{marker}|podrun.host.agent", 15), (rf"slurmstepd: \[{rec['job_id']}\.", 45)):
        deadline = time.monotonic() + seconds
        left = {}
        while time.monotonic() < deadline:
            left = {n: sl.processes(n, pattern) for n in nodes}
            if not any(left.values()):
                break
            time.sleep(0.2)
        assert not any(left.values()), f"left on the nodes {seconds} s after cancel: {left}"


@pytest.mark.timeout(120)
def test_submit_from_an_interpreter_not_on_path(slurm_cluster, tmp_path):
    """podrun run as `<venv python> -m podrun` with no podrun on PATH (a virtualenv not activated): the
    job runs that interpreter's podrun on every node instead of exiting 127 on a bare `podrun`."""
    sl = slurm_cluster
    bare = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert not any(os.access(os.path.join(d, "podrun"), os.X_OK) for d in bare.split(":"))
    p = podrun(sl, ["submit", "--scheduler", "slurm", "--nodes", "3", "--wait", "--runs-dir", str(tmp_path / "runs"),
                    "--", sys.executable, ALLREDUCE], cwd=tmp_path, env={"PATH": bare})
    run_dir = only_run_dir(tmp_path / "runs")
    assert p.returncode == 0, p.stdout + p.stderr + job_output(run_dir, "err")
    launch = shlex.join(pystart.safe(sys.executable, "launch", module="podrun", root=None))    # not -m: never the cwd's
    assert f"exec {launch} " in (run_dir / "job.sh").read_text()
    res = results(job_output(run_dir, "out"))
    assert sorted(r["host"] for r in res) == sl.nodes[:3] and all(r["sum"] == 6.0 for r in res)


@pytest.mark.timeout(90)
def test_plan_larger_than_allocation_exit_2(slurm_cluster, tmp_path):
    """Inside a 2-node allocation, a launch that needs 3 nodes stops with exit 2 and says why."""
    sl = slurm_cluster
    out = tmp_path / "big.out"
    job = sl.sbatch(["-N2", f"--output={out}", f"--chdir={tmp_path}", "--wrap",
                     f"{sys.executable} -m podrun launch --transport srun --nodes 3 --devices-per-host 1 -- true"])
    info = sl.wait_job(job, timeout=60)
    text = out.read_text()
    assert info["ExitCode"] == "2:0", text
    assert "3 host" in text and "2" in text and "Traceback" not in text, text


@pytest.mark.timeout(150)
def test_srun_transport_keeps_env_values_off_every_command_line(slurm_cluster, tmp_path):
    """Inside a 2-node allocation, `podrun launch --transport srun --env NAME` (the value in the job's environment):
    srun carries the values to both nodes in its environment; no argv on the machine (podrun, srun, the step's
    shells and agents on the nodes, the workers) holds one, and both workers have them."""
    sl = slurm_cluster
    secrets = secret_values()
    dump, out = tmp_path / "dump", tmp_path / "job.out"
    dump.mkdir()
    launch = [*PODRUN, "launch", "--transport", "srun", "--nodes", "2", "--devices-per-host",
              "1", "--runs-dir", str(tmp_path / "runs"), *(a for n in secrets for a in ("--env", n)), "--",
              sys.executable, ENV_UNTIL, str(dump), *secrets, SNAPSHOT_KEY]
    watch = ArgvWatch().start()
    job = sl.sbatch(["-N2", f"--output={out}", f"--chdir={tmp_path}", "--wrap", " ".join(launch)], env=secrets)
    try:
        saw = worker_saw(dump, 2, 90)
    finally:
        (dump / "go").touch()
        info = sl.wait_job(job, timeout=90)
        watch.stop()
    assert info["ExitCode"] == "0:0", out.read_text()
    assert_env_off_argv(watch, secrets, saw)


@pytest.mark.timeout(150)
def test_srun_agents_fork_each_nodes_workers_from_one_zygote(slurm_cluster, tmp_path):
    """Import once per host under srun: `podrun launch --transport srun` in a 2-node job, 2 workers a node of a torch
    program: each node's agent (an srun task, --index-from-env, joined) starts its node's zygote, which imports torch
    once and forks both workers (and rank 0's store host); the all_reduce spans the 4; the run's end ends the
    zygotes on both nodes."""
    sl = slurm_cluster
    out = tmp_path / "job.out"
    launch = [*PODRUN, "launch", "--transport", "srun", "--nodes", "2", "--devices-per-host", "2", "--runs-dir",
              str(tmp_path / "runs"), "--", sys.executable, ALLREDUCE]
    job = sl.sbatch(["-N2", f"--output={out}", f"--chdir={tmp_path}", "--wrap", shlex.join(launch)])
    info = sl.wait_job(job, timeout=120)
    text = out.read_text()
    assert info["ExitCode"] == "0:0", text
    res = results(text)
    assert sorted((r["rank"], r["sum"], r["world"]) for r in res) == [(r, 10.0, 4) for r in range(4)], text
    assert_forked_per_host(res, sl.nodes[:2], 2)
    run_dir = only_run_dir(tmp_path / "runs")
    assert "the store host forked by the zygote" in (run_dir / "instance-0.log").read_text()
    assert wait_until(lambda: not [n for n in sl.nodes[:2] if sl.processes(n, "podrun.host.zygote")], 15)


@pytest.mark.timeout(150)
def test_srun_podrun_launch_runs_one_podrun_per_node_as_one_run(slurm_cluster, tmp_path):
    """`srun --ntasks-per-node=1 podrun launch ...` in a 2-node job, no PODRUN_JOIN_KEY: both copies take the user's
    key file, made on first use by whichever comes first (the nodes share the home directory); copy 0 is the
    controller, copy 1 joins it as node2's agent; the all_reduce spans both nodes, with one summary.json and one
    run directory, and each node's 2 workers are forked by its zygote (torch imported once a node); the batch
    step's own podrun-free shell is no copy."""
    sl = slurm_cluster
    out = tmp_path / "job.out"
    launch = [*PODRUN, "launch", "--devices-per-host", "2", "--runs-dir", str(tmp_path / "runs"), "--",
              sys.executable, ALLREDUCE]
    job = sl.sbatch(["-N2", f"--output={out}", f"--chdir={tmp_path}", "--wrap",
                     "srun --ntasks-per-node=1 " + shlex.join(launch)], env={"HOME": str(tmp_path / "home")})
    info = sl.wait_job(job, timeout=120)
    text = out.read_text()
    assert info["ExitCode"] == "0:0", text
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name == f"srun-{job}.0"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["transport"] == "join" and summary["exit_code"] == 0, summary
    assert [i["host"] for i in summary["instances"]] == sl.nodes[:2] and summary["joins"]["joined"] == 1
    res = results(text)
    assert sorted((r["rank"], r["sum"], r["world"]) for r in res) == [(r, 10.0, 4) for r in range(4)], text
    assert_forked_per_host(res, sl.nodes[:2], 2)
    assert (tmp_path / "home" / ".config" / "podrun" / "join.key").stat().st_mode & 0o777 == 0o600


@pytest.mark.timeout(60)
def test_unknown_job_id_exit_2_and_a_broken_client_exit_1(slurm_cluster, tmp_path):
    """A job id this Slurm never had (scontrol: "Invalid job id specified", no accounting storage here): status
    and cancel exit 2 naming it (scancel itself says nothing of it and exits 0); the same query with a
    SLURM_CONF that names no file exits 1 at once with the reason, instead of the clients' 60 s retries."""
    for cmd in ("status", "cancel"):
        p = podrun(slurm_cluster, [cmd, "987654", "--scheduler", "slurm", "--json"], cwd=tmp_path)
        assert (p.returncode, p.stdout) == (2, ""), p.stdout + p.stderr
        assert "job 987654 is unknown to slurm" in p.stderr and "Traceback" not in p.stderr, p.stderr
    t0 = time.monotonic()
    p = podrun(slurm_cluster, ["status", "987654", "--scheduler", "slurm"], cwd=tmp_path,
               env={"SLURM_CONF": str(tmp_path / "missing.conf")})
    assert p.returncode == 1 and "missing.conf cannot be read" in p.stderr, p.stderr
    # the clients' retries on an unreadable SLURM_CONF last 60 s: under that, they were not waited on, however
    # loaded the machine (a bound nearer the command's own time would measure the machine, not podrun)
    assert time.monotonic() - t0 < 60


@pytest.mark.timeout(300)
def test_calibrate_over_the_srun_transport_in_an_allocation(slurm_cluster, tmp_path):
    """`podrun calibrate --transport srun --nodes 2` as a batch job's step: the calibration workers start through
    srun on both nodes of the allocation, and the file holds both nodes, the inter-host all-reduce and the
    data-parallel step (small inputs, --image-size 16, and the largest local batch given, no memory search, to keep
    it short)."""
    from podrun.specs.calibration import load

    sl = slurm_cluster
    out = tmp_path / "job.out"
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "resnet18_cifar10"
    calibrate = [*PODRUN, "calibrate", "--transport", "srun", "--nodes", "2",
                 "--devices-per-host", "1", "--runs-dir", str(tmp_path / "runs"), "--largest-batch", "4",
                 "--batches", "4", "--steps", "1", "--image-size", "16", "--name", "in-slurm", str(recipe)]
    job = sl.sbatch(["-N2", f"--output={out}", f"--chdir={tmp_path}", "--wrap", " ".join(calibrate)])
    info = sl.wait_job(job, timeout=280)
    assert info["ExitCode"] == "0:0", out.read_text()[-3000:]
    cal = load(tmp_path / "runs" / "calibrations" / "in-slurm.yaml")
    assert cal.hosts == tuple(sl.nodes[:2]) and cal.image_size == 16
    assert cal.network.inter_host is not None and cal.network.inter_host.ranks == 2
    assert cal.overlap is not None and cal.overlap.ranks == 2
    (run_dir,) = [d for d in (tmp_path / "runs").iterdir() if d.name.startswith("calibrate-")]
    assert json.loads((run_dir / "summary.json").read_text())["transport"] == "srun"


POPRUN_WORKER = ("import json, os; print('IPU ' + json.dumps({k: os.environ.get(k) for k in ('POPDIST_INSTANCE_INDEX', "
                 "'PODRUN_INSTANCE_INDEX', 'POPDIST_NUM_TOTAL_REPLICAS', 'SLURM_JOB_ID')}), flush=True)")


def stand_in_poprun(tmp_path: Path) -> Path:
    """A directory holding `poprun`: the project's STAND-IN (tests/engines/fake_poprun.py), as the Poplar SDK's
    enable.sh would put the real one on a POD host's PATH."""
    from tests.engines.test_poprun import FAKE

    d = tmp_path / "sdk-bin"
    d.mkdir()
    (d / "poprun").write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    (d / "poprun").chmod(0o755)
    return d


def assert_ipu_pod_job_ran(run_dir: Path, record: Path, hosts: list[str], out: str) -> None:
    """The job's podrun launch ran poprun (the stand-in) with the V-IPU partition and the job's hosts, and every
    instance saw popdist's index equal to podrun's."""
    argv = json.loads(record.read_text())["argv"]
    assert "--vipu-partition=p-job" in argv and "--vipu-server-host=vipu-ctrl" in argv, argv
    assert f"--host={','.join(hosts)}" in argv and f"--num-instances={len(hosts)}" in argv, argv
    seen = [json.loads(line.split("IPU ", 1)[1]) for line in out.splitlines() if "IPU {" in line]
    assert sorted(int(s["POPDIST_INSTANCE_INDEX"]) for s in seen) == list(range(len(hosts))), out
    assert all(s["POPDIST_INSTANCE_INDEX"] == s["PODRUN_INSTANCE_INDEX"] for s in seen), seen
    script = (run_dir / "job.sh").read_text()
    assert "--transport" not in script and "--vipu-partition p-job" in script, script


@pytest.mark.timeout(120)
def test_submit_ipu_pod_job_starts_poprun_in_the_allocation(slurm_cluster, tmp_path):
    """An IPU-POD job (`--cluster ipu-pod64`) end to end on the real Slurm with the STAND-IN poprun: the script's
    podrun launch takes no --transport (poprun starts the instances), passes the V-IPU server and partition, and
    runs one instance per allocated node's share; exit 0."""
    sl = slurm_cluster
    bin_dir, record = stand_in_poprun(tmp_path), tmp_path / "poprun.json"
    p = podrun(sl, ["submit", "--scheduler", "slurm", "--cluster", "ipu-pod64", "--nodes", "3", "--wait",
                    "--cpus-per-node", "1",    # the harness's nodes, not a POD host's 128 cores (the spec's)
                    "--vipu-server-host", "vipu-ctrl", "--vipu-partition", "p-job",
                    "--runs-dir", str(tmp_path / "runs"),
                    "--env", f"FAKE_POPRUN_RECORD={record}", "--", sys.executable, "-c", POPRUN_WORKER], cwd=tmp_path,
               env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    run_dir = only_run_dir(tmp_path / "runs")
    assert p.returncode == 0, p.stdout + p.stderr + job_output(run_dir, "err")
    assert_ipu_pod_job_ran(run_dir, record, sl.nodes[:3], job_output(run_dir, "out"))


@pytest.mark.timeout(60)
def test_a_refused_submit_leaves_nothing_behind(slurm_cluster, tmp_path):
    """sbatch refuses the job (a partition this cluster does not have): exit 2 with sbatch's own line, and neither
    the run directory nor the --runs-dir made for it is left."""
    p = podrun(slurm_cluster, ["submit", "--scheduler", "slurm", "--nodes", "1", "--partition", "nosuch",
                               "--runs-dir", str(tmp_path / "runs"), "--", "true"], cwd=tmp_path)
    assert p.returncode == 2 and "Invalid partition" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.timeout(120)
def test_a_job_confined_to_its_cores_binds_each_worker_to_its_share(slurm_cluster, tmp_path):
    """task/affinity confines each job to the cores it asked for: `podrun launch --transport srun --cpu-bind auto`
    with 2 workers in a job of 2 cores per node gives each its own core (the srun step asks the job's
    --cpus-per-task: Slurm 22.05+ gives a step one core otherwise), and in a job of 1 core both share that one
    (os.sched_getaffinity inside each worker)."""
    sl = slurm_cluster
    affinity = ("import json, os; print('CORES', json.dumps([int(os.environ['LOCAL_RANK']), "
                "sorted(os.sched_getaffinity(0)), int(os.environ['OMP_NUM_THREADS'])]))")
    launch = shlex.join([*PODRUN, "launch", "--transport", "srun", "--nodes", "1", "--devices-per-host", "2",
                         "--cpu-bind", "auto", "--runs-dir", str(tmp_path / "runs"), "--", sys.executable, "-c",
                         affinity])
    jobs = {cpus: sl.sbatch(["-N1", f"--cpus-per-task={cpus}", f"--output={tmp_path}/c{cpus}.out",
                             f"--chdir={tmp_path}", "--wrap", launch]) for cpus in (1, 2)}
    seen = {}
    for cpus, job in jobs.items():
        info = sl.wait_job(job, timeout=90)
        text = (tmp_path / f"c{cpus}.out").read_text()
        assert info["ExitCode"] == "0:0", text
        lines = [json.loads(line.split("CORES ", 1)[1]) for line in text.splitlines() if "CORES " in line]
        seen[cpus] = {rank: set(cores) for rank, cores, _ in lines}
        assert sorted(seen[cpus]) == [0, 1] and all(omp == 1 for *_, omp in lines), text
    assert len(seen[2][0]) == len(seen[2][1]) == 1 and not seen[2][0] & seen[2][1], seen
    assert len(seen[1][0]) == 1 and seen[1][0] == seen[1][1], seen
