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
    from podrun.launch.request import LaunchRequest, instances_of
    from podrun.launch.transports.srun import SrunTransport
    from podrun.cli.options import resolve_plan

    plan = resolve_plan(None, hosts_opt="node1,node2,node3", devices_per_host=1, environ={})[0]
    req = LaunchRequest(run_id="r", run_dir="/tmp/r", plan=plan, plan_path="/tmp/r/plan.json", command=("true",),
                        python=sys.executable, workdir="/tmp", master_addr="node1", master_port=29500,
                        transport="srun", instances=instances_of(plan))
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
    from podrun.jobscript.submit import exit_code_of

    held = parse_scontrol("5", "JobId=5 JobState=CANCELLED Reason=JobHeldAdmin ExitCode=0:0 NodeList=(null)")
    assert (held.state, held.exit_code, exit_code_of(held)) == ("CANCELLED", 0, 1)   # as Slurm says; --wait: 1


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
    r = RecordingRunner({"qstat": (0, ""),
                         "qacct": (0, "jobnumber    44\nhostname     g0001\nfailed       0\nexit_status  0\n")})
    st = Uge(r).state("44")
    assert (st.state, st.exit_code) == ("COMPLETED", 0)
    assert r.calls == [["qstat", "-g", "t"], ["qacct", "-j", "44"]]
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
    """Grid Engine's `qstat` table as 8.1.9 prints it: state letters and the master queue's host; `qstat -g t`, a
    line per host of a parallel job: every host, the MASTER's first."""
    from podrun.jobscript.submit import parse_qacct, parse_qstat

    tasks = "".join(f"      5 0.50000 sleep root r 12/07/2026 05:09:06 all.q@{h} {m}\n"
                    for h, m in (("node1", "SLAVE"), ("node2", "SLAVE"), ("node3", "MASTER")))
    assert (parse_qstat("5", tasks).state, parse_qstat("5", tasks).nodes) == ("RUNNING", "node3,node1,node2")

    assert (parse_qstat("7", QSTAT).state, parse_qstat("7", QSTAT).nodes) == ("RUNNING", "node2")
    assert (parse_qstat("8", QSTAT).state, parse_qstat("8", QSTAT).nodes) == ("PENDING", None)
    assert parse_qstat("9", QSTAT).state == "COMPLETING" and not parse_qstat("9", QSTAT).final
    err = parse_qstat("10", QSTAT)
    assert err.state == "PENDING" and "Eqw" in err.reason
    assert parse_qstat("1", QSTAT) is None and parse_qstat("70", QSTAT) is None
    killed = parse_qacct("9", "qname all.q\nhostname node1\nfailed       100 : assumedly after job\n"
                              "exit_status  137                  (Killed)\n")
    assert (killed.state, killed.exit_code, killed.nodes) == ("CANCELLED", 137, "node1")
    assert "assumedly after job" in killed.reason
    never = parse_qacct("10", "failed       26  : opening input/output file\nexit_status  0\n")
    assert (never.state, never.exit_code) == ("FAILED", None)          # no code of its own: none made up
    late = parse_qacct("11", "hostname node2\ncategory -l h_rt=60 -pe podrun 2\nfailed 100 : assumedly after job\n"
                             "exit_status 137\nru_wallclock 61s\n")
    assert (late.state, late.exit_code) == ("TIMEOUT", 137)
    univa = parse_qacct("12", "hostname g0001\nfailed 0\nexit_status 143\ndeleted_by qdel  me@es1\n")
    assert (univa.state, univa.exit_code) == ("CANCELLED", 143)
    two = "hostname node2\nfailed 0\nexit_status 0\n====\nhostname node3\nfailed 0\nexit_status 0\n"
    assert parse_qacct("13", two).nodes == "node3,node2"            # every host, the master task's (last) first


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


