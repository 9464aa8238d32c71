"""podrun submit / status / cancel on a real Grid Engine (sge_qmaster + 3 sge_execd in namespaces).

The job runs on the first host of its parallel environment; `podrun launch --transport ssh` in it
reads PE_HOSTFILE and starts one instance per host over ssh (the harness's keys and known hosts,
given with --ssh-config). podrun is run as ``<interpreter> -m podrun`` from the head node, with a
PATH that has no podrun, and the jobs inherit Grid Engine's bare PATH: the job script must name
the interpreter itself.
"""
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
from podrun.jobscript.submit import GONE_GRACE_S
from tests.engines.conftest import ALLREDUCE, assert_allreduce_job_done, results
from tests.harness.podrun_proc import PODRUN
from tests.launch.helpers import run_dir as only_run_dir      # these tests name their run dir run_dir
from tests.launch.helpers import wait_until

pytestmark = [pytest.mark.uge, pytest.mark.cluster]

BARE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# the job's `podrun launch`: this interpreter's podrun as `-m podrun launch` runs it, never one in the job's directory
EXEC = f"exec {shlex.join(pystart.safe(sys.executable, 'launch', module='podrun', root=None))} "


def podrun(ge, args, cwd, timeout=150):
    """`python -m podrun ARGS` on the head node (the submit host), with no podrun on PATH."""
    env = {**ge.env, "PATH": BARE_PATH}
    return ge.exec(ge.head, [*PODRUN, *args], cwd=str(cwd), env=env, timeout=timeout,
                   stdin=subprocess.DEVNULL)


def submit_args(ge, tmp_path, *extra, transport="ssh"):
    """`podrun submit` of a 3-host job; over ssh with the harness's ssh config, over mpirun with none (Grid
    Engine's qrsh starts the other hosts' share)."""
    args = ["submit", "--scheduler", "uge", "--pe", "podrun", "--nodes", "3", "--runs-dir", str(tmp_path / "runs")]
    args += ["--ssh-config", ge.ssh_config_path] if transport == "ssh" else ["--transport", transport]
    if os.environ.get("PYTHONPATH"):      # a checkout tested beside the installed podrun: the job imports it too
        args += ["--env", f"PYTHONPATH={os.environ['PYTHONPATH']}"]
    return args + list(extra)


def job_output(run_dir: Path, stream: str) -> str:
    """The job's stdout (stream "o") or stderr ("e"): Grid Engine writes JOBNAME.oJOBID / .eJOBID."""
    return "".join(p.read_text() for p in sorted(run_dir.glob(f"*.{stream}[0-9]*")))


def test_bare_path_has_no_podrun():
    assert not any(os.access(os.path.join(d, "podrun"), os.X_OK) for d in BARE_PATH.split(":"))


@pytest.mark.timeout(180)
def test_submit_three_hosts_allreduce_through_pe_hostfile(uge_cluster, tmp_path):
    """submit --wait: one instance per host from PE_HOSTFILE, a gloo all_reduce across the 3 hosts."""
    ge = uge_cluster
    p = podrun(ge, submit_args(ge, tmp_path, "--wait", "--", sys.executable, ALLREDUCE), tmp_path)
    run_dir = only_run_dir(tmp_path / "runs")
    assert p.returncode == 0, p.stdout + p.stderr + job_output(run_dir, "e")
    rec = json.loads((run_dir / "job.json").read_text())
    assert p.stdout.split()[0] == rec["job_id"] and rec["scheduler"] == "uge" and rec["nodes"] == 3
    assert rec["submit_argv"][:2] == ["qsub", "-terse"]
    script = (run_dir / "job.sh").read_text()
    assert "#$ -pe podrun 3" in script and f"{EXEC}--transport ssh" in script
    acct = ge.accounting(rec["job_id"])
    assert acct["granted_pe"] == "podrun" and acct["slots"] == "3" and acct["exit_status"] == "0", acct
    res = sorted(results(job_output(run_dir, "o")), key=lambda r: r["rank"])
    assert sorted(r["host"] for r in res) == ge.nodes, job_output(run_dir, "o") + job_output(run_dir, "e")
    assert res[0]["host"] == acct["hostname"]           # rank 0 on the job's first host (the master task)
    assert_allreduce_job_done(run_dir, res, "ssh", podrun(ge, ["status", str(run_dir), "--json"], tmp_path))


