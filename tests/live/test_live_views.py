"""A run seen live where people look: a real Prometheus server (Debian's package, started here on 127.0.0.1 with a
file_sd config on the runs directory) scrapes a launched digits run's endpoint; TensorBoard's own reader reads its
event files; `podrun top` shows it from another process. And the bad input: a metrics port in use, a run directory
that is not this user's."""
from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from podrun.rundir.account import CATEGORIES
from tests.harness.podrun_proc import end, ssh_launch_args
from tests.launch.helpers import marker, podrun, podrun_popen, run_on_terminal, wait_output, wait_until
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
RECIPE = str(ROOT / "recipes" / "resnet18_cifar10")
SCRAPE_S = 1
PROMETHEUS = shutil.which("prometheus")


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}


def _query(port: int, expr: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        got = json.loads(r.read())
    assert got["status"] == "success", got
    return got["data"]["result"]


def _values(port: int, expr: str, key: str) -> dict[str, float]:
    """Each series' last value (last_over_time: staleness markers after the target went are not values), by label."""
    return {r["metric"].get(key, ""): float(r["value"][1]) for r in _query(port, f"last_over_time({expr}[10m])")}


@pytest.fixture
def prometheus(tmp_path):
    """A real Prometheus on 127.0.0.1 scraping every SCRAPE_S the targets in tmp_path/sd/*.json (file_sd: a glob in
    the last path segment only)."""
    if PROMETHEUS is None:
        pytest.fail("Debian's prometheus package is not installed (.ci/install installs it)", pytrace=False)
    runs = tmp_path / "runs"
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(f"global:\n  scrape_interval: {SCRAPE_S}s\n  scrape_timeout: {SCRAPE_S}s\n"
                   "scrape_configs:\n  - job_name: podrun\n    file_sd_configs:\n"
                   f"      - files: ['{tmp_path / 'sd'}/*.json']\n        refresh_interval: 1s\n")
    port = free_port()
    log = open(tmp_path / "prometheus.log", "wb")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False
    try:
        assert wait_until(ready, 60, 0.2), (tmp_path / "prometheus.log").read_text()[-2000:]
        yield port, runs, tmp_path / "sd"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_a_digits_run_is_seen_live_in_prometheus_tensorboard_and_top(prometheus, tmp_path):
    """A 2-rank digits run with --metrics-port 0 --tensorboard: while it runs, `podrun top --json` (the control
    socket) gives its host, its ranks' step split and its progress, `podrun top --once` draws them at 80 columns, and
    Prometheus found the run through its file_sd target file; at the end Prometheus's last values of the account's
    seconds by category, the goodput and each rank's step split equal summary.json's (the endpoint waits for one last
    scrape), the target file is gone, and TensorBoard's EventAccumulator reads the same loss, accuracy and lr per
    step as metrics.jsonl, and the account."""
    port, runs, sd = prometheus
    err = open(tmp_path / "launch.err", "wb")
    launch = subprocess.Popen([sys.executable, "-m", "podrun", "launch", "--devices-per-host", "2", "--global-batch",
                               "8", "--runs-dir", str(runs), "--run-id", "live", "--metrics-port", "0",
                               "--metrics-sd-dir", str(sd),
                               "--tensorboard", RECIPE, "--data", "digits", "--image-size", "8", "--steps", "16",
                               "--eval-every", "0", "--keep-checkpoints", "0"],
                              stdout=subprocess.DEVNULL, stderr=err, env=_env(), cwd=tmp_path)
    d = runs / "live"
    try:
        def top_json() -> dict | None:
            cp = subprocess.run([sys.executable, "-m", "podrun", "top", "live", "--runs-dir", str(runs), "--json"],
                                capture_output=True, text=True, env=_env(), timeout=60)
            got = json.loads(cp.stdout) if cp.returncode == 0 else None
            return got if got and got["source"] == "controller" and isinstance(got.get("step"), int) \
                and got["step"] >= 2 and len(got["ranks"]) == 2 else None
        live = wait_until(top_json, 240, 1.0)
        assert live, (tmp_path / "launch.err").read_text()[-3000:]
        assert live["running"] and live["total"] == 16 and live["recipe"] == "resnet18_cifar10", live
        assert [(h["host"], h["state"]) for h in live["hosts"]] == [("localhost", "running")], live["hosts"]
        assert live["hosts"][0]["heartbeat_age_s"] is not None and live["hosts_lost"] == 0
        assert all(r["split"]["compute"] > 0 for r in live["ranks"]), live["ranks"]
        assert 0 < live["account"]["goodput"] < 1 and live["account"]["seconds"]["training"] > 0, live["account"]
        target = json.loads((d / "prometheus-targets.json").read_text())
        assert json.loads((sd / "podrun-live.json").read_text()) == target
        assert target[0]["labels"]["run_id"] == "live" and target[0]["targets"][0].startswith("127.0.0.1:"), target
        cp = subprocess.run([sys.executable, "-m", "podrun", "top", "live", "--runs-dir", str(runs), "--once"],
                            capture_output=True, text=True, env=_env(), timeout=60)
        assert cp.returncode == 0, cp.stderr
        assert "localhost" in cp.stdout and "running" in cp.stdout and "goodput" in cp.stdout, cp.stdout
        assert max(map(len, cp.stdout.splitlines())) <= 80, cp.stdout
        assert wait_until(lambda: _query(port, 'podrun_step{run_id="live"} >= 1'), 120, 0.5), "never scraped"
        assert launch.wait(timeout=400) == 0, (tmp_path / "launch.err").read_text()[-3000:]
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()
        err.close()
    s = json.loads((d / "summary.json").read_text())
    assert not (d / "prometheus-targets.json").exists() and not (sd / "podrun-live.json").exists()
    started = (tmp_path / "launch.err").read_text().splitlines()[0]
    assert "metrics on http://127.0.0.1:" in started and "TensorBoard files in" in started, started

    secs = _values(port, 'podrun_account_seconds{run_id="live"}', "category")
    assert sorted(secs) == sorted(CATEGORIES), secs
    for c in CATEGORIES:
        assert secs[c] == pytest.approx(s["account"]["seconds"][c], abs=2e-3), (c, secs, s["account"])
    assert _values(port, 'podrun_goodput{run_id="live"}', "run_id")["live"] == pytest.approx(
        s["account"]["goodput"], abs=1e-4)
    split = {(r["metric"]["rank"], r["metric"]["part"]): float(r["value"][1]) for r in _query(
        port, 'last_over_time(podrun_rank_step_split_seconds{run_id="live"}[10m])')}
    want = {(rank, part): v[part] for rank, v in s["step_split"]["ranks"].items()
            for part in ("input", "compute", "comm", "optim")}
    assert split.keys() == want.keys() and all(split[k] == pytest.approx(want[k], abs=2e-6) for k in want), \
        (split, want)

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(d / "tensorboard"))
    acc.Reload()
    steps = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if r.get("kind") == "step"]
    assert len(steps) == 16
    for key, tag in (("loss", "train/loss"), ("accuracy", "train/accuracy"), ("lr", "train/lr")):
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert [n for n, _ in got] == [r["step"] for r in steps], tag
        assert all(v == pytest.approx(r[key], rel=1e-6, abs=1e-7) for (_, v), r in zip(got, steps)), tag
    assert acc.Scalars("account/goodput")[-1].value == pytest.approx(s["account"]["goodput"], rel=1e-6)


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_a_lost_host_shows_in_prometheus_and_podrun_top(prometheus, make_ssh_hosts, tmp_path):
    """2 real OpenSSH hosts in network namespaces, one worker each, --keepalive 3: `podrun top --json` shows both
    running, and so does `podrun top` on a terminal until q leaves it; h2's link is cut; Prometheus's podrun_hosts_lost for the run reads 1, scraped from the controller before
    it ended (its endpoint lives as long as it does), and `podrun top --once` on the ended run (its records) shows h2
    lost beside h1."""
    port, runs, sd = prometheus
    hosts = make_ssh_hosts(2)
    m = marker()
    p = podrun_popen(*ssh_launch_args(hosts, runs, free_port(), "--keepalive", "3", "--run-id", "cut",
                                      "--metrics-port", "0", "--metrics-sd-dir", str(sd)),
                     "--", "sh", "-c", f"echo up $RANK; sleep 60 # {m}")
    try:
        for _ in range(2):
            wait_output(p, "up", 60)

        def top_json() -> dict | None:
            cp = subprocess.run([sys.executable, "-m", "podrun", "top", "cut", "--runs-dir", str(runs), "--json"],
                                capture_output=True, text=True, env=_env(), timeout=60)
            got = json.loads(cp.stdout) if cp.returncode == 0 else None
            return got if got and got["source"] == "controller" and got["hosts_running"] == 2 else None
        live = wait_until(top_json, 60, 0.5)
        assert live and [h["host"] for h in live["hosts"]] == ["h1", "h2"], live
        rc, shown = run_on_terminal([sys.executable, "-m", "podrun", "top", "cut", "--runs-dir", str(runs)],
                                    env=_env(), timeout=60, answer=(b"q leaves", b"q"))
        assert rc == 0 and "h1" in shown and "h2" in shown and "running" in shown, shown
        assert wait_until(lambda: _query(port, 'podrun_hosts_running{run_id="cut"} == 2'), 60, 0.5), "not scraped"
        hosts.isolate("h2")
        p.wait(timeout=60)
        err = p.stderr.read()
        assert p.returncode == 255 and "instance 1 on h2: lost" in err, err
    finally:
        end(p)
    assert _values(port, 'podrun_hosts_lost{run_id="cut"}', "run_id") == {"cut": 1.0}
    cp = subprocess.run([sys.executable, "-m", "podrun", "top", "cut", "--runs-dir", str(runs), "--once"],
                        capture_output=True, text=True, env=_env(), timeout=60)
    assert cp.returncode == 0, cp.stderr
    rows = {line.split()[0]: line.split() for line in cp.stdout.splitlines() if line.startswith(("h1 ", "h2 "))}
    assert rows["h2"][1] == "lost" and rows["h1"][1] != "lost", cp.stdout
    assert "root cause: host h2 lost" in cp.stdout, cp.stdout


