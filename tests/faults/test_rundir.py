"""The run directory under faults and hostile input: a full disk, an unwritable --runs-dir, a --run-id that
escapes or is reused, and who may read what is written there."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.launch.helpers import marker, podrun
from tests.ports import free_port

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB tmpfs, mounted for the test and unmounted after it."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    cp = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(mnt)], capture_output=True, text=True)
    if cp.returncode != 0:
        pytest.fail(f"a 64 KiB tmpfs is needed (mount -t tmpfs, as root): {cp.stderr.strip()}", pytrace=False)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def launch(runs, *args, port=None):
    return podrun("launch", "--devices-per-host", "1", "--master-port", str(port or free_port(2)),
                  "--runs-dir", str(runs), *args)


def test_disk_full_during_the_run_keeps_the_outcome_on_the_console(small_disk):
    """The worker's output fills the disk: podrun says so once, goes on, and the exit code and root cause
    still reach the console (and the exit status) although neither log nor summary.json can be written."""
    cp = launch(small_disk, "--", "sh", "-c",
                "i=0; while [ $i -lt 2000 ]; do echo line $i of a run filling its disk xxxxxxxxxxxxxxxxxx; "
                "i=$((i+1)); done; echo dying >&2; exit 3")
    assert cp.returncode == 3, cp.stderr
    assert "Traceback" not in cp.stderr, cp.stderr
    assert "instance-0.log: No space left on device; instance 0's output goes on to the console only" in cp.stderr
    assert "summary.json: No space left on device" in cp.stderr
    assert "root cause: instance 0 on localhost" in cp.stderr and "exited with code 3" in cp.stderr
    assert "line 1999 of a run" in cp.stdout and "dying" in cp.stderr     # the console got everything


def test_disk_full_before_the_start_is_exit_2_and_starts_nothing(small_disk):
    (small_disk / "filler").write_bytes(b"x" * 64 * 1024)  # tmpfs rounds to pages: fill what is left
    with open(small_disk / "filler2", "wb") as f:
        try:
            f.write(b"x" * 64 * 1024)
        except OSError:
            pass
    m = marker()
    cp = launch(small_disk, "--", "sh", "-c", f"echo started # {m}")
    assert cp.returncode == 2, cp.stderr
    assert "cannot write the run directory" in cp.stderr and "No space left on device" in cp.stderr, cp.stderr
    assert "nothing was started" in cp.stderr and "started" not in cp.stdout and "Traceback" not in cp.stderr


@pytest.mark.parametrize("runs_dir", ["/proc/x", "/dev/null/runs"])
def test_runs_dir_that_cannot_be_created_is_exit_2(runs_dir):
    cp = launch(runs_dir, "--", "echo", "started")
    assert cp.returncode == 2, cp.stderr
    assert f"cannot create the --runs-dir {runs_dir}:" in cp.stderr and "disk" in cp.stderr, cp.stderr
    assert "Traceback" not in cp.stderr and "started" not in cp.stdout


@pytest.mark.parametrize("run_id", ["../../escaped", "/tmp/abs", "a/b", "..", ".hidden", "x" * 129, "a b"])
def test_run_id_that_is_not_a_plain_name_is_refused(tmp_path, run_id):
    runs = tmp_path / "deep" / "runs"
    cp = launch(runs, "--run-id", run_id, "--", "echo", "started")
    assert cp.returncode == 2, cp.stderr
    assert "is not a plain name" in cp.stderr and "Traceback" not in cp.stderr, cp.stderr
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "deep").exists()
    assert not Path("/tmp/abs").exists() or not (Path("/tmp/abs") / "summary.json").exists()


def test_reused_run_id_is_refused_and_the_old_run_kept(tmp_path):
    runs = tmp_path / "runs"
    assert launch(runs, "--run-id", "r1", "--", "echo", "first").returncode == 0
    before = {f.name: f.read_bytes() for f in (runs / "r1").iterdir() if f.is_file()}
    cp = launch(runs, "--run-id", "r1", "--", "echo", "second")
    assert cp.returncode == 2 and "run id 'r1' is taken" in cp.stderr and "second" not in cp.stdout, cp.stderr
    assert {f.name: f.read_bytes() for f in (runs / "r1").iterdir() if f.is_file()} == before
    # a directory `podrun submit` prepared (job script, plan) is what the job's launch fills in
    (runs / "r2").mkdir()
    (runs / "r2" / "job.sh").write_text("#!/bin/sh\n")
    assert launch(runs, "--run-id", "r2", "--", "echo", "job").returncode == 0


SECRETS = {"DB_PASS": "pw-db-1", "GITHUB_PAT": "pat-2", "AUTH": "auth-3", "HF_TOKEN": "hf-4",
           "DATABASE_URL": "postgres://u:pw-url-5@h/db", "SENTRY_DSN": "https://dsn6key@o1.ingest.sentry.io/1",
           "SOME_URL": "https://0123456789abcdef0123456789abcdef@sentry.example/7",
           "NOTES": "ghp_abcdefghijklmnopqrstuvwxyz0123456789"}
HIDDEN = ["pw-db-1", "pat-2", "auth-3", "hf-4", "pw-url-5", "dsn6key", "0123456789abcdef0123456789abcdef",
          "ghp_abcdefghijklmnopqrstuvwxyz0123456789", "tok-8", "pw-arg-9", "pw-url-10"]


def _secret_args():
    env = [a for k, v in SECRETS.items() for a in ("--env", f"{k}={v}")]
    cmd = ["--", "sh", "-c", "echo ran", "x", "--token=tok-8", "--password", "pw-arg-9",
           "--db", "mysql://root:pw-url-10@db/x", "--lr", "0.1"]
    return env, cmd


def test_secrets_are_redacted_by_name_and_by_shape_in_the_run_record_and_dry_run(tmp_path):
    runs = tmp_path / "runs"
    env, cmd = _secret_args()
    dry = launch(runs, "--run-id", "d", "--dry-run", *env, *cmd)
    dry_json = launch(runs, "--run-id", "d", "--dry-run", "--json", *env, *cmd)
    assert dry.returncode == 0 and dry_json.returncode == 0, dry.stderr + dry_json.stderr
    cp = launch(runs, "--run-id", "r", *env, *cmd)
    assert cp.returncode == 0 and "ran" in cp.stdout, cp.stderr
    d = runs / "r"
    written = {f.name: f.read_text() for f in d.iterdir() if f.is_file()}
    for where, text in [("dry-run", dry.stdout), ("dry-run --json", dry_json.stdout), *written.items()]:
        leaked = [s for s in HIDDEN if s in text]
        assert not leaked, (where, leaked)
    assert "postgres://u:<redacted>@h/db" in written["env.json"] and "--lr 0.1" in written["command"]
    assert "--token=<redacted>" in written["command"] and "--password '<redacted>'" in written["command"]
    assert json.loads(written["summary.json"])["command"][-6:] == [
        "--password", "<redacted>", "--db", "mysql://root:<redacted>@db/x", "--lr", "0.1"]
    # what is not secret stays readable
    env_json = json.loads(written["env.json"])
    assert env_json["instances"][0]["workers"][0]["RANK"] == "0"


def test_run_dir_is_private(tmp_path):
    runs = tmp_path / "runs"
    os.umask(0o022)
    assert launch(runs, "--run-id", "p", "--env", "HF_TOKEN=x", "--", "echo", "hi").returncode == 0
    d = runs / "p"
    assert oct(d.stat().st_mode & 0o777) == "0o700"
    for f in d.rglob("*"):       # errors/ (TORCHELASTIC_ERROR_FILE's folder) is a directory: 0700 too
        assert oct(f.stat().st_mode & 0o777) == ("0o700" if f.is_dir() else "0o600"), f
    assert {f.name for f in d.iterdir()} >= {"plan.json", "command", "env.json", "instance-0.log", "summary.json"}


def test_job_script_holding_env_is_private(tmp_path):
    """`podrun script -o job.sh --env HF_TOKEN=...` writes the token (the job needs it): readable by its owner only."""
    with_env, without = tmp_path / "with.sh", tmp_path / "without.sh"
    base = ["script", "--scheduler", "slurm", "--cluster", "abci", "--nodes", "2", "resnet50", "--data",
            "/data/imagenet"]
    cp = podrun(*base, "--env", "HF_TOKEN=hf-secret", "-o", str(with_env))
    assert cp.returncode == 0, cp.stderr
    assert "hf-secret" in with_env.read_text() and oct(with_env.stat().st_mode & 0o777) == "0o600"
    cp = podrun(*base, "-o", str(without))
    assert cp.returncode == 0, cp.stderr
    assert oct(without.stat().st_mode & 0o777) == "0o755"


def test_redaction_rules_hide_secrets_and_keep_the_rest():
    from podrun.redaction import redact, redact_argv

    env = redact({"DB_PASS": "a", "GITHUB_PAT": "b", "AUTH": "c", "MY_API_KEY": "d", "OAUTH_CLIENT": "e",
                  "PATH": "/usr/bin", "GIT_AUTHOR_NAME": "me", "PASSTHROUGH": "1", "NCCL_DEBUG": "INFO",
                  "MASTER_ADDR": "h1", "DATABASE_URL": "postgres://u:pw@h/db", "PLAIN_URL": "https://h/x?a=b",
                  "GIT_URL": "ssh://git@github.com/x"})
    assert [k for k, v in env.items() if v == "<redacted>"] == ["DB_PASS", "GITHUB_PAT", "AUTH", "MY_API_KEY",
                                                                  "OAUTH_CLIENT"]
    assert env["DATABASE_URL"] == "postgres://u:<redacted>@h/db" and env["PLAIN_URL"] == "https://h/x?a=b"
    assert env["GIT_URL"] == "ssh://git@github.com/x" and env["PASSTHROUGH"] == "1"
    assert redact_argv(["train.py", "--auth-token", "t", "--epochs", "3", "--hf_token=x", "--lr", "-1",
                        "--password", "--verbose"]) == [
        "train.py", "--auth-token", "<redacted>", "--epochs", "3", "--hf_token=<redacted>", "--lr", "-1",
        "--password", "--verbose"]


def test_redact_record_hides_secrets_in_every_string_and_under_secret_keys():
    """summary.json, --json and control-socket replies pass through redact_record: nested strings are redacted
    by shape, a value under a secret-looking key is hidden, numbers and structure stay."""
    from podrun.redaction import escape_controls, redact_record, shown

    token = "hf_" + "a1" * 12
    rec = {"root_cause": {"error": {"message": f"RuntimeError: bad {token}"}, "exit_code": 1,
                          "last_lines": ["ok", "fetch https://u:pw-9@h/x"], "others": [{"last_lines": [token]}]},
           "api_key": "plain", "steps": [1, 2.5, None, True]}
    out = redact_record(rec)
    assert out["root_cause"]["error"]["message"] == "RuntimeError: bad <redacted>"
    assert out["root_cause"]["last_lines"] == ["ok", "fetch https://u:<redacted>@h/x"]
    assert out["root_cause"]["others"][0]["last_lines"] == ["<redacted>"] and out["api_key"] == "<redacted>"
    assert out["steps"] == [1, 2.5, None, True] and out["root_cause"]["exit_code"] == 1
    assert rec["root_cause"]["last_lines"][1].endswith("pw-9@h/x")          # the input is left as it was
    assert escape_controls("a\x1b[2J\tb\nc\r\x07\x9b") == "a\\x1b[2J\tb\nc\\x0d\\x07\\x9b"
    assert shown(f"\x1b]0;{token}\x07") == "\\x1b]0;<redacted>\\x07"
