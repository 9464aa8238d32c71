"""podrun's own text fitted to the terminal: wrapped at word boundaries to its width (an error's paragraph and hint,
--dry-run's comment lines), a path or command never broken; on a pipe or in a file each message keeps its line."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.harness.podrun_proc import PODRUN
from tests.launch.helpers import run_on_terminal

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _both(argv: list[str], cwd: Path) -> tuple[str, str]:
    """(what a terminal of 80 columns shows, what a pipe gets) for ``podrun ARGV``."""
    env = {**{k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "CI")}, "COLUMNS": "80",
           "TERM": "xterm-256color", "PYTHONPATH": str(ROOT)}
    _, shown = run_on_terminal([*PODRUN, *argv], env=env, cwd=cwd, timeout=120)
    piped = subprocess.run([*PODRUN, *argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    return ANSI.sub("", shown).replace("\r", ""), piped.stdout + piped.stderr


def test_an_error_and_a_dry_run_header_are_fitted_to_80_columns_and_piped_whole(tmp_path):
    shown, piped = _both(["plan", "--pod", "16", str(ROOT / "recipes" / "resnet50"), "--global-batch", "1000"],
                         tmp_path)
    assert piped.count("\n") == 2 and max(map(len, piped.splitlines())) > 80, piped    # a pipe: two whole lines
    assert max(map(len, shown.splitlines())) <= 80, shown
    assert shown.split() == piped.split(), (shown, piped)         # the same words, none broken

    runs = tmp_path / ("a-run-directory-whose-path-is-longer-than-a-line-of-the-terminal-" * 2)
    argv = ["launch", "--dry-run", "--runs-dir", str(runs), "--run-id", "r", "--nproc-per-node", "2",
            sys.executable]
    shown, piped = _both(argv, tmp_path)
    head = [line for line in shown.splitlines() if line.startswith("#")]
    assert head[0].startswith("# podrun launch --dry-run: run r via local, run dir"), head
    long_ones = [line for line in head if len(line) > 80]
    assert long_ones == [f"#   {runs / 'r'},"], long_ones          # the path alone on its line, whole
    piped_head = [line for line in piped.splitlines() if line.startswith("#")]
    assert " ".join(w for line in head for w in line.split() if w != "#") == \
        " ".join(w for line in piped_head for w in line.split() if w != "#")
    assert any(len(line) > 100 for line in piped_head), piped_head                    # a file: each on its line
