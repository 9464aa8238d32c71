"""podrun launch on this machine (local transport): real processes, real gloo all_reduce, real signals."""
from __future__ import annotations

import json
import re
import signal
import sys
from pathlib import Path

import pytest

from tests.ports import free_port
from tests.launch.helpers import (ALLREDUCE, end, local_pids, marker, podrun, podrun_copies, podrun_popen, run_dir,
                                  summary, wait_output, wait_until)

pytestmark = pytest.mark.timeout(120)


@pytest.mark.torch
def test_torchrun_script_runs_unchanged_with_gloo_all_reduce_and_env_contract(tmp_path):
    """3 local workers: a torchrun-style script's all_reduce gives 1+2+3; every contract variable is set."""
    dump = tmp_path / "env"
    dump.mkdir()
    port = free_port()
    cp = podrun("launch", "--devices-per-host", "3", "--runs-dir", str(tmp_path / "runs"), "--master-port", str(port),
                "--", sys.executable, ALLREDUCE, "--dump", str(dump))
    assert cp.returncode == 0, cp.stderr
    lines = sorted(l for l in cp.stdout.splitlines() if "ALLREDUCE" in l)
    assert len(lines) == 3, cp.stdout
    for r, line in enumerate(lines):
        assert f"rank={r} world=3 local_rank={r}" in line and "sum=6" in line, line
        assert line.startswith(f"[0:{r} localhost] "), line          # prefixed: instance:local_rank host
    rd = run_dir(tmp_path / "runs")
    for r in range(3):
        env = json.loads((dump / f"env-{r}.json").read_text())
        assert env["RANK"] == str(r) and env["LOCAL_RANK"] == str(r) and env["WORLD_SIZE"] == "3"
        assert env["LOCAL_WORLD_SIZE"] == "3" and env["GROUP_RANK"] == "0"
        assert env["MASTER_ADDR"] == "localhost"
        # the agent store: every worker, rank 0 included, dials the store that rank 0's agent serves on the port
        assert env["MASTER_PORT"] == str(port) and env["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert env["PODRUN_NUM_INSTANCES"] == "1" and env["PODRUN_INSTANCE_INDEX"] == "0"
        assert env["PODRUN_NUM_REPLICAS"] == "3" and env["PODRUN_LOCAL_REPLICAS"] == "3"
        assert env["PODRUN_RUN_DIR"] == str(rd) and env["PODRUN_PLAN"] == str(rd / "plan.json")
        assert env["PODRUN_RUN_ID"] == rd.name and env["PODRUN_RESTART_COUNT"] == "0"
        for name in ("PODRUN_REPLICA_OFFSET", "PODRUN_DEVICES_PER_REPLICA", "PODRUN_LOCAL_BATCH",
                     "PODRUN_GRAD_ACCUM", "PODRUN_GLOBAL_BATCH"):
            assert name in env
    s = summary(tmp_path / "runs")
    assert s["exit_code"] == 0 and s["status"] == "ok"
    assert s["instances"][0]["workers"] == {"0": 0, "1": 0, "2": 0}
    for f in ("plan.json", "command", "env.json", "instance-0.log"):
        assert (rd / f).exists(), f
    assert "sum=6" in (rd / "instance-0.log").read_text()


@pytest.mark.parametrize("joined", [False, True], ids=["started", "joined"])
def test_fail_fast_exit_code_root_cause_and_no_orphans(tmp_path, joined):
    """One worker exits 3: the run exits 3 at once, names the worker, and no process is left; ``joined``: the same
    with a second instance whose agent joined over TCP (one podrun per node, both copies on this machine)."""
    m = marker()
    args = ("launch", "--devices-per-host", "3", "--runs-dir", str(tmp_path / "runs"), "--",
            "sh", "-c", f"echo started $RANK; sleep 0.5; [ $RANK = 1 ] && {{ echo boom >&2; exit 3; }}; sleep 60 # {m}")
    cp = podrun_copies(*args) if joined else podrun(*args)
    assert cp.returncode == 3, cp.stderr
    assert re.search(r"root cause: instance 0 on \S+, local rank 1: exited with code 3", cp.stderr), cp.stderr
    assert "boom" in cp.stderr          # stderr of the failing worker, and the log tail
    assert local_pids(m) == []
    s = summary(tmp_path / "runs")
    assert s["exit_code"] == 3 and s["status"] == "failed"
    assert s["root_cause"]["local_rank"] == 1 and s["root_cause"]["exit_code"] == 3
    assert any("boom" in l for l in s["root_cause"]["last_lines"])
    # "at once": the other ranks were ended by podrun's SIGTERM, not by the end of their 60 s sleep
    ended = [code for st in s["instances"] for lr, code in st["workers"].items() if (st["index"], lr) != (0, "1")]
    assert ended == [128 + signal.SIGTERM] * (5 if joined else 2)
    assert s.get("joins", {}).get("joined") == (1 if joined else None)


def test_signal_exit_code_is_128_plus_signal(tmp_path):
    cp = podrun("launch", "--devices-per-host", "1", "--runs-dir", str(tmp_path / "runs"), "--",
                "sh", "-c", "kill -9 $$")
    assert cp.returncode == 137, cp.stderr
    assert summary(tmp_path / "runs")["root_cause"]["signal"] == "SIGKILL"


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_ends_everything(tmp_path, sig, code):
    m = marker()
    p = podrun_popen("launch", "--devices-per-host", "2", "--grace", "2", "--runs-dir", str(tmp_path / "runs"), "--",
                     "sh", "-c", f"echo up $RANK; sleep 60 # {m}")
    try:
        wait_output(p, "up", 30)
        assert wait_until(lambda: len(local_pids(m)) >= 2, 10)
        p.send_signal(sig)
        p.wait(timeout=15)
        assert p.returncode == code
        assert wait_until(lambda: local_pids(m) == [], 5), local_pids(m)
        assert summary(tmp_path / "runs")["status"] == "interrupted"
    finally:
        end(p)


def test_worker_ignoring_sigterm_is_killed_after_grace(tmp_path):
    m = marker()
    cp = podrun("launch", "--devices-per-host", "2", "--grace", "1", "--runs-dir", str(tmp_path / "runs"), "--",
                "sh", "-c", f"trap '' TERM; [ $RANK = 1 ] && sleep 0.3 && exit 4; sleep 30 # {m}")
    assert cp.returncode == 4, cp.stderr
    # killed after the grace (SIGKILL), not ended by its own 30 s sleep
    assert summary(tmp_path / "runs")["instances"][0]["workers"]["0"] == 128 + signal.SIGKILL
    assert local_pids(m) == []


def test_dry_run_prints_exactly_what_runs(tmp_path):
    """--dry-run prints the command line each host runs (no --env value in it: the local agent gets the --env in
    its environment), the --env apart, and each worker's env, secrets redacted as in the run directory (the real
    run writes the same command line to runs/<id>/command)."""
    port = str(free_port())      # the default, 0, is picked at launch: a dry run shows 0
    cp = podrun("launch", "--devices-per-host", "2", "--dry-run", "--json", "--run-id", "dry", "--runs-dir",
                str(tmp_path / "runs"), "--env", "MY_TOKEN=s3cret", "--master-port", port, "--", "echo", "hi there")
    assert cp.returncode == 0, cp.stderr
    rec = json.loads(cp.stdout)
    cmd = rec["commands"][0]["command"]
    assert cmd.startswith("cd ") and "MY_TOKEN" not in cmd and "-I -S -c" in cmd and "podrun.host.agent" in cmd
    assert "--env-stdin" not in cmd and rec["agent_env"] == {"MY_TOKEN": "<redacted>"}
    assert cmd.endswith("-- echo 'hi there'")
    assert [w["RANK"] for w in rec["instances"][0]["workers"]] == ["0", "1"]
    assert not (tmp_path / "runs").exists()          # nothing written, nothing started
    text = podrun("launch", "--devices-per-host", "2", "--dry-run", "--run-id", "dry", "--runs-dir",
                  str(tmp_path / "runs"), "--env", "MY_TOKEN=s3cret", "--master-port", port, "--", "echo",
                  "hi there").stdout
    assert cmd in text and "LOCAL_RANK=1" in text and "s3cret" not in text + cp.stdout
    assert "\n# every agent's --env (on top of the host's; its workers inherit it), through the agent's environment" \
           in text and "\nMY_TOKEN=<redacted>\n" in text
    cp = podrun("launch", "--devices-per-host", "2", "--run-id", "dry", "--runs-dir", str(tmp_path / "runs"),
                "--env", "MY_TOKEN=s3cret", "--master-port", port, "--", "echo", "hi there")
    assert cp.returncode == 0, cp.stderr
    written = (tmp_path / "runs" / "dry" / "command").read_text()
    # the one addition at launch: rank 0's agent inherits the controller's socket on the port
    assert "--agent-store --listen-fd " in written
    assert cmd in re.sub(r" --listen-fd \d+", "", written)
    env = json.loads((tmp_path / "runs" / "dry" / "env.json").read_text())
    assert env["instances"][0]["agent_env"] == {"MY_TOKEN": "<redacted>"}
    assert "s3cret" not in (tmp_path / "runs" / "dry" / "env.json").read_text() + written

def test_dry_run_says_when_the_port_is_picked_at_launch(tmp_path):
    """The default port on this machine is 0 (picked when the run starts): the dry run says so above the env
    that shows MASTER_PORT=0, and says nothing of it when a port is given."""
    picked = podrun("launch", "--dry-run", "--runs-dir", str(tmp_path / "runs"), "--", "true")
    assert picked.returncode == 0, picked.stderr
    assert "MASTER_PORT=0" in picked.stdout
    assert "# MASTER_PORT 0 below: podrun picks a free port on localhost when the run starts" in picked.stdout
    assert json.loads(podrun("launch", "--dry-run", "--json", "--runs-dir", str(tmp_path / "runs"), "--",
                             "true").stdout)["master_port"] == 0
    fixed = podrun("launch", "--dry-run", "--master-port", "29555", "--runs-dir", str(tmp_path / "runs"), "--", "true")
    assert "MASTER_PORT=29555" in fixed.stdout and "picks a free port" not in fixed.stdout



def test_only_output_from_instance_keeps_errors_from_all(tmp_path):
    """2 instances on this host: stdout of instance 1 is hidden (but logged), its stderr is shown."""
    cp = podrun("launch", "--instances-per-host", "2", "--devices-per-host", "2",
                "--only-output-from-instance", "0", "--runs-dir", str(tmp_path / "runs"), "--",
                "sh", "-c", "echo out-$PODRUN_INSTANCE_INDEX; echo err-$PODRUN_INSTANCE_INDEX >&2")
    assert cp.returncode == 0, cp.stderr
    assert "[0 localhost] out-0" in cp.stdout and "out-1" not in cp.stdout
    assert "[0 localhost] err-0" in cp.stderr and "[1 localhost] err-1" in cp.stderr
    assert "out-1" in (run_dir(tmp_path / "runs") / "instance-1.log").read_text()


def test_max_restarts_restarts_with_count_on_the_held_port(tmp_path):
    port = free_port()
    cp = podrun("launch", "--devices-per-host", "2", "--max-restarts", "2", "--master-port", str(port),
                "--runs-dir", str(tmp_path / "runs"), "--",
                "sh", "-c",
                'echo "try $PODRUN_RESTART_COUNT port $MASTER_PORT"; sleep 0.3; [ $PODRUN_RESTART_COUNT -ge 1 ]')
    assert cp.returncode == 0, cp.stderr
    # the controller holds the port for the whole run: every attempt serves a fresh store on it
    for attempt in (0, 1):
        for rank in (0, 1):
            assert f"[0:{rank} localhost] try {attempt} port {port}" in cp.stdout, cp.stdout
    assert "try 2" not in cp.stdout
    s = summary(tmp_path / "runs")
    assert [a["exit_code"] for a in s["attempts"]] == [1, 0] and s["restart_count"] == 1
    log = (run_dir(tmp_path / "runs") / "instance-0.log").read_text()
    assert "try 0" in log and "try 1" in log


def test_max_restarts_exhausted_exits_with_last_code(tmp_path):
    cp = podrun("launch", "--devices-per-host", "1", "--max-restarts", "1", "--runs-dir", str(tmp_path / "runs"),
                "--", "sh", "-c", "exit 5")
    assert cp.returncode == 5
    assert len(summary(tmp_path / "runs")["attempts"]) == 2


def test_command_not_found_is_127(tmp_path):
    cp = podrun("launch", "--devices-per-host", "1", "--runs-dir", str(tmp_path / "runs"), "--", "no-such-cmd-xyz")
    assert cp.returncode == 127, cp.stderr
    assert "no-such-cmd-xyz" in cp.stderr


def test_json_summary_on_stdout(tmp_path):
    cp = podrun("launch", "--devices-per-host", "1", "--json", "--runs-dir", str(tmp_path / "runs"), "--",
                "echo", "hello")
    assert cp.returncode == 0
    s = json.loads(cp.stdout)
    assert s["exit_code"] == 0 and s["instances"][0]["host"] == "localhost"
    assert "[0 localhost] hello" in cp.stderr


def test_busy_port_fails_preflight(tmp_path):
    import socket

    s = socket.socket()
    s.bind(("", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        cp = podrun("launch", "--devices-per-host", "1", "--master-port", str(port), "--runs-dir",
                    str(tmp_path / "runs"), "--", "echo", "never")
    finally:
        s.close()
    assert cp.returncode == 2
    assert f"localhost: rendezvous port {port} is in use" in cp.stderr and "never" not in cp.stdout
    assert summary(tmp_path / "runs")["status"] == "preflight_failed"


@pytest.mark.parametrize("args,needle", [
    (["--", ], "nothing to launch"),
    (["not-a-script.py", "--x"], "script not-a-script.py does not exist in the working directory"),
    (["--env", "PODRUN_TEST_UNSET_NAME", "--", "true"], "--env PODRUN_TEST_UNSET_NAME: PODRUN_TEST_UNSET_NAME is "
                                                          "not set in podrun's environment"),
    (["--env", "1BAD=x", "--", "true"], "--env '1BAD=x' is not NAME=VALUE nor NAME"),
    (["--transport", "carrier-pigeon", "--", "true"], "carrier-pigeon"),
    (["--workdir", "/nonexistent/dir", "--", "true"], "working directory /nonexistent/dir does not exist"),
    (["--only-output-from-instance", "7", "--", "true"], "--only-output-from-instance 7"),
])
def test_bad_input_exits_2_with_a_message(tmp_path, args, needle):
    cp = podrun("launch", "--devices-per-host", "1", "--runs-dir", str(tmp_path / "runs"), *args)
    assert cp.returncode == 2, (cp.returncode, cp.stderr)
    assert needle in cp.stderr and "Traceback" not in cp.stderr, cp.stderr


def test_hostfile_errors_exit_2_before_anything_starts(tmp_path):
    bad = tmp_path / "bad"
    bad.write_text("h1 slots=four\n")
    cp = podrun("launch", "--hostfile", str(bad), "--runs-dir", str(tmp_path / "runs"), "--", "true")
    assert cp.returncode == 2 and str(bad) in cp.stderr and "Traceback" not in cp.stderr
    mismatch = tmp_path / "mismatch"
    mismatch.write_text("h1 slots=2\nh2 slots=2\n")
    cp = podrun("launch", "--cluster", "dgx-h100", "--hostfile", str(mismatch), "--runs-dir",
                str(tmp_path / "runs"), "--", "true")
    assert cp.returncode == 2 and "slots" in cp.stderr and "Traceback" not in cp.stderr
    assert not (tmp_path / "runs").exists()


def _recipe(tmp_path):
    src = Path(__file__).resolve().parents[2] / "recipes" / "efficientnet_b4" / "recipe.yaml"
    d = tmp_path / "myrecipe"
    d.mkdir()
    (d / "recipe.yaml").write_text(src.read_text().replace("name: efficientnet_b4\n", "name: myrecipe\n", 1))
    (d / "train.py").write_text("import os, sys\nprint('args=%s lb=%s ga=%s' % (sys.argv[1:], "
                                "os.environ['PODRUN_LOCAL_BATCH'], os.environ['PODRUN_GRAD_ACCUM']))\n")
    return d


@pytest.mark.parametrize("sep", [[], ["--"]])
def test_recipe_runs_its_train_py_with_unknown_options_passed_through(tmp_path, sep):
    """`podrun launch RECIPE --data digits` (and RECIPE -- ARGS): train.py gets the args and the plan's batch."""
    d = _recipe(tmp_path)
    cp = podrun("launch", "--devices-per-host", "2", "--global-batch", "32", "--runs-dir", str(tmp_path / "runs"),
                str(d), *sep, "--data", "digits")
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.count("args=['--data', 'digits'] lb=8 ga=2") == 2, cp.stdout
    cmd = (run_dir(tmp_path / "runs") / "command").read_text()
    assert f"-- {sys.executable} {d / 'train.py'} --data digits" in cmd


@pytest.mark.parametrize("after", [["--dry-run"], ["--data", "digits", "--global-batch=16"], ["--json"]])
def test_podrun_options_after_the_recipe_stop_with_a_hint(tmp_path, after):
    """`podrun launch RECIPE --dry-run` would hand --dry-run to train.py and start a real run: exit 2 instead."""
    d = _recipe(tmp_path)
    cp = podrun("launch", "--devices-per-host", "2", "--global-batch", "32", "--runs-dir", str(tmp_path / "runs"),
                str(d), *after)
    assert cp.returncode == 2, cp.stdout + cp.stderr
    name = after[-1].split("=")[0]
    assert f"{after[-1]!r} comes after the recipe" in cp.stderr and "an option of podrun launch" in cp.stderr
    assert "put podrun's options before the recipe, or after -- to pass them to train.py on purpose" in \
        cp.stderr.replace(f" (podrun launch {name} ... {d})", ""), cp.stderr
    assert "args=" not in cp.stdout and not (tmp_path / "runs").exists()


def test_podrun_options_after_dashdash_go_to_train_py_on_purpose(tmp_path):
    d = _recipe(tmp_path)
    cp = podrun("launch", "--devices-per-host", "2", "--global-batch", "32", "--runs-dir", str(tmp_path / "runs"),
                str(d), "--", "--dry-run")
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.count("args=['--dry-run'] lb=8 ga=2") == 2, cp.stdout


def test_an_agent_that_starts_slowly_is_not_a_lost_host(tmp_path):
    """A --python that takes 4 s to start (a loaded host, a cold shared filesystem): longer than the 1 s bound,
    but before an agent's first line the allowance is 60 s, so the run goes on and ends 0."""
    slow = tmp_path / "slow-python"
    slow.write_text(f"#!/bin/sh\nsleep 4\nexec {sys.executable} \"$@\"\n")
    slow.chmod(0o755)
    cp = podrun("launch", "--devices-per-host", "1", "--runs-dir", str(tmp_path / "runs"), "--no-agent-store",
                "--python", str(slow), "--", "sh", "-c", "echo started")
    assert cp.returncode == 0, cp.stderr
    assert "lost" not in cp.stderr and "[0 localhost] started" in cp.stdout, cp.stderr
    s = summary(tmp_path / "runs")
    assert s["heartbeat"]["bound_s"] == 1.0 and s["instances"][0]["status"] == "ok"
