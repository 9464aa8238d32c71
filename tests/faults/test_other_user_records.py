"""The records podrun runs or writes again, as a second local user (`nobody`) would attack them: a launch.json it
planted is never run by `podrun resume`, a job script never goes through its link nor into its file nor to its open
handle, a --runs-dir of its own is refused by submit; and a controller killed with -9 does not keep its run from
being resumed (its control.pid is a dead controller's)."""
from __future__ import annotations

import json
import os
import shlex
import signal
import stat
import subprocess
from pathlib import Path

import pytest

from tests.attacker import as_nobody, popen_as_nobody, shared  # noqa: F401
from tests.launch.helpers import local_pids, marker, podrun, podrun_popen, wait_until
from tests.ports import free_port

pytestmark = pytest.mark.timeout(180)
SECRET = "s3cret-" + marker()


def refused(cp, *words: str) -> None:
    """Exit 2, one error line naming ``words``, no traceback."""
    assert cp.returncode == 2, cp.stdout + cp.stderr
    assert "Traceback" not in cp.stderr, cp.stderr
    errors = [line for line in cp.stderr.splitlines() if line.startswith("podrun: error: ")]
    assert len(errors) == 1 and all(w in errors[0] for w in words), cp.stderr


def test_resume_never_runs_a_launch_record_of_another_user(shared, tmp_path):  # noqa: F811
    """nobody plants ./r1/launch.json and ./runs/r1/launch.json (0600 in 0700 directories of its own) whose argv
    names a fresh runs dir, so that a recorded --runs-dir coming last would pass launch's owner check; whichever way
    the run is named, nothing runs."""
    ran = shared / "ran"
    record = json.dumps({"argv": ["--runs-dir", str(shared / "fresh"), "--nproc-per-node", "1", "--",
                                  "sh", "-c", f"id > {ran}"], "cwd": str(shared), "redacted": []})
    as_nobody(f"cd {shared} && mkdir -m 700 r1 && mkdir -m 755 runs && mkdir -m 700 runs/r1 && "
              f"printf %s {shlex.quote(record)} > r1/launch.json && cp r1/launch.json runs/r1/ && "
              "chmod 600 r1/launch.json runs/r1/launch.json")
    for args, cwd in ((["resume", "r1"], shared),                          # ./r1 is not looked at; runs/ is nobody's
                      (["launch", "--resume", "r1"], shared),
                      (["resume", "r1", "--runs-dir", str(shared)], tmp_path),   # the run dir is nobody's
                      (["resume", str(shared / "r1")], tmp_path)):             # a path: it must be ours
        refused(podrun(*args, cwd=str(cwd)), "nobody")
    assert not ran.exists() and not (shared / "fresh").exists()


def test_a_recorded_run_directory_never_overrides_the_resumes(tmp_path):
    """Our own launch.json naming another runs dir and run id (both spellings): the resume runs into its own."""
    run_dir = tmp_path / "runs" / "r2"
    run_dir.mkdir(parents=True, mode=0o700)
    (run_dir / "launch.json").write_text(json.dumps({"argv": [
        "--runs-dir", str(tmp_path / "elsewhere"), "--run-id=other", "--nproc-per-node", "1", "--", "echo", "hi"],
        "cwd": str(tmp_path), "redacted": []}))
    cp = podrun("resume", "r2", "--runs-dir", str(tmp_path / "runs"), "--dry-run", cwd="/")
    assert cp.returncode == 0, cp.stderr
    assert f"run r2 via local, run dir {run_dir}," in cp.stdout, cp.stdout
    assert "elsewhere" not in cp.stdout + cp.stderr and "--run-id=other" not in cp.stderr, cp.stderr


