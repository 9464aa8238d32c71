"""The console during a run (issue 17 item 4): a live rich progress line on a terminal (a real pty), plain
periodic lines elsewhere, numbers rounded for people, one line per run whatever the number of ranks."""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from tests.launch.helpers import PODRUN, SCRIPTS, podrun, run_on_terminal

pytestmark = pytest.mark.timeout(150)
PROGRESS = str(SCRIPTS / "progress.py")
ROOT = Path(__file__).resolve().parents[2]
LONG_FLOAT = re.compile(r"\d+\.\d{4,}")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _plain_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "CI")}


def test_plain_lines_when_stdout_is_not_a_terminal(tmp_path):
    """Piped: "podrun: progress:" lines (the first, one per epoch, the last), rounded; one line per run for
    2 ranks; the end line rounded too."""
    cp = podrun("launch", "--devices-per-host", "2", "--runs-dir", str(tmp_path / "runs"), "--",
                sys.executable, PROGRESS, "6", "0.3", timeout=90)
    assert cp.returncode == 0, cp.stderr
    lines = [l for l in cp.stderr.splitlines() if l.startswith("podrun: progress:")]
    assert [l.split(" · ")[0] for l in lines] == ["podrun: progress: step 1/6 (17%)",
                                                  "podrun: progress: step 4/6 (67%)",
                                                  "podrun: progress: step 6/6 (100%)"], cp.stderr
    assert "epoch 1 · loss 0.167 · 1,235 img/s" in lines[-1]
    end = [l for l in cp.stderr.splitlines() if re.match(r"podrun: 6 steps in [0-9.]+ s", l)]
    assert end and end[0].endswith("1,235 img/s, last loss 0.167"), cp.stderr
    for line in cp.stderr.splitlines():
        if line.startswith("podrun:"):
            assert not LONG_FLOAT.search(line), line


def test_json_gives_plain_lines_on_stderr_and_the_summary_on_stdout(tmp_path):
    cp = podrun("launch", "--json", "--devices-per-host", "1", "--runs-dir", str(tmp_path / "runs"), "--",
                sys.executable, PROGRESS, "3", "0.1", timeout=90)
    assert cp.returncode == 0, cp.stderr
    assert "podrun: progress: step 3/3 (100%)" in cp.stderr
    assert json.loads(cp.stdout)["exit_code"] == 0          # stdout holds the summary only


def _run_in_pty(args: list[str], env: dict, timeout: float) -> tuple[int, str]:
    """Run podrun with stdout and stderr on a real pseudo-terminal; (exit code, everything it wrote)."""
    return run_on_terminal([*PODRUN, *args], env=env, timeout=timeout)


def test_a_live_progress_line_on_a_terminal_and_the_rounded_end_line(tmp_path):
    """On a pty (no NO_COLOR, no CI): rich draws the progress line in place (cursor moves, no "podrun:
    progress:" lines), the workers' output still shows, and the end line is rounded."""
    env = {**_plain_env(), "TERM": "xterm-256color", "COLUMNS": "200"}
    rc, out = _run_in_pty(["launch", "--devices-per-host", "2", "--runs-dir", str(tmp_path / "runs"), "--",
                           sys.executable, PROGRESS, "8", "0.4"], env, 120)
    assert rc == 0, out
    text = ANSI.sub("", out)
    assert "podrun: progress:" not in text, out
    assert re.search(r"step [1-8]/8 \(\d+%\) · epoch [01] · loss [0-9.]+ · 1,235 img/s · goodput \d+% · "
                     r"[0-9.]+ s elapsed", text), out
    assert "\x1b[" in out and ("\x1b[2K" in out or "\x1b[1A" in out or "\r" in out), repr(out[-500:])
    assert "done" in text
    end = re.search(r"podrun: 8 steps in ([0-9.]+) s, 1,235 img/s, last loss 0\.125", text)
    assert end, text
    assert not LONG_FLOAT.search(end.group(0))


def test_no_color_gives_plain_lines_even_on_a_terminal(tmp_path):
    env = {**_plain_env(), "TERM": "xterm-256color", "NO_COLOR": "1"}
    rc, out = _run_in_pty(["launch", "--devices-per-host", "1", "--runs-dir", str(tmp_path / "runs"), "--",
                           sys.executable, PROGRESS, "3", "0.1"], env, 90)
    assert rc == 0, out
    assert "podrun: progress: step 3/3 (100%)" in out


@pytest.mark.torch
def test_a_recipe_reports_its_steps_to_the_console_and_ends_with_one_block_the_report_and_png_agree_with(tmp_path):
    """The recipe runner reports through podrun.runtime: the console shows its steps, rounded. Its end is one block
    (steps, whole-run throughput, final loss and accuracy, checkpoints, the run directory once in the report
    command); the runner's own `run end:` and `done:` lines are in the instance log only; `podrun report` and the
    PNG's title say the same figures."""
    from podrun.rundir.report import read_run, summarize, title_of

    cp = podrun("launch", "--devices-per-host", "2", "--global-batch", "8", "--runs-dir", str(tmp_path / "runs"),
                "--run-id", "r", str(ROOT / "recipes" / "resnet18_cifar10"), "--data", "synthetic", "--steps", "4",
                "--image-size", "8", "--synthetic-size", "64", "--checkpoint-every", "2", timeout=140)
    assert cp.returncode == 0, cp.stderr
    assert re.search(r"podrun: progress: step 4/4 \(100%\) · epoch 0 · loss [0-9.]+ · [0-9.,]+ img/s", cp.stderr), \
        cp.stderr
    run = tmp_path / "runs" / "r"
    lines = cp.stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("podrun: run r finished: exit 0; "))
    block = lines[start:]
    assert re.fullmatch(r"podrun: run r finished: exit 0; 4 steps \(1 epoch\) in [0-9.]+ s after start-up", block[0]), \
        block
    figures = block[1].strip()
    assert re.fullmatch(r"[0-9.,]+ img/s over the run, train loss \d\.\d{4} \(mean of the last 4 steps\), "
                        r"val accuracy \d\.\d{4} \(best \d\.\d{4}\)", figures), block
    assert block[2].strip().startswith("2 checkpoint(s) (") and block[2].endswith(
        "in checkpoints/: ckpt-000000002.pt, ckpt-000000004.pt"), block
    assert block[3].strip().startswith(f"report: podrun report {run} "), block
    assert len(block) == 4 and "\n".join(block).count(str(run)) == 1, block
    assert not re.search(r"podrun: 4 steps in", cp.stderr), cp.stderr        # no second end line
    assert "run end:" not in cp.stdout and "done: 4 steps" not in cp.stdout, cp.stdout
    log = (run / "instance-0.log").read_text()
    assert "run end: step=4" in log and "done: 4 steps" in log, log[-2000:]
    # the report and the PNG's title: the same figures, in the same words
    report = podrun("report", "--no-plot", str(run), timeout=60)
    assert report.returncode == 0 and f"  {figures}\n" in report.stdout, (figures, report.stdout)
    rec = read_run(run)
    assert figures in title_of(rec, summarize(rec.records)), title_of(rec, summarize(rec.records))
