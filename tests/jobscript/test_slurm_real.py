"""A rendered Slurm script submitted to a real Slurm (slurmctld + 3 slurmd in namespaces): sbatch
accepts its directives, the body receives hostile argv and env verbatim, discover() inside the real
allocation finds node1..node3 from SLURM_JOB_NODELIST, and the job's exit code is the command's."""
from __future__ import annotations

import dataclasses
import json
import sys

import pytest

from podrun.jobscript import render, request_from_plan

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(120)]

HOSTILE = ["two words", "it's", 'say "hi"', "$(touch PWNED)", "`touch PWNED`", "${HOME}", "a;b", "", "--"]

PROBE = (  # one line: job scripts refuse newlines in values (Grid Engine reads '#$' lines anywhere)
    "import json, os, sys; from podrun.jobscript import discover; d = discover(os.environ); "
    "print(json.dumps({'argv': sys.argv[1:], 'hosts': list(d.names), 'source': d.source, "
    "'probe': os.environ['PODRUN_PROBE'], 'cwd': os.getcwd()}))"
)


def _request(cluster, job_name, command):
    from podrun.cli.options import resolve_plan

    plan = resolve_plan(None, cluster="local", hosts_opt=",".join(cluster.nodes), devices_per_host=1, environ={})[0]
    jobs = str(cluster.jobs_dir)
    req = request_from_plan(plan, scheduler="slurm", python=sys.executable, recipe=None, args=("true",), job_name=job_name, time="5m",
                            partition="debug", log_dir=jobs, workdir=jobs,
                            env={"PODRUN_PROBE": "$(touch PWNED) `x` 'q' \"d\""})
    return dataclasses.replace(req, command=tuple(command))


def test_rendered_script_runs_in_a_real_slurm_allocation(slurm_cluster):
    sl = slurm_cluster
    ok = _request(sl, "podrun-jobscript-probe", [sys.executable, "-c", PROBE, *HOSTILE])
    bad = _request(sl, "podrun-jobscript-fail", ["sh", "-c", "exit 7"])
    jobs = sl.jobs_dir
    paths = {}
    for req in (ok, bad):
        script = jobs / f"{req.job_name}.sh"
        script.write_text(render(req))
        paths[req.job_name] = sl.sbatch([str(script)], cwd=str(jobs))
    done_ok = sl.wait_job(paths["podrun-jobscript-probe"])
    done_bad = sl.wait_job(paths["podrun-jobscript-fail"])
    out_file = jobs / f"podrun-jobscript-probe-{paths['podrun-jobscript-probe']}.out"
    err_file = jobs / f"podrun-jobscript-probe-{paths['podrun-jobscript-probe']}.err"
    assert done_ok["JobState"] == "COMPLETED", (done_ok, err_file.read_text() if err_file.exists() else "")
    got = json.loads(out_file.read_text())
    assert got["argv"] == HOSTILE
    assert got["hosts"] == sl.nodes == ["node1", "node2", "node3"]
    assert got["source"] == "SLURM_JOB_NODELIST"
    assert got["probe"] == "$(touch PWNED) `x` 'q' \"d\""
    assert got["cwd"] == str(jobs)
    assert not list(jobs.rglob("PWNED"))
    assert done_ok["NumNodes"] == "3"
    # --no-requeue and the exit code of the exec'd command
    assert done_bad["JobState"] == "FAILED" and done_bad["ExitCode"] == "7:0", done_bad
    assert done_bad.get("Requeue") == "0"