def test_a_controller_killed_with_9_leaves_a_run_that_resumes(tmp_path):
    """kill -9 of the controller of a run without warm restarts leaves its control.pid; `podrun resume` replaces
    that dead controller's record (and refuses, naming it, a record whose process lives)."""
    runs, go, word = tmp_path / "runs", tmp_path / "go", marker()
    run_dir = runs / "k"
    p = podrun_popen("launch", "--runs-dir", str(runs), "--run-id", "k", "--nproc-per-node", "1", "--master-port",
                     str(free_port(2)), "--hang-timeout", "off", "--", "sh", "-c", f"[ -e {go} ] || sleep 300", word,
                     cwd=str(tmp_path))
    try:     # the controller, its agent and the worker each name the word
        assert wait_until(lambda: (run_dir / "control.pid").exists() and len(local_pids(word)) >= 3, 60), \
            "the run's worker never started"
        os.kill(p.pid, signal.SIGKILL)
        p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert wait_until(lambda: not local_pids(word), 30), "the dead controller's agent and worker never ended"
    dead = (run_dir / "control.pid").read_bytes()      # the record the controller left: the fault
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    (run_dir / "control.pid").write_text(f"{boot} {os.getpid()}\n")     # a live process (this one) as controller
    refused(podrun("resume", "k", "--runs-dir", str(runs), cwd="/"), f"pid {os.getpid()}", "alive")
    (run_dir / "control.pid").write_bytes(dead)
    go.touch()
    cp = podrun("resume", "k", "--runs-dir", str(runs), cwd="/", timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert not (run_dir / "control.pid").exists()
    from podrun.wire.owner import owner_alive, record_text

    (run_dir / "control.pid").write_text(record_text())
    assert owner_alive(str(run_dir)) is True
    (run_dir / "control.pid").write_text(f"{boot} {os.getpid()} 1\n")    # this pid, another start: a reused pid
    assert owner_alive(str(run_dir)) is False


def test_a_job_script_never_reaches_the_other_users_link_file_or_handle(shared, tmp_path):  # noqa: F811
    """`podrun script -o PATH --env K=SECRET` in a shared directory: a link nobody planted to a file of ours is
    refused (the file unchanged), a file nobody made there is refused (the secret lands nowhere of nobody's), and a
    handle nobody holds open on our earlier job.sh reads no secret: the script is a new file (a new inode), 0600."""
    def script(path: Path, *env: str):
        return podrun("script", "--scheduler", "slurm", "--nodes", "1", "--devices-per-host", "1", "-o", str(path),
                      *env, "--", "echo", "hi")

    victim = tmp_path / "victim"
    victim.write_text("ours\n")
    as_nobody(f"ln -s {victim} {shared}/link.sh && : > {shared}/pre.sh")
    refused(script(shared / "link.sh", "--env", f"K={SECRET}"), str(shared / "link.sh"), "symbolic link")
    assert victim.read_text() == "ours\n" and (shared / "link.sh").is_symlink()
    refused(script(shared / "pre.sh", "--env", f"K={SECRET}"), str(shared / "pre.sh"), "nobody")
    assert (shared / "pre.sh").read_text() == ""

    job = shared / "job.sh"
    assert script(job).returncode == 0 and stat.S_IMODE(job.stat().st_mode) == 0o755
    before = job.stat().st_ino
    reader = popen_as_nobody(["sh", "-c", f"exec 3< {job}; echo held; read go; cat <&3"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline() == "held\n"
        cp = script(job, "--env", f"K={SECRET}")
        assert cp.returncode == 0, cp.stderr
        out, _ = reader.communicate("go\n", timeout=30)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    assert "echo hi" in out and SECRET not in out, out
    st = job.stat()
    assert st.st_ino != before and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    assert SECRET in job.read_text()
    leaked = [f.name for f in shared.iterdir() if f.is_file() and not f.is_symlink() and f != job
              and SECRET in f.read_text(errors="replace")]
    assert leaked == [], leaked


def test_submit_refuses_a_runs_dir_of_another_user_and_writes_its_run_private(shared, tmp_path):  # noqa: F811
    """submit checks --runs-dir as launch does; its run dir is 0700 with job.sh and plan.json 0600; a submission
    the scheduler refuses leaves no run directory."""
    theirs = shared / "runs"
    as_nobody(f"mkdir -m 755 {theirs}")
    submit = ("submit", "--scheduler", "slurm", "--nodes", "1", "--env", f"K={SECRET}")
    refused(podrun(*submit, "--dry-run", "--runs-dir", str(theirs), "--", "echo", "hi"), str(theirs), "nobody")
    assert os.listdir(theirs) == []

    cp = podrun(*submit, "--dry-run", "--json", "--runs-dir", str(tmp_path / "runs"), "--", "echo", "hi")
    assert cp.returncode == 0, cp.stderr
    run_dir = Path(json.loads(cp.stdout)["run_dir"])
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (run_dir, run_dir / "job.sh", run_dir / "plan.json")}
    assert modes == {run_dir.name: 0o700, "job.sh": 0o600, "plan.json": 0o600}, modes

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: Batch job submission failed: Invalid account' >&2\n"
                                 "exit 1\n")
    (fake / "sbatch").chmod(0o755)
    cp = podrun(*submit, "--runs-dir", str(tmp_path / "refused"), "--", "echo", "hi",
                env={"PATH": f"{fake}:{os.environ['PATH']}"})
    refused(cp, "Invalid account")
    assert not (tmp_path / "refused").exists()      # nothing is left behind, not even the --runs-dir it made
