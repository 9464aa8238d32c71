"""Every shipped cluster spec x every scheduler: the script's launch line is accepted inside its job.

`podrun script` writes the script; its `exec PYTHON -c BOOT launch ...` line (`-m podrun launch` as a safe helper)
then runs with --dry-run --json through the real `podrun launch`, in this process, in the environment a job of that
scheduler has (its host list variable or file, its job id; Grid Engine's SGE_ROOT/ARC for Open MPI's tight
integration). It must exit 0 on the job's hosts.
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from podrun.jobscript import SCHEDULERS, compress_hostlist
from podrun.specs import cluster_names, load_cluster

SHIPPED = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "cluster_specs").glob("*.yaml"))
VIPU = ["--vipu-server-host", "vipu-ctrl", "--vipu-partition", "p-job"]   # what a POD job's shell names


def test_every_shipped_spec_is_in_the_matrix():
    assert set(SHIPPED) <= set(cluster_names()) and {"abci", "abci3", "dgx-h100", "local", "ipu-pod64"} <= set(SHIPPED)


def job_environ(scheduler: str, hosts: list[str], tmp_path: Path) -> dict[str, str]:
    """The variables a real job of ``scheduler`` on ``hosts`` has (podrun.specs.allocation reads them)."""
    if scheduler == "slurm":
        return {"SLURM_JOB_NODELIST": compress_hostlist(hosts), "SLURM_NNODES": str(len(hosts)),
                "SLURM_JOB_ID": "4242", "SLURM_NTASKS_PER_NODE": "1"}
    if scheduler == "pbs":
        (tmp_path / "nodefile").write_text("".join(f"{h}\n" for h in hosts))
        return {"PBS_NODEFILE": str(tmp_path / "nodefile"), "PBS_JOBID": "4242.pbs", "PBS_O_WORKDIR": str(tmp_path)}
    (tmp_path / "pe_hostfile").write_text("".join(f"{h} 1 all.q@{h} UNDEFINED\n" for h in hosts))
    return {"PE_HOSTFILE": str(tmp_path / "pe_hostfile"), "JOB_ID": "4242", "SGE_ROOT": str(tmp_path / "sge"),
            "ARC": "lx-amd64", "NHOSTS": str(len(hosts))}


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("cluster", SHIPPED)
def test_script_launch_line_is_accepted_in_its_job(cluster, scheduler, podrun_cli, monkeypatch, tmp_path):
    spec = load_cluster(cluster)
    ipu = spec.device.kind == "ipu"
    nodes = min(2, len(spec.hosts))
    args = ["script", "--scheduler", scheduler, "--cluster", cluster, "--nodes", str(nodes), *(VIPU if ipu else []),
            "--json", "--", "python3", "train.py"]
    asks = spec.jobs is not None and (spec.jobs.pe or spec.jobs.resource) and spec.scheduler == scheduler
    if scheduler == "uge" and not asks:
        # a Grid Engine job on a cluster whose spec names no resource or PE for it: refused, naming the spec
        code, out, err = podrun_cli(*args)
        assert (code, out) == (2, "") and f"cluster spec {spec.name} names none for Grid Engine" in err, err
        assert "rt_F" not in err and "Traceback" not in err, err
        args[1:1] = ["--pe", "mpi"]
    code, out, err = podrun_cli(*args)
    assert code == 0, err
    text = json.loads(out)["script"]
    comments = [x for x in text.splitlines()
                if x.startswith("# ") and not x.startswith(("# plan:", "# submit:", "# PYTHON -m podrun launch"))]
    assert all(f"cluster spec {spec.name}" in c for c in comments), comments     # each one the spec's
    assert ("rt_F" in text) == (cluster == "abci" and scheduler == "uge"), text
    launch = json.loads(out)["launch"]
    line = next(x for x in json.loads(out)["script"].splitlines() if x.startswith("exec "))
    assert shlex.split(line)[1:] == launch          # the script runs what --json says
    if ipu:     # poprun starts the instances itself, on the POD's V-IPU partition
        assert "--transport" not in launch and {"vipu-ctrl", "p-job"} <= set(launch)
    hosts = [f"c{i:03d}" for i in range(1, nodes + 1)]
    for name, value in job_environ(scheduler, hosts, tmp_path).items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    code, out, err = podrun_cli(*launch[3:4], "--dry-run", "--json", "--runs-dir", str(tmp_path / "runs"),
                                *launch[4:])
    assert code == 0, f"{cluster} x {scheduler}: {' '.join(launch[3:])}\n{err}"
    record = json.loads(out)
    assert [i["host"] for i in record["instances"]] == hosts
    assert record["transport"] == ("poprun" if ipu else launch[launch.index("--transport") + 1])
    assert not any("this line fails" in n for n in record.get("notes", ()))


def test_ipu_pod_script_that_would_fail_in_its_job_is_refused(podrun_cli, monkeypatch):
    """Before anything is written: an IPU-POD job with no V-IPU partition or server (option, environment or spec),
    or with a --transport beside poprun, is exit 2 in one paragraph; the POD shell's IPUOF_VIPU_API_* fill them."""
    for name in ("IPUOF_VIPU_API_HOST", "IPUOF_VIPU_API_PARTITION_ID"):
        monkeypatch.delenv(name, raising=False)
    code, out, err = podrun_cli("script", "--scheduler", "slurm", "--pod", "64", "efficientnet_b4")
    assert code == 2 and out == "" and "--vipu-partition" in err and "IPUOF_VIPU_API_PARTITION_ID" in err
    code, _, err = podrun_cli("script", "--scheduler", "pbs", "--pod", "16", "--transport", "srun", *VIPU, "--", "x")
    assert code == 2 and "drop --transport" in err and "Traceback" not in err
    monkeypatch.setenv("IPUOF_VIPU_API_HOST", "ctrl-from-env")
    monkeypatch.setenv("IPUOF_VIPU_API_PARTITION_ID", "part-from-env")
    code, out, err = podrun_cli("script", "--scheduler", "uge", "--pe", "mpi", "--pod", "16", "--json", "--", "x")
    assert code == 0, err
    launch = json.loads(out)["launch"]
    assert launch[launch.index("--vipu-partition") + 1] == "part-from-env" and "ctrl-from-env" in launch