def test_a_metrics_port_in_use_and_a_run_directory_not_ours_are_refused(tmp_path):
    """A --metrics-port another program holds, or a --metrics-sd-dir anyone may write: one paragraph, exit 2, no
    worker started.
    `podrun top` on a run directory another user owns: refused as `podrun resume` refuses it, exit 2."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        runs = tmp_path / "runs"
        cp = podrun("launch", "--runs-dir", str(runs), "--metrics-port", str(port), "--",
                    sys.executable, "-c", "print('ran')", env={"PYTHONPATH": str(ROOT)})
    assert cp.returncode == 2 and "Traceback" not in cp.stderr, cp.stderr
    assert f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}: the port is in use" in cp.stderr, cp.stderr
    assert "ran" not in cp.stdout and not list(runs.glob("*/instance-*.log"))
    shared = tmp_path / "shared-sd"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    cp = podrun("launch", "--runs-dir", str(runs), "--metrics-port", "0", "--metrics-sd-dir", str(shared), "--",
                sys.executable, "-c", "print('ran')", env={"PYTHONPATH": str(ROOT)})
    assert cp.returncode == 2 and "Traceback" not in cp.stderr and str(shared) in cp.stderr, cp.stderr
    assert "ran" not in cp.stdout and not list(runs.glob("*/instance-*.log"))

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    nobody = pwd.getpwnam("nobody")
    os.chown(theirs, nobody.pw_uid, nobody.pw_gid)
    cp = podrun("top", str(theirs), "--once")
    assert cp.returncode == 2 and "Traceback" not in cp.stderr, cp.stderr
    assert str(theirs) in cp.stderr and "podrun top reads run directories of your own" in cp.stderr, cp.stderr


def test_the_label_sets_stay_bounded_at_512_hosts():
    """512 hosts' rows (podrun.live.state.bounded): the 8 slowest, the 8 fastest and the lost ones are kept, nothing
    else; 64 rows or fewer are kept whole."""
    from podrun.live.state import EDGE, LABELLED, bounded

    rows = [{"host": f"h{i}", "busy_s": 0.1 + i / 1000, "state": "running", "slow": False} for i in range(512)]
    for i in (100, 200, 300):
        rows[i]["state"] = "lost"
    kept = [r["host"] for r in bounded(rows)]
    want = {f"h{i}" for i in [*range(EDGE), *range(512 - EDGE, 512), 100, 200, 300]}
    assert set(kept) == want and len(kept) == len(want) <= 3 * EDGE, kept
    assert bounded(rows[:LABELLED]) == rows[:LABELLED]
