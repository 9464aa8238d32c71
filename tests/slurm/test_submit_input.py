"""Bad input for submit/status/cancel and the srun transport: clear message, exit 2 (no scheduler needed)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from podrun.errors import HostError
from podrun.jobscript.submit import Completed, JobRecord, Slurm, parse_scontrol, resolve_job
from tests.harness.podrun_proc import run_podrun, with_env


def cli(args, cwd, env=None, timeout=60):
    return run_podrun(*args, cwd=cwd, env=with_env(**(env or {})), timeout=timeout, stdin=subprocess.DEVNULL)


def test_unknown_scheduler_exit_2(tmp_path):
    p = cli(["submit", "--scheduler", "lsf", "--nodes", "2", "--", "true"], tmp_path)
    assert p.returncode == 2
    assert "'lsf' is not one of 'slurm', 'pbs', 'uge'" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "runs").exists()        # nothing written


def test_malformed_nodelist_exit_2(tmp_path):
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-"}
    p = cli(["launch", "--transport", "srun", "--", "true"], tmp_path, env=env)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "node[1-" in p.stderr and "Traceback" not in p.stderr


def test_status_of_a_directory_without_job_json_exit_2(tmp_path):
    p = cli(["status", str(tmp_path)], tmp_path)
    assert p.returncode == 2 and "job.json" in p.stderr
    p = cli(["cancel", "not-a-job!"], tmp_path)
    assert p.returncode == 2 and "neither a run directory" in p.stderr


def test_srun_outside_an_allocation_and_too_small_allocation():
    from podrun.launch.request import InstanceLaunch, LaunchRequest
    from podrun.launch.transports.srun import SrunTransport
    from podrun.cli.options import resolve_plan

    plan = resolve_plan(None, hosts_opt="node1,node2,node3", devices_per_host=1, environ={})[0]
    req = LaunchRequest(run_id="r", run_dir="/tmp/r", plan=plan, plan_path="/tmp/r/plan.json", command=("true",),
                        python=sys.executable, workdir="/tmp", master_addr="node1", master_port=29500,
                        transport="srun", instances=tuple(InstanceLaunch(p.index, p.host) for p in plan.placement))
    t = SrunTransport(req)
    with pytest.raises(HostError, match="SLURM_JOB_ID is not set"):
        t.check_allocation({})
    with pytest.raises(HostError, match="node3 not allocated") as e:
        t.check_allocation({"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "node[1-2]"})
    assert e.value.exit_code == 2
    t.check_allocation({"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "node[1-4]"})
    line = t.describe()[0][1]
    assert "--ntasks-per-node=1" in line and "--kill-on-bad-exit=1" in line and "--nodes=3" in line
    assert "--index-from-env" in line


def test_scontrol_parsing_exit_codes():
    assert parse_scontrol("1", "JobId=1 JobState=COMPLETED ExitCode=0:0 NodeList=node[1-3]").exit_code == 0
    st = parse_scontrol("2", "JobId=2 JobState=FAILED Reason=NonZeroExitCode ExitCode=3:0 NodeList=node1")
    assert (st.state, st.exit_code, st.final) == ("FAILED", 3, True)
    assert parse_scontrol("3", "JobId=3 JobState=CANCELLED ExitCode=0:15").exit_code == 143
    run = parse_scontrol("4", "JobId=4 JobState=RUNNING ExitCode=0:0 NodeList=node[1-3]")
    assert run.exit_code is None and not run.final and run.nodes == "node[1-3]"


class RecordingRunner:
    """A CommandRunner that answers from a table (for the argv contract only; the real runs use sbatch)."""

    def __init__(self, answers):
        self.answers, self.calls = answers, []

    def run(self, argv, *, cwd=None, timeout=60.0):
        self.calls.append(list(argv))
        rc, out = self.answers.get(argv[0], (0, ""))
        return Completed(tuple(argv), rc, out, "")


def test_sbatch_parsable_contract_and_failure_message(tmp_path):
    r = RecordingRunner({"sbatch": (0, "42;cluster\n")})
    assert Slurm(r).submit(["sbatch", "--parsable", "/x/job.sh"]) == "42"
    assert r.calls[0] == ["sbatch", "--parsable", "/x/job.sh"]
    from podrun.jobscript.submit import SchedulerError

    bad = RecordingRunner({"sbatch": (1, "sbatch: error: Batch job submission failed: Invalid partition")})
    with pytest.raises(SchedulerError, match="Invalid partition"):
        Slurm(bad).submit(["sbatch", "--parsable", "/x/job.sh"])


def test_job_record_roundtrip(tmp_path):
    rec = JobRecord(run_id="r1", run_dir=str(tmp_path), scheduler="uge", job_id="77", script="s",
                    submit_argv=("qsub", "-terse", "-g", "grp", "s"), submitted_at=1.0)
    rec.save()
    assert resolve_job(str(tmp_path)) == ("uge", "77", rec)


def test_pbs_and_uge_state_parsing_contract():
    """PBS (qstat -x -f) and Grid Engine (qstat -j / qacct -j) answers, as those tools print them."""
    from podrun.jobscript.submit import Pbs, Uge

    qstat = "Job Id: 12.pbs\n    job_state = F\n    Exit_status = 3\n    exec_host = n1/0+n2/0\n"
    st = Pbs(RecordingRunner({"qstat": (0, qstat)})).state("12.pbs")
    assert (st.state, st.exit_code, st.nodes) == ("FAILED", 3, "n1/0+n2/0")
    st = Pbs(RecordingRunner({"qstat": (0, "Job Id: 13.pbs\n    job_state = R\n")})).state("13.pbs")
    assert st.state == "RUNNING" and st.exit_code is None
    r = RecordingRunner({"qstat": (1, ""), "qacct": (0, "jobnumber    44\nhostname     g0001\nfailed       0\nexit_status  0\n")})
    st = Uge(r).state("44")
    assert (st.state, st.exit_code) == ("COMPLETED", 0)
    assert r.calls == [["qstat"], ["qacct", "-j", "44"]]
    u = RecordingRunner({"qsub": (0, "44.1-4:1\n")})
    assert Uge(u).submit(["qsub", "-terse", "-g", "gab50", "/j.sh"]) == "44"


QSTAT = """\
job-ID  prior   name       user         state submit/start at     queue                          slots ja-task-ID
-----------------------------------------------------------------------------------------------------------------
      7 0.55500 podrun-com root         r     11/23/2026 08:24:25 all.q@node2                        3
      8 0.00000 podrun-com root         qw    11/23/2026 08:24:26                                    3
      9 0.55500 sleep      root         dr    11/23/2026 08:24:25 all.q@node1                        1
     10 0.00000 sleep      root         Eqw   11/23/2026 08:24:26                                    1
