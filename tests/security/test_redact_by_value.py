"""Redaction by value: the values of secret-named --env variables, and of bare `--env NAME` taken from podrun's own
environment, and the run's own snapshot key, are hidden wherever podrun records or shows text, whatever text holds
them (a worker's failing line, the worker command), beside the name and shape rules."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.harness.podrun_proc import run_podrun, with_env

pytestmark = pytest.mark.timeout(180)

SECRET = "hunter2-xyz"           # the value of a secret-named --env variable
FROM_ENV = "q7-from-env-v4l"     # the value of a plain-named --env taken from podrun's environment
WORKER = """import os, sys
print(f"key {os.environ['PODRUN_SNAPSHOT_KEY']}", flush=True)
print(f"password {os.environ['DB_SECRET']} rejected, then {os.environ['PLAIN']}", flush=True)
sys.exit(3)
"""


def test_known_secret_values_are_redacted_in_every_record_and_console_line(tmp_path):
    (tmp_path / "fail.py").write_text(WORKER)
    runs = tmp_path / "runs"
    cp = run_podrun("launch", "--runs-dir", runs, "--json", "--max-restarts", "1", "--no-warm", "--env",
                    f"DB_SECRET={SECRET}", "--env", "PLAIN", "--", sys.executable, "fail.py", "--note", SECRET,
                    f"--other={FROM_ENV}", cwd=tmp_path, timeout=120, stdin=subprocess.DEVNULL,
                    env=with_env(PLAIN=FROM_ENV))
    assert cp.returncode == 3, cp.stderr
    record = json.loads(cp.stdout)
    cause = record["root_cause"]
    assert cause["last_lines"] == ["key <redacted>", "password <redacted> rejected, then <redacted>"], cause
    assert record["command"] == [sys.executable, "fail.py", "--note", "<redacted>", "--other=<redacted>"]
    run_dir = runs / record["run_id"]
    # the workers' own output streams as it is (documented); every line podrun writes itself is redacted
    streamed = [line for line in cp.stderr.splitlines() if re.match(r"\[\d", line)]
    assert any(SECRET in line for line in streamed), cp.stderr
    keys = {m[1] for line in streamed for m in [re.search(r"\bkey ([0-9a-f]{64})$", line)] if m}
    assert len(keys) == 1, cp.stderr           # the run's key, the same on its restart
    console = "\n".join(line for line in cp.stderr.splitlines() if line not in streamed)
    assert "root cause" in console and "password <redacted> rejected" in console, console
    records = {p.name: p.read_text() for p in run_dir.rglob("*") if p.is_file() and not p.name.startswith(
        "instance-")}
    assert {"summary.json", "env.json", "command"} <= set(records), sorted(records)
    for where, text in {**records, "--json": cp.stdout, "console": console}.items():
        assert not any(v in text for v in (SECRET, FROM_ENV, *keys)), (where, text)
    assert json.loads(records["summary.json"])["root_cause"]["last_lines"] == cause["last_lines"]
