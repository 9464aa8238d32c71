"""Warm restarts (podrun.host.zygote) on real OpenSSH hosts in network namespaces: an elastic run that loses a host
and goes on with the same global batch and loss curve, its re-planned workers forked by each host's zygote; a
zygote killed mid-run (the next attempt starts cold), and runs that leave no zygote behind."""
from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.elastic.test_elastic_ssh import launch_args, steps, wait_step
from tests.elastic.test_snapshot_ssh import reference_losses
from tests.rundir.account_check import assert_adds_up, process_start
from tests.launch.helpers import end, local_pids, podrun, podrun_popen, run_dir, summary, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]
HERE = Path(__file__).parent
TRAIN = str(HERE / "train_groupnorm.py")
PROBE = str(HERE / "warm_probe.py")
ZYGOTE = "podrun.host.zygote"


def zygotes(where: Path, watchers: bool = False) -> list[int]:
    """Pids of the zygotes serving run directories under ``where`` (every namespace host shares this pid space);
    each zygote's watcher (a fork of it, the same command line, its child) is left out unless ``watchers``."""
    found = [p for p in local_pids(ZYGOTE)
             if str(where) in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")]
    if watchers:
        return found

    def parent(pid: int) -> int:
        try:
            return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return 0
    return [p for p in found if parent(p) not in found]


def probes(rd: Path) -> list[dict]:
    out = []
    for log in sorted(rd.glob("instance-*.log")):
        for m in re.finditer(r"probe (\S+) attempt (\d+) pid (\d+) ppid (\d+) warm (\S+)", log.read_text()):
            out.append({"host": m[1], "attempt": int(m[2]), "pid": int(m[3]), "ppid": int(m[4]), "warm": m[5]})
    return out


@pytest.mark.torch
@pytest.mark.timeout(480)
def test_lost_host_continues_on_3_hosts_with_the_same_loss_curve_its_workers_forked_by_the_zygotes(make_ssh_hosts,
                                                                                                     tmp_path):
    """h3's link is cut after step 8 of an --elastic run on 4 hosts: podrun drops h3, re-plans 4 -> 3 hosts at the
    same global batch (GA 3 -> 4), and the run ends 0 with the loss curve of a reference run that lost nothing, to
    float rounding; the re-planned workers (and rank 0's store host) are forked by each host's zygote; the run's
    account has the loss's detection and re-plan as failure; its zygotes end with it. (One run for the lost host
    and the warm restart; the reference is the same training done in this process on one replica, as
    test_snapshot_ssh's: GroupNorm, so the split of the global batch changes only float rounding.)"""
    hosts = make_ssh_hosts(4)
    train = [sys.executable, TRAIN, "--steps", "24", "--sleep", "0.15"]
    reference = reference_losses(24, 12)

    # the run waits after step 8 until every host's zygote listens (it imports at SCHED_IDLE: on a busy
    # machine that takes long, and an agent that finds no zygote starts its worker cold)
    go = tmp_path / "go"
    t0 = time.time()
    p = podrun_popen(*launch_args(hosts, hosts.hosts, tmp_path, "el", "--global-batch", "12", "--elastic", "2",
                                  "--max-restarts", "2"), "--", *train, "--hold-after", "8", "--hold-until", str(go))
    began = process_start(p.pid)
    try:
        wait_step(tmp_path / "el", 8, 120)
        assert wait_until(lambda: len(zygotes(tmp_path / "el")) == 4, 60), "no zygote on every host"
        listening = lambda: len(list((tmp_path / "el").glob("*/zygote/*.sock"))) == 4  # noqa: E731
        assert wait_until(listening, 200), "not every host's zygote listened within 200 s"
        hosts.isolate("h3")
        go.touch()
        _, err = p.communicate(timeout=200)
        t1 = time.time()
    finally:
        end(p)
    assert p.returncode == 0, err
    line = [l for l in err.splitlines() if "elastic:" in l]
    assert len(line) == 1 and line[0].startswith("podrun: elastic: dropping h3 (host h3 lost"), err
    assert "re-planned 4 -> 3 hosts: 1 x 4 x GA 3 -> 1 x 3 x GA 4 = global batch 12" in line[0]
    acc = assert_adds_up(run_dir(tmp_path / "el"), (t0, t1), began)    # the loss's detection and re-plan: failure
    assert acc["seconds"]["failure"] > 0 and len(acc["attempts"]) == 2, acc
    rd = run_dir(tmp_path / "el")
    logs = {i: (rd / f"instance-{i}.log").read_text() for i in range(3)}
    for i, text in logs.items():     # every worker of the re-planned attempt was forked by its host's zygote
        assert re.search(r"# podrun agent: warm start: local rank 0 forked by the zygote \(pid \d+\)", text), (i, text)
    assert re.search(r"# podrun agent: warm start: the store host forked by the zygote", logs[0]), logs[0]
    got = steps(rd)
    assert sorted(got) == list(range(1, 25))
    assert {got[s]["world_size"] for s in range(1, 9)} == {4} and got[24]["world_size"] == 3
    for s in range(1, 25):           # the same curve as the run that lost nothing, to float rounding
        assert got[s]["loss"] == pytest.approx(reference[s], rel=1e-5, abs=1e-7), s
    s = summary(tmp_path / "el")
    assert s["exit_code"] == 0 and s["status"] == "ok"
    assert [a["plan"] for a in s["attempts"]] == ["plan-0.json", "plan-1.json"]
    rp = s["elastic"]["replans"]
    assert len(rp) == 1 and rp[0]["hosts_lost"] == ["h3"] and rp[0]["at_step"] >= 8
    assert rp[0]["old"]["hosts"] == hosts.hosts and rp[0]["new"]["hosts"] == ["h1", "h2", "h4"]
    assert rp[0]["old"]["global_batch"] == rp[0]["new"]["global_batch"] == 12
    assert rp[0]["training_after_s"] is not None and rp[0]["training_after_s"] > rp[0]["restarted_after_s"] > 0
    for name, n in (("plan-0.json", 4), ("plan-1.json", 3), ("plan.json", 3)):
        plan = json.loads((rd / name).read_text())
        assert len(plan["hosts"]) == n and plan["global_batch"] == 12
    # the run is over: its zygotes (h3's too, behind its cut link) end with it
    assert wait_until(lambda: not zygotes(tmp_path / "el", watchers=True), 15), zygotes(tmp_path / "el", True)
    assert not (rd / "zygote").exists()
    print(f"elastic record: {json.dumps(rp[0])}")


@pytest.mark.torch
def test_a_killed_zygote_makes_the_next_attempt_start_cold(make_ssh_hosts, tmp_path):
    hosts = make_ssh_hosts(2)
    p = podrun_popen(*launch_args(hosts, hosts.hosts, tmp_path, "runs", "--max-restarts", "1"),
                     "--", sys.executable, PROBE, str(tmp_path))
    try:
        rd = wait_until(lambda: next((tmp_path / "runs").glob("*/zygote/h2.sock"), None), 90)
        assert rd is not None, "h2's zygote never listened"
        rd = rd.parent.parent
        assert wait_until(lambda: (rd / "zygote" / "h1.sock").exists(), 60), "h1's zygote never listened"
        h1 = [z for z in zygotes(tmp_path) if "h1.sock" in Path(f"/proc/{z}/cmdline").read_text()]
        assert len(h1) == 1, h1
        os.kill(h1[0], signal.SIGKILL)
        (tmp_path / "go").touch()
        _, err = p.communicate(timeout=120)
    finally:
        end(p)
    assert p.returncode == 0, err
    assert "restart 1 of 1" in err
    by = {(x["host"], x["attempt"]): x for x in probes(rd)}
    assert set(by) == {("h1", 0), ("h2", 0), ("h1", 1), ("h2", 1)}, by
    assert by[("h1", 0)]["warm"] == by[("h2", 0)]["warm"] == "-"          # the first attempt starts cold
    assert by[("h1", 1)]["warm"] == "-"                                    # its zygote was killed: cold again
    logs = [log.read_text() for log in rd.glob("instance-*.log")]
    h1_log, h2_log = (next(text for text in logs if f"probe {h} attempt 1" in text) for h in ("h1", "h2"))
    assert "# podrun agent: cold start: local rank 0: no zygote listens on this host" in h1_log, h1_log
    assert "cold start" not in h2_log, h2_log
    assert by[("h2", 1)]["warm"] != "-" and by[("h2", 1)]["ppid"] == int(by[("h2", 1)]["warm"])
    assert summary(tmp_path / "runs")["exit_code"] == 0
    assert wait_until(lambda: not zygotes(tmp_path, watchers=True), 15), zygotes(tmp_path, watchers=True)


def test_no_warm_starts_no_zygote(make_ssh_hosts, tmp_path):
    hosts = make_ssh_hosts(2)
    p = podrun_popen(*launch_args(hosts, hosts.hosts, tmp_path, "runs", "--max-restarts", "1", "--no-warm"),
                     "--", sys.executable, PROBE, str(tmp_path))
    try:
        assert wait_until(lambda: len(probes(run_dir(tmp_path / "runs"))) == 2 if list((tmp_path / "runs").glob("*"))
                          else False, 90), "the first attempt did not start"
        (tmp_path / "go").touch()
        _, err = p.communicate(timeout=120)
    finally:
        end(p)
    assert p.returncode == 0, err
    assert all(x["warm"] == "-" for x in probes(run_dir(tmp_path / "runs")))
    assert "--warm" not in (run_dir(tmp_path / "runs") / "command").read_text()
    assert not (run_dir(tmp_path / "runs") / "zygote").exists() and not zygotes(tmp_path, watchers=True)


@pytest.mark.torch
def test_podrun_stack_shows_a_warm_workers_stack(tmp_path):
    """The stack-dump signal reaches a worker the zygote forked (its handler registered after the fork)."""
    runs = tmp_path / "runs"
    p = podrun_popen("launch", "--devices-per-host", "1", "--runs-dir", str(runs), "--max-restarts", "1",
                     "--hang-timeout", "off", "--", sys.executable, PROBE, str(tmp_path), "--wait-done")
    try:
        sock = wait_until(lambda: next(runs.glob("*/zygote/*.sock"), None), 90)
        assert sock is not None, "the zygote never listened"
        rd = sock.parent.parent
        (tmp_path / "go").touch()
        assert wait_until(lambda: any(x["attempt"] == 1 for x in probes(rd)), 60), probes(rd)
        warm = next(x for x in probes(rd) if x["attempt"] == 1)
        assert warm["warm"] != "-" and warm["ppid"] == int(warm["warm"]), warm
        cp = podrun("stack", "--runs-dir", str(runs), "--json", timeout=60)
        assert cp.returncode == 0, cp.stderr
        workers = [w for g in json.loads(cp.stdout)["groups"] for w in g["workers"]]
        assert len(workers) == 1 and workers[0]["processes"][0]["pid"] == warm["pid"], workers
        main = workers[0]["processes"][0]["threads"][0]
        loop = next(n for n, t in enumerate(Path(PROBE).read_text().splitlines(), 1) if t.endswith("# WARM-LOOP"))
        assert main["main"] and any(f["file"] == PROBE and f["line"] == loop for f in main["frames"]), main
        (tmp_path / "done").touch()
        _, err = p.communicate(timeout=60)
    finally:
        end(p)
    assert p.returncode == 0, err
    assert wait_until(lambda: not zygotes(tmp_path, watchers=True), 15), zygotes(tmp_path, watchers=True)


@pytest.mark.torch
def test_several_workers_of_a_torch_program_are_forked_at_the_first_attempt(tmp_path):
    """Import once per host: a host's 2 workers of a program that imports torch (and rank 0's store host) are forked
    by one zygote at the first attempt (no restart asked); 2 workers of a program without torch, --no-warm, and
    one worker of it on a host in a run that cannot restart, start cold and start no zygote; the run's end ends
    the zygote."""
    torch_code = "import torch, os; print('warm', os.environ.get('PODRUN_WARM'), flush=True)"
    plain_code = "import os; print('warm', os.environ.get('PODRUN_WARM'), flush=True)"
    for name, code, flags in (("torch", torch_code, ()), ("plain", plain_code, ()),
                              ("nowarm", torch_code, ("--no-warm",)), ("one", torch_code, ("--devices-per-host", "1"))):
        p = podrun("launch", "--devices-per-host", "2", "--runs-dir", str(tmp_path / name), *flags, "--",
                   sys.executable, "-c", code)
        assert p.returncode == 0, p.stderr
        parents = set(re.findall(r"warm (\S+)", p.stdout))
        assert parents == ({"None"} if name != "torch" else parents - {"None"}) and len(parents) == 1, p.stdout
        log = (run_dir(tmp_path / name) / "instance-0.log").read_text()
        assert len(re.findall(r"local rank \d forked by the zygote", log)) == (2 if name == "torch" else 0), log
        assert "warm start" not in log or name == "torch", log
        assert (run_dir(tmp_path / name) / "zygote").exists() is False
    assert wait_until(lambda: zygotes(tmp_path) == [], 10), zygotes(tmp_path)