"""


def test_uge_qstat_table_contract():
    """Grid Engine's `qstat` table as 8.1.9 prints it: state letters and the master queue's host."""
    from podrun.jobscript.submit import parse_qacct, parse_qstat

    assert (parse_qstat("7", QSTAT).state, parse_qstat("7", QSTAT).nodes) == ("RUNNING", "node2")
    assert (parse_qstat("8", QSTAT).state, parse_qstat("8", QSTAT).nodes) == ("PENDING", None)
    assert parse_qstat("9", QSTAT).state == "COMPLETING" and not parse_qstat("9", QSTAT).final
    err = parse_qstat("10", QSTAT)
    assert err.state == "PENDING" and "Eqw" in err.reason
    assert parse_qstat("1", QSTAT) is None and parse_qstat("70", QSTAT) is None
    killed = parse_qacct("9", "qname all.q\nhostname node1\nfailed       100 : assumedly after job\n"
                              "exit_status  137                  (Killed)\n")
    assert (killed.state, killed.exit_code, killed.nodes) == ("FAILED", 137, "node1")
    assert "assumedly after job" in killed.reason
    never = parse_qacct("10", "failed       26  : opening input/output file\nexit_status  0\n")
    assert (never.state, never.exit_code) == ("FAILED", 1)


class SequenceClient:
    """A fake scheduler client (named fake: it stands for the gap between a Grid Engine job leaving
    qstat and its accounting record being flushed, which the real test cell flushes at once)."""

    name = "fake"

    def __init__(self, states):
        self.states, self.calls = list(states), 0

    def state(self, job_id):
        from podrun.jobscript.submit import JobState

        s = self.states[min(self.calls, len(self.states) - 1)]
        self.calls += 1
        return JobState(job_id, "fake", s, 0 if s == "COMPLETED" else None)


def test_wait_gives_a_vanished_job_time_for_its_record():
    from podrun.jobscript.submit import wait

    st = wait(SequenceClient(["RUNNING", "GONE", "GONE", "COMPLETED"]), "5", poll=0.01, gone_grace=5)
    assert (st.state, st.exit_code) == ("COMPLETED", 0)
    st = wait(SequenceClient(["GONE"]), "5", poll=0.01, gone_grace=5)   # never seen: GONE at once
    assert st.state == "GONE"
    c = SequenceClient(["PENDING", "GONE"])
    assert wait(c, "5", poll=0.01, gone_grace=0.1).state == "GONE" and c.calls > 2


def test_bad_job_value_leaves_no_run_directory(tmp_path):
    """The request is checked before runs/<run-id>/ is made: a refused value writes nothing."""
    p = cli(["submit", "--scheduler", "slurm", "--nodes", "2", "--job-name", "a b", "--dry-run",
             "--runs-dir", str(tmp_path / "runs"), "--", "true"], tmp_path)
    assert p.returncode == 2 and "job name 'a b'" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def test_submit_plans_the_allocation_not_this_host(tmp_path):
    """Without a cluster spec the job is --nodes hosts of --devices-per-host workers (default 1): the
    submitting host's GPUs (a fake nvidia-smi listing 8, named fake: no GPU here) are not the
    compute nodes' and are not asked."""
    import json
    import os

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\nfor i in 0 1 2 3 4 5 6 7; do echo \"GPU $i: fake\"; done\n")
    (fake / "nvidia-smi").chmod(0o755)
    p = cli(["submit", "--scheduler", "pbs", "--nodes", "3", "--dry-run", "--json",
             "--runs-dir", str(tmp_path / "runs"), "--", "python", "t.py"],
            tmp_path, env={"PATH": f"{fake}:{os.environ['PATH']}"})
    assert p.returncode == 0, p.stderr
    rec = json.loads(p.stdout)
    script = open(rec["script"]).read()
    assert "--nodes 3 --devices-per-host 1 " in script, script
    assert rec["submit_argv"] == ["qsub", rec["script"]] and rec["job_id"] is None
    plan = json.loads(open(os.path.join(rec["run_dir"], "plan.json")).read())
    assert plan["devices_per_host"] == 1