@pytest.mark.parametrize("cmd,scheduler,env,said", [
    ("status", "slurm", {"SLURM_CONF": "/nonexistent/slurm.conf"}, "SLURM_CONF=/nonexistent/slurm.conf cannot be read"),
    ("cancel", "slurm", {"SLURM_CONF": "/nonexistent/slurm.conf"}, "SLURM_CONF=/nonexistent/slurm.conf cannot be read"),
    ("status", "uge", {"SGE_ROOT": "/nonexistent", "SGE_CELL": "default"}, "'qstat -g t' exited"),
    ("cancel", "pbs", {"PATH": "/nonexistent"}, "'qstat' is not on PATH"),
])
def test_a_failing_client_is_an_error_not_a_state(tmp_path, cmd, scheduler, env, said):
    """The real Slurm and Grid Engine clients installed here, pointed at no cluster (and a PATH with no PBS
    client): status and cancel exit 1 with the client's own line and a hint, at once, instead of GONE and 0.
    A missing SLURM_CONF would make Slurm's clients retry reading it for 60 s each."""
    import time

    t0 = time.monotonic()
    p = cli([cmd, "987", "--scheduler", scheduler, "--json"], tmp_path, env=env)
    assert (p.returncode, p.stdout) == (1, ""), p.stdout + p.stderr
    assert said in p.stderr and "hint:" in p.stderr and "Traceback" not in p.stderr, p.stderr
    # Slurm's retries on a missing SLURM_CONF last 60 s: under that, none was waited on, however loaded the
    # machine (a bound nearer the command's own time would measure the machine, not podrun)
    assert time.monotonic() - t0 < 60


def test_unknown_job_ids_and_client_errors_by_the_clients_own_words():
    """What each client answers for a job id it does not know (the Slurm and Grid Engine lines as the real
    harnesses print them, tests/slurm and tests/uge; PBS's from its documentation: no PBS here) is GONE, and
    `podrun status JOB` of it UnknownJob (exit 2, naming it); any other failure is ClientFailed (exit 1)."""
    from podrun.jobscript.submit import ClientFailed, Pbs, Uge, UnknownJob, known_state

    class Answers(RecordingRunner):
        def run(self, argv, *, cwd=None, timeout=60.0):
            self.calls.append(list(argv))
            rc, out, err = self.answers[argv[0]]
            return Completed(tuple(argv), rc, out, err)

    unknown = [(Slurm, {"scontrol": (1, "", "slurm_load_jobs error: Invalid job id specified\n"),
                        "sacct": (1, "", "Slurm accounting storage is disabled\n")}),
               (Slurm, {"scontrol": (1, "", "slurm_load_jobs error: Invalid job id specified\n"),
                        "sacct": (0, "", "")}),
               (Uge, {"qstat": (0, QSTAT, ""), "qacct": (1, "", "error: job id 987 not found\n")}),
               (Pbs, {"qstat": (153, "", "qstat: Unknown Job Id 987.pbs01\n")})]
    for cls, answers in unknown:
        assert cls(Answers(answers)).state("987").state == "GONE"
        with pytest.raises(UnknownJob, match="job 987 is unknown to") as e:
            known_state(cls(Answers(answers)), "987", None)
        assert e.value.exit_code == 2
    failing = [(Slurm, {"scontrol": (1, "", "slurm_load_jobs error: Unable to contact slurm controller\n")}),
               (Slurm, {"scontrol": (1, "", "slurm_load_jobs error: Invalid job id specified\n"),
                        "sacct": (1, "", "sacct: error: Problem talking to the database: Connection refused\n")}),
               (Uge, {"qstat": (1, "", "error: commlib error: got select error (Connection refused)\n")}),
               (Uge, {"qstat": (0, "", ""), "qacct": (1, "", "error: can't open accounting file\n")}),
               (Pbs, {"qstat": (1, "", "Connection refused\nqstat: cannot connect to server pbs01 (errno=15010)\n")})]
    for cls, answers in failing:
        with pytest.raises(ClientFailed) as e:
            cls(Answers(answers)).state("987")
        last = [a for a in answers.values()][-1][2].strip().splitlines()[-1]
        assert e.value.exit_code == 1 and last in e.value.message and e.value.hint
    Pbs(Answers({"qdel": (35, "", "qdel: Job has finished 987.pbs01\n")})).cancel("987.pbs01")   # ended meanwhile
    with pytest.raises(UnknownJob, match="Unknown Job Id"):
        Pbs(Answers({"qdel": (153, "", "qdel: Unknown Job Id 987.pbs01\n")})).cancel("987.pbs01")
    with pytest.raises(UnknownJob, match="does not exist"):
        Uge(Answers({"qdel": (1, 'denied: job "987" does not exist\n', "")})).cancel("987")
    with pytest.raises(ClientFailed, match="Permission denied"):
        Uge(Answers({"qdel": (1, "", "error: Permission denied\n")})).cancel("987")


