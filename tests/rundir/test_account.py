"""The run's account (podrun.rundir.account): every second in one category, the work redone after a failure, a
restart's cost, the queue; the progress line's goodput so far. The real runs' accounts are checked where the fault
tests make them (tests/rundir/account_check.py: a clean run in tests/elastic/test_elastic_ssh.py, a cut host in
tests/elastic/test_warm.py, a worker crash in tests/train/test_resume.py, a hang in tests/launch/test_hangs.py,
Ctrl-C in tests/faults/test_interrupt_and_stdin.py)."""
from __future__ import annotations

import pytest

from podrun.cli.render import ProgressView
from podrun.rundir.account import CATEGORIES, Account, Moments, account
from podrun.rundir.metrics import StepLog
from podrun.rundir.summary import Attempt, RunStatus


def _attempt(started: float, ended: float, ready_s: float, status: str, failed_at: float | None = None) -> Attempt:
    """An attempt as the account reads it: its moments and how it ended."""
    return Attempt(status=RunStatus(status), started=started, ended=ended, all_ready_s=ready_s, failed_at=failed_at)


def _log(attempts: list[tuple[float, int, int, float]], evals=(), saves=()) -> StepLog:
    """Each attempt (its runner's start time, first step, steps, seconds per step): its start record at that time,
    then one step record per step."""
    steps, step_s, starts = [], [], []
    for t0, first, n, dt in attempts:
        starts.append((t0, {"step": first - 1}))
        for i in range(n):
            steps.append((first + i, t0 + (i + 1) * dt))
            step_s.append((t0 + (i + 1) * dt, dt))
    return StepLog(tuple(steps), tuple(starts), None, tuple(step_s), tuple(evals), tuple(saves))


CLEAN = (Moments(100.0, 140.0), [_attempt(101.0, 139.0, 1.0, "ok")], _log([(110.0, 1, 20, 1.0)],
                                                                            evals=[(132.0, 2.0)], saves=[(120.5, 0.5)]))
# a worker crash at 20 s: the restart resumes from step 5 (its checkpoint), so steps 6..10 are done again
CRASH = (Moments(100.0, 160.0), [_attempt(101.0, 121.0, 1.0, "failed"), _attempt(123.0, 159.0, 2.0, "ok")],
         _log([(105.0, 1, 10, 1.0), (130.0, 6, 25, 1.0)]))
# submitted at 40, started by the scheduler at 90, podrun launch at 100
QUEUED = (Moments(100.0, 140.0, submitted=40.0, job_started=90.0), CLEAN[1], CLEAN[2])
HUNG = (Moments(100.0, 150.0), [_attempt(101.0, 149.0, 1.0, "hung")], _log([(110.0, 1, 10, 1.0)]))
INTERRUPTED = (Moments(100.0, 130.0), [_attempt(101.0, 129.0, 1.0, "interrupted")], _log([(110.0, 1, 10, 1.0)]))
PLAIN = (Moments(100.0, 110.0), [_attempt(100.5, 109.5, 0.5, "ok")], StepLog())
# a plain script that hung: silent from 110 (its hang's silence back from the detection), ended at 119
PLAIN_HUNG = (Moments(100.0, 120.0), [_attempt(101.0, 119.0, 1.0, "hung", failed_at=110.0)], StepLog())


@pytest.mark.parametrize("case,want", [
    (CLEAN, {"launch": 2.0, "startup": 8.0, "training": 19.5, "evaluation": 2.0, "checkpoint": 0.5, "idle": 8.0}),
    (CRASH, {"launch": 2.0, "startup": 3.0, "training": 5.0 + 25.0, "failure": 5.0 + 6.0 + 2.0 + 2.0 + 5.0,
             "idle": 4.0 + 1.0}),
    (QUEUED, {"queue": 50.0, "launch": 12.0, "startup": 8.0, "training": 19.5, "evaluation": 2.0,
              "checkpoint": 0.5, "idle": 8.0}),
    (HUNG, {"launch": 2.0, "startup": 8.0, "training": 10.0, "failure": 29.0, "idle": 1.0}),
    (INTERRUPTED, {"launch": 2.0, "startup": 8.0, "training": 10.0, "idle": 10.0}),
    (PLAIN, {"launch": 1.0, "startup": 8.5, "idle": 0.5}),
    (PLAIN_HUNG, {"launch": 2.0, "startup": 8.0, "failure": 9.0, "idle": 1.0}),
], ids=["clean", "crash-restart", "queued", "hung", "interrupted", "plain-command", "plain-command-hung"])
def test_every_second_of_the_wall_is_in_one_category(case, want):
    """The categories sum to the wall (submitted or launched to exit); the crash's redone steps (6..10), the gap
    to the restart and the restart's launch and start-up are failure; goodput is training / wall, per attempt
    too; and the record reads back as it was written."""
    moments, attempts, log = case
    acc = account(moments, attempts, log)
    secs = acc.run.seconds
    assert {c: round(secs[c], 6) for c in CATEGORIES} == {c: want.get(c, 0.0) for c in CATEGORIES}
    start = moments.submitted if moments.submitted is not None else moments.launch_start
    assert acc.run.wall_s == pytest.approx(moments.exit - start)
    assert acc.run.goodput == pytest.approx(secs["training"] / acc.run.wall_s)
    for a, part in zip(attempts, acc.attempts):
        assert part.wall_s == pytest.approx(a.ended - a.started)
    assert Account.from_dict(acc.to_dict()).to_dict() == acc.to_dict()


