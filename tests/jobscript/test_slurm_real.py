"""A rendered Slurm script submitted to a real Slurm (slurmctld + 3 slurmd in namespaces): sbatch
accepts its directives, the body receives hostile argv and env verbatim, discover() inside the real
allocation finds node1..node3 from SLURM_JOB_NODELIST, and the job's exit code is the command's."""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from podrun.jobscript import JobOptions, render, request_from_plan

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
    req = request_from_plan(plan, JobOptions(scheduler="slurm", python=sys.executable, args=("true",),
                                             job_name=job_name, time_limit="5m", partition="debug", log_dir=jobs,
                                             workdir=jobs, env={"PODRUN_PROBE": "$(touch PWNED) `x` 'q' \"d\""}))
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


# -- the golden scripts through sbatch's own parser ------------------------------------------------------

GOLDEN = Path(__file__).parent / "golden"


def _sbatch_directives(text: str) -> dict[str, str]:
    """The script's ``#SBATCH --key[=value]`` lines (value "" for a flag), as sbatch reads them."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH "):
            key, _, value = line[len("#SBATCH "):].strip().partition("=")
            out[key] = value
    return out


def _fit_here(directives: dict[str, str], sl) -> list[str]:
    """sbatch options for what the test's Slurm lacks (other partitions, GPUs, more nodes, more cores). sbatch reads the
    command line after the script: the directive is still parsed, its value is replaced."""
    extra = []
    if directives.get("--partition", "debug") != "debug":
        extra.append("--partition=debug")
    if "--nodes" in directives and int(directives["--nodes"]) > len(sl.nodes):
        extra.append(f"--nodes={len(sl.nodes)}")
    if "--gpus-per-node" in directives:
        extra.append("--gpus-per-node=0")
    if "--cpus-per-task" in directives and int(directives["--cpus-per-task"]) > sl.cpus_per_node:
        extra.append(f"--cpus-per-task={sl.cpus_per_node}")
    return extra


def _seconds(t: str) -> int:
    """A Slurm time written as [D-]HH:MM:SS (the golden's and scontrol's forms) in seconds."""
    days, _, hms = t.rpartition("-")
    h, m, s = (int(x) for x in hms.split(":"))
    return int(days or 0) * 86400 + 3600 * h + 60 * m + s


@pytest.mark.parametrize("name", sorted(p.stem for p in GOLDEN.glob("slurm_*.sh")))
def test_golden_script_is_read_by_the_real_sbatch(slurm_cluster, name):
    """Each golden Slurm script (tests/jobscript/golden, what the writer produces) through the real sbatch:
    `sbatch --test-only` accepts it, and the job sbatch makes of it (submitted held, then cancelled) has the
    directives' name, time limit, node count and no requeue. A copy with one directive misspelt is refused,
    so the parser is really in play.

    Not checked here: what this 3-node, GPU-less Slurm with one partition ("debug") cannot have. The golden's
    --partition, --gpus-per-node, a --nodes above 3 and more --cpus-per-task than its nodes' are replaced on
    sbatch's command line: sbatch still parses those directives (a malformed node count fails) but checks their
    values against no cluster that has them, and --gpus-per-node's value is then not parsed at all."""
    sl = slurm_cluster
    text = (GOLDEN / f"{name}.sh").read_text()
    d = _sbatch_directives(text)
    assert d, f"{name}: no #SBATCH lines"
    script = sl.jobs_dir / f"golden-{name}.sh"
    script.write_text(text)
    extra = _fit_here(d, sl)
    cp = sl.run(["sbatch", "--test-only", *extra, str(script)], check=False, cwd=str(sl.jobs_dir))
    assert cp.returncode == 0 and "to start at" in cp.stderr, (extra, cp.stdout + cp.stderr)
    job = sl.sbatch(["--hold", *extra, str(script)], cwd=str(sl.jobs_dir))
    try:
        info = sl.job(job)
    finally:
        sl.run(["scancel", job], check=False)
    assert info["JobName"] == d["--job-name"], info
    assert _seconds(info["TimeLimit"]) == _seconds(d["--time"]), info
    assert info["Requeue"] == ("0" if "--no-requeue" in d else "1"), info
    if not any(e.startswith("--nodes=") for e in extra):
        assert info["NumNodes"].split("-")[0] == d["--nodes"], info       # "3" or "3-3" (min-max)
    if "--account" in d:
        assert info["Account"] == d["--account"], info
    bad = sl.jobs_dir / f"golden-{name}-misspelt.sh"
    bad.write_text(text.replace("#SBATCH --ntasks-per-node=", "#SBATCH --ntasks-per-nodes="))
    cp = sl.run(["sbatch", "--test-only", *extra, str(bad)], check=False, cwd=str(sl.jobs_dir))
    assert cp.returncode != 0 and "ntasks-per-nodes" in cp.stderr, cp.stderr