@pytest.mark.timeout(180)
def test_submit_over_mpirun_starts_every_host_through_grid_engine(uge_cluster, tmp_path):
    """--transport mpirun in a Grid Engine job with no ssh config: Open MPI starts its daemons on the other hosts
    with the job's `qrsh -inherit` (tight integration), so Grid Engine accounts a task of the job on each of them
    beside the master task (no ssh reaches the hosts: the job has no ssh config). The gloo all_reduce runs across
    the 3 hosts, rank 0 on the job's first host, and the mpirun used is the one beside the interpreter (the job's
    PATH is bare). Each host's agent joined the controller over TCP."""
    ge = uge_cluster
    p = podrun(ge, submit_args(ge, tmp_path, "--wait", "--", sys.executable, ALLREDUCE, transport="mpirun"), tmp_path)
    run_dir = only_run_dir(tmp_path / "runs")
    assert p.returncode == 0, p.stdout + p.stderr + job_output(run_dir, "e")
    script = (run_dir / "job.sh").read_text()
    assert f"{EXEC}--transport mpirun" in script and "ssh" not in script, script
    job = json.loads((run_dir / "job.json").read_text())["job_id"]
    res = sorted(results(job_output(run_dir, "o")), key=lambda r: r["rank"])
    assert sorted(r["host"] for r in res) == ge.nodes, job_output(run_dir, "o") + job_output(run_dir, "e")
    records = ge.accounting_records(job)
    master = [r for r in records if r.get("taskid") in ("undefined", None) and r["hostname"] == res[0]["host"]]
    assert sorted(r["hostname"] for r in records) == ge.nodes and master, records
    assert all(r["exit_status"] == "0" for r in records), records
    assert_allreduce_job_done(run_dir, res, "mpirun", podrun(ge, ["status", str(run_dir), "--json"], tmp_path))
    joins = json.loads((run_dir / "summary.json").read_text())["joins"]   # one agent a host, joined over TCP
    assert (joins["joined"], joins["refused"]) == (3, {}), joins


@pytest.mark.timeout(180)
def test_submit_wait_returns_failing_worker_exit_code(uge_cluster, tmp_path):
    """The worker of rank 1 exits 3 on another host: the job's exit status is 3 and --wait exits 3."""
    ge = uge_cluster
    p = podrun(ge, submit_args(ge, tmp_path, "--wait", "--env", "FAIL_RANK=1", "--env", "FAIL_CODE=3",
                               "--", sys.executable, ALLREDUCE), tmp_path)
    run_dir = only_run_dir(tmp_path / "runs")
    err = job_output(run_dir, "e")
    assert p.returncode == 3, p.stdout + p.stderr + err
    job = json.loads((run_dir / "job.json").read_text())["job_id"]
    acct = ge.accounting(job)
    assert acct["exit_status"] == "3", acct
    assert "root cause: instance 1 on " in err, err
    st = podrun(ge, ["status", job, "--scheduler", "uge", "--json"], tmp_path)
    assert st.returncode == 0, st.stderr
    assert json.loads(st.stdout)["state"] == "FAILED" and json.loads(st.stdout)["exit_code"] == 3