def test_the_crashed_attempts_own_account_names_its_lost_work():
    """Each attempt's account is its own: the crashed one's failure is its redone steps and its end; the restart's
    launch and start-up are its own there (in the run's whole they count as failure)."""
    acc = account(*CRASH)
    first, second = (p.seconds for p in acc.attempts)
    assert first["failure"] == pytest.approx(5.0 + 6.0) and first["training"] == pytest.approx(5.0)
    assert second["launch"] == pytest.approx(2.0) and second["startup"] == pytest.approx(5.0)
    assert acc.attempts[1].goodput == pytest.approx(25.0 / 36.0)


@pytest.mark.parametrize("bad", [None, [], {"seconds": "x"}, {"seconds": {"training": True}}])
def test_an_account_of_another_shape_reads_as_absent_or_empty(bad):
    got = Account.from_dict(bad)
    assert got is None or got.run.seconds == {}


def test_the_progress_line_says_the_goodput_so_far(capsys):
    """The share of the time since the launch that its reported steps took; a step redone after a restart counts
    once."""
    now = [0.0]
    view = ProgressView(live=False, clock=lambda: now[0])
    for step, t in ((1, 4.0), (2, 5.0), (3, 6.0), (2, 9.0), (3, 10.0)):
        now[0] = t
        view(0, "h", {"step": step, "total": 3, "epoch": 0, "step_seconds": 1.0})
    lines = [l for l in capsys.readouterr().err.splitlines() if l.startswith("podrun: progress:")]
    assert "goodput 25%" in lines[0] and "goodput 30%" in lines[-1], lines


def test_report_shows_the_account_as_a_table_in_json_and_as_a_bar(tmp_path):
    """`podrun report` of a run whose summary.json has an account: the table (each category that took time, its
    share, the goodput), the record in --json, and in the PNG a time line under the curves."""
    import json

    from podrun.rundir.report import figure
    from tests.harness.podrun_proc import run_podrun

    acc = account(*CRASH)
    (tmp_path / "summary.json").write_text(json.dumps({"run_id": "r", "status": "ok", "exit_code": 0,
                                                       "account": acc.to_dict()}))
    out = run_podrun("report", str(tmp_path), "--no-plot", check_exit=0).stdout
    assert "where the time went: 1 min, goodput 50.0% (training / wall)" in out, out
    assert "failure (detection, restart, work redone)" in out and "attempt 1: 36 s, goodput 69.4%" in out, out
    js = json.loads(run_podrun("report", str(tmp_path), "--json", check_exit=0).stdout)
    assert js["account"] == acc.to_dict()
    pytest.importorskip("matplotlib")
    records = [{"kind": "step", "step": s, "epoch": 0, "loss": 1.0 / s, "accuracy": 0.5, "images_per_sec": 10.0}
               for s in range(1, 4)]
    fig = figure(records, account=acc)
    assert any(a.get_title() == "the run's time line: goodput 50.0% of 1 min" for a in fig.axes), \
        [a.get_title() for a in fig.axes]


def test_a_submitted_runs_queue_is_from_its_submit_to_the_jobs_start(tmp_path, monkeypatch):
    """podrun launch in a job podrun submit made: job.json's submit moment to the job's start as Slurm gives it
    (SLURM_JOB_START_TIME) is queue, the job's start to podrun's own start is launch."""
    import time

    from podrun.rundir.job import JobRecord
    from podrun.launch.run import process_started, run_account
    from podrun.rundir.metrics import StepLog
    from podrun.rundir.summary import Attempt, RunStatus

    started = process_started()
    JobRecord(run_id="r", run_dir=str(tmp_path), scheduler="slurm", job_id="7", script="job.sh",
              submit_argv=("sbatch", "job.sh"), submitted_at=started - 100.0).save()
    monkeypatch.setenv("SLURM_JOB_START_TIME", str(int(started - 40.0)))
    now = time.time()
    acc = run_account(str(tmp_path), [Attempt(0, started=now, ended=now, all_ready_s=0.0, status=RunStatus.OK)], 0,
                      StepLog()).record()
    assert acc["seconds"]["queue"] == pytest.approx(60.0 - (started - 40.0) % 1, abs=0.01)
    assert acc["seconds"]["launch"] >= 40.0 - 1 and acc["wall_s"] == pytest.approx(time.time() - started + 100.0,
                                                                                     abs=0.5)