# `qstat -x -f` of one job as PBS Professional prints it (attribute = value, indented; no PBS here, so recorded
# from the qstat(1B) documentation's long format): job_state and, once finished, Exit_status
PBS_JOB = "Job Id: 987.pbs01\n    Job_Name = podrun-resnet50\n    job_state = {state}\n{more}    queue = rt_HF\n"


@pytest.mark.parametrize("native,exit_status,state,code", [
    ("Q", None, "PENDING", None), ("H", None, "PENDING", None), ("W", None, "PENDING", None),
    ("T", None, "PENDING", None), ("M", None, "PENDING", None), ("R", None, "RUNNING", None),
    ("B", None, "RUNNING", None), ("S", None, "SUSPENDED", None), ("U", None, "SUSPENDED", None),
    ("E", None, "COMPLETING", None), ("F", "0", "COMPLETED", 0), ("F", "3", "FAILED", 3),
    ("F", "271", "FAILED", 143), ("F", "-1", "FAILED", -1), ("F", None, "FAILED", None), ("X", "0", "COMPLETED", 0),
    ("Z", None, "UNKNOWN", None),
])
def test_pbs_job_states_one_to_one(native, exit_status, state, code):
    from podrun.jobscript.submit import PBS_STATES, parse_pbs

    more = f"    Exit_status = {exit_status}\n" if exit_status is not None else ""
    st = parse_pbs("987.pbs01", PBS_JOB.format(state=native, more=more))
    assert (st.state, st.exit_code, st.native) == (state, code, native)
    assert native == "Z" or native in PBS_STATES


@pytest.mark.parametrize("letters,state", [
    ("qw", "PENDING"), ("hqw", "PENDING"), ("hRwq", "PENDING"), ("Eqw", "PENDING"), ("r", "RUNNING"),
    ("t", "RUNNING"), ("Rr", "RUNNING"), ("Rt", "RUNNING"), ("s", "SUSPENDED"), ("ts", "SUSPENDED"),
    ("S", "SUSPENDED"), ("T", "SUSPENDED"), ("Rs", "SUSPENDED"), ("dr", "COMPLETING"), ("dt", "COMPLETING"),
    ("dRr", "COMPLETING"), ("ds", "COMPLETING"), ("x", "UNKNOWN"),
])
def test_grid_engine_state_letters_one_to_one(letters, state):
    from podrun.jobscript.submit import parse_qstat

    st = parse_qstat("7", f"      7 0.55500 podrun root  {letters}  11/23/2026 08:24:25 all.q@node2  3\n")
    assert (st.state, st.native, st.nodes) == (state, letters, "node2")
    assert (st.reason is None) == (letters in ("qw", "r", "Rr"))


def test_slurm_sacct_record_as_it_is():
    from podrun.jobscript.submit import parse_sacct

    st = parse_sacct("42", "42|CANCELLED by 0|0:15|node[1-3]\n")
    assert (st.state, st.exit_code, st.nodes, st.native, st.final) == ("CANCELLED", 143, "node[1-3]",
                                                                       "CANCELLED by 0", True)
    assert parse_sacct("42", "") is None
    odd = parse_sacct("42", "42|LAUNCH_FAILED|0:0|None assigned\n")
    assert odd.state == "LAUNCH_FAILED" and "not one podrun knows" in odd.reason and odd.nodes is None