@pytest.mark.timeout(180)
@pytest.mark.parametrize("transport", ["ssh", "mpirun"])
def test_cancel_ends_running_job_everywhere(uge_cluster, tmp_path, transport):
    """podrun cancel (qdel) on a running 3-host job: the job ends and nothing of it is left on any host; over
    ssh the agents see their channel close, over mpirun Grid Engine ends the qrsh tasks itself."""
    ge = uge_cluster
    marker = f"podruncancel{os.getpid()}x{int(time.time())}"
    code = f"import time; tag='{marker}'; time.sleep(300)"
    p = podrun(ge, submit_args(ge, tmp_path, "--json", "--", sys.executable, "-c", code, transport=transport),
               tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    rec = json.loads(p.stdout)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if all(ge.processes(n, marker) for n in ge.nodes):
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"workers never started on every host: { {n: ge.processes(n, marker) for n in ge.nodes} }\n"
                    + job_output(Path(rec["run_dir"]), "e"))
    st = podrun(ge, ["status", rec["run_dir"], "--json"], tmp_path)
    assert st.returncode == 0 and json.loads(st.stdout)["state"] == "RUNNING", st.stdout + st.stderr
    # every host of the job (qstat -g t), the master's first
    assert sorted(json.loads(st.stdout)["nodes"].split(",")) == ge.nodes, st.stdout
    c = podrun(ge, ["cancel", rec["run_dir"], "--json"], tmp_path)
    assert c.returncode == 0, c.stdout + c.stderr
    out = json.loads(c.stdout)
    # qacct: exit_status 137 and failed "100 : assumedly after job", deleted: CANCELLED; GONE if the record lags
    assert out["was"] == "RUNNING" and out["final"] and out["state"] in ("CANCELLED", "GONE"), out
    deadline = time.monotonic() + GONE_GRACE_S
    while (after := json.loads(podrun(ge, ["status", rec["run_dir"], "--json"], tmp_path).stdout))["state"] == "GONE" \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    said = int(ge.accounting(rec["job_id"])["exit_status"].split()[0])      # qacct's, as it is (137)
    assert (after["state"], after["exit_code"]) == ("CANCELLED", said), after
    deadline = time.monotonic() + 60      # a hang guard: the other hosts' agents end theirs when their channel closes
    left = {}
    while time.monotonic() < deadline:
        left = {n: ge.processes(n, f"{marker}|podrun.host.agent|podrun launch|sge_shepherd|prted|qrsh")
                for n in ge.nodes}
        if not any(left.values()):
            break
        time.sleep(0.2)
    assert not any(left.values()), f"left on the hosts after cancel: {left}"
    assert rec["job_id"] not in ge.queued_jobs()


@pytest.mark.timeout(60)
def test_unknown_job_id_exit_2(uge_cluster, tmp_path):
    """A job id this cell never had (not in qstat; qacct: "job id N not found"; qdel: "does not exist"): status
    and cancel exit 2 naming it; the same on a cell where no job has ended yet (qacct: no accounting file),
    which is not a failing client."""
    accounting = uge_cluster.sge_root / "podrun" / "common" / "accounting"
    aside = accounting.with_name("accounting.aside")
    for fresh_cell in (False, True):
        if fresh_cell and accounting.exists():
            accounting.rename(aside)
        try:
            for cmd in ("status", "cancel"):
                p = podrun(uge_cluster, [cmd, "987654", "--scheduler", "uge", "--json"], tmp_path)
                assert (p.returncode, p.stdout) == (2, ""), p.stdout + p.stderr
                assert "job 987654 is unknown to uge" in p.stderr and "Traceback" not in p.stderr, p.stderr
        finally:
            if aside.exists():
                aside.rename(accounting)


@pytest.mark.timeout(180)
def test_status_of_pending_and_running_jobs(uge_cluster, tmp_path):
    """The real qstat: a job that cannot be placed (4 hosts asked of 3) is PENDING; a running one is
    RUNNING on its master host; podrun cancel ends both."""
    ge = uge_cluster
    pending = ge.qsub(["-pe", "podrun", "4", "-o", "/dev/null", "-j", "y", "-b", "y", "/bin/true"])
    running = ge.qsub(["-pe", "podrun", "1", "-o", "/dev/null", "-j", "y", "-b", "y", "/bin/sleep", "600"])

    def status(job):
        p = podrun(ge, ["status", job, "--scheduler", "uge", "--json"], tmp_path)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    # qw, then t (transferring, which podrun reads as RUNNING), then r: waited for with the real qstat (a podrun
    # call a poll would cost seconds of CPU on a loaded machine), then podrun's status of each job once
    def letters(job):
        return next((p[4] for p in map(str.split, ge.run(["qstat"]).stdout.splitlines()) if p[:1] == [job]
                     and len(p) > 4), None)

    assert wait_until(lambda: letters(running) == "r", 90, 0.3), ge.run(["qstat"]).stdout
    info = status(running)
    assert info["state"] == "RUNNING" and info["native"] == "r" and info["nodes"] in ge.nodes, info
    t0 = time.monotonic()
    info = status(pending)
    one_call = time.monotonic() - t0        # a podrun call that asks the qmaster once, on this machine's load
    assert (info["state"], info["native"]) == ("PENDING", "qw"), info
    for job, was in ((pending, "PENDING"), (running, "RUNNING")):
        t0 = time.monotonic()
        c = podrun(ge, ["cancel", job, "--scheduler", "uge", "--json"], tmp_path)
        assert c.returncode == 0, c.stdout + c.stderr
        out = json.loads(c.stdout)
        assert out["was"] == was and out["final"], out
        # a deleted pending job gets no accounting record: cancel must not wait for one (it would wait
        # GONE_GRACE_S for it beyond what a podrun call costs here, the bound: like with like under load)
        if was == "PENDING":
            took = time.monotonic() - t0
            assert took < one_call + GONE_GRACE_S, f"cancel of a {was} job took {took:.1f} s ({one_call:.1f} s a call)"
    assert pending not in ge.queued_jobs() and running not in ge.queued_jobs()


# -- the golden scripts through qsub's own parser ------------------------------------------------------------

GOLDEN = Path(__file__).resolve().parents[1] / "jobscript" / "golden"
# ABCI's resources, requestable in this cell as in ABCI's (they match no host here: a job asking for them is
# accepted, held, and never scheduled)
ABCI_COMPLEXES = "rt_F rt_F INT <= YES NO 0 0\nUSE_SSH use_ssh BOOL == YES NO 0 0\n"


def _ge_directives(text: str) -> list[list[str]]:
    """The script's ``#$`` lines, split as qsub splits them."""
    return [line[2:].split() for line in text.splitlines() if line.startswith("#$")]


def _qstat_j(ge, job: str) -> dict[str, str]:
    out = {}
    for line in ge.run(["qstat", "-j", job]).stdout.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(p.stem for p in GOLDEN.glob("uge_*.sh")))
def test_golden_script_is_read_by_the_real_qsub(uge_cluster, name):
    """Each golden Grid Engine script (tests/jobscript/golden) through the real qsub: submitted held
    (-h, no verification: ABCI's rt_F matches no host here), the job the qmaster holds has every directive's
    value: name, shell, working directory, resources (h_rt in seconds), queue, parallel environment; a copy
    with a misspelt directive is refused by qsub's script reader, so the parser is really in play.

    Not checked here: a parallel environment other than the cell's "podrun" (uge_pe.sh asks for "mpi") is
    replaced on qsub's command line, which overrides the script's -pe (the directive is still read), and the
    ABCI resources are defined in this cell as requestable only, so no check is made that a host offers them."""
    ge = uge_cluster
    if "rt_F" not in ge.run(["qconf", "-sc"]).stdout:
        complexes = ge.jobs_dir / "complexes"
        complexes.write_text(ge.run(["qconf", "-sc"]).stdout + ABCI_COMPLEXES)
        ge.run(["qconf", "-Mc", str(complexes)])
    text = (GOLDEN / f"{name}.sh").read_text()
    directives = _ge_directives(text)
    assert directives, f"{name}: no #$ lines"
    script = ge.jobs_dir / f"golden-{name}.sh"
    script.write_text(text)
    extra = []
    pe = next((d for d in directives if d[0] == "-pe"), None)
    if pe is not None and pe[1] != "podrun":
        extra = ["-pe", "podrun", pe[2]]
    job = ge.qsub(["-h", "-w", "n", *extra, str(script)], cwd=str(ge.jobs_dir))
    try:
        info = _qstat_j(ge, job)
    finally:
        ge.run(["qdel", job], check=False)
    resources = dict(kv.split("=", 1) for kv in info.get("hard resource_list", "").split(",") if kv)
    for d in directives:
        if d[0] == "-N":
            assert info["job_name"] == d[1], info
        elif d[0] == "-S":
            assert info["shell_list"] == f"NONE:{d[1]}", info
        elif d[0] == "-cwd":
            assert info["cwd"] == str(ge.jobs_dir), info
        elif d[0] == "-q":
            assert info["hard_queue_list"] == d[1], info
        elif d[0] == "-pe":
            assert info["parallel environment"] == f"podrun range: {d[2]}", info
        elif d[0] == "-l":
            key, value = d[1].split("=", 1)
            if key == "h_rt":
                h, m, s = (int(x) for x in value.split(":"))
                value = str(3600 * h + 60 * m + s)
            assert resources.get(key) == value, (d, resources)
        elif d[0] == "-v":          # ABCI's -v SSH_PORT=2299: in the job's environment list
            assert set(d[1].split(",")) <= set(info.get("env_list", "").split(",")), info
        else:
            raise AssertionError(f"{name}: directive {d} is not checked here: add its check")
    bad = ge.jobs_dir / f"golden-{name}-misspelt.sh"
    bad.write_text(text.replace("#$ -cwd", "#$ -cwdd"))
    cp = ge.run(["qsub", "-h", "-w", "n", *extra, str(bad)], check=False, cwd=str(ge.jobs_dir))
    assert cp.returncode != 0 and "-cwdd" in cp.stdout + cp.stderr, cp


@pytest.mark.timeout(180)
def test_submit_ipu_pod_job_starts_poprun_in_the_allocation(uge_cluster, tmp_path):
    """An IPU-POD job (`--cluster ipu-pod64`) end to end on the real Grid Engine with the STAND-IN poprun on the
    job's PATH (the script exports it, as a site's module would): no --transport, the V-IPU server and partition
    passed, one instance per host of PE_HOSTFILE; exit 0."""
    from tests.slurm.test_submit_slurm import POPRUN_WORKER, assert_ipu_pod_job_ran, stand_in_poprun

    ge = uge_cluster
    bin_dir, record = stand_in_poprun(tmp_path), tmp_path / "poprun.json"
    args = ["submit", "--scheduler", "uge", "--pe", "podrun", "--cluster", "ipu-pod64", "--nodes", "3", "--wait",
            "--vipu-server-host", "vipu-ctrl", "--vipu-partition", "p-job", "--runs-dir", str(tmp_path / "runs"),
            "--env", f"PATH={bin_dir}:{BARE_PATH}", "--env", f"FAKE_POPRUN_RECORD={record}"]
    if os.environ.get("PYTHONPATH"):
        args += ["--env", f"PYTHONPATH={os.environ['PYTHONPATH']}"]
    p = podrun(ge, [*args, "--", sys.executable, "-c", POPRUN_WORKER], tmp_path)
    run_dir = only_run_dir(tmp_path / "runs")
    assert p.returncode == 0, p.stdout + p.stderr + job_output(run_dir, "e")
    argv = json.loads(record.read_text())["argv"]
    hosts = next(a for a in argv if a.startswith("--host=")).split("=", 1)[1].split(",")   # PE_HOSTFILE's order
    assert sorted(hosts) == ge.nodes, argv
    assert_ipu_pod_job_ran(run_dir, record, hosts, job_output(run_dir, "o"))


@pytest.mark.timeout(60)
def test_a_refused_submit_leaves_nothing_behind(uge_cluster, tmp_path):
    """qsub refuses the job (a queue this cell does not have): exit 2 with qsub's own line, and neither the run
    directory nor the --runs-dir made for it is left; `--scheduler sge` is Grid Engine."""
    p = podrun(uge_cluster, ["submit", "--scheduler", "sge", "--pe", "podrun", "--nodes", "1", "--queue", "nosuch.q",
                             "--runs-dir", str(tmp_path / "runs"), "--", "true"], tmp_path)
    assert p.returncode == 2 and "qsub failed" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "runs").exists()
