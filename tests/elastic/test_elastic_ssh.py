"""Elastic runs on real OpenSSH hosts in network namespaces: a lost host, a spare, a loss below MIN."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.launch.helpers import end, marker, podrun, podrun_popen, run_dir, summary, wait_output, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]
TRAIN = str(Path(__file__).with_name("train_groupnorm.py"))
_port = iter(range(29400, 29999, 6))      # 2 ports per attempt, up to 3 attempts; 100 launches a process
# the liveness bound: a cut host is found within seconds, and a controller starved for 2 s by a loaded CI machine
# (ci14: its agents ended their workers 14 s into the start) is no loss
KEEPALIVE = 4.0


def launch_args(hosts, names, tmp_path, runs, *extra):
    return ["launch", "--hosts", ",".join(names), "--devices-per-host", "1", "--transport", "ssh",
            "--ssh-config", hosts.ssh_config_path, "--python", hosts.python, "--runs-dir", str(tmp_path / runs),
            "--master-port", str(next(_port)), "--keepalive", f"{KEEPALIVE:g}", *extra]


def steps(rd: Path) -> dict[int, dict]:
    """The last record of each step in metrics.jsonl (a step redone after a resume replaces the first)."""
    out = {}
    for line in (rd / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["kind"] == "step":
            out[r["step"]] = r
    return out


def wait_step(rd_parent: Path, n: int, timeout: float) -> None:
    def reached():
        dirs = [d for d in rd_parent.iterdir()] if rd_parent.exists() else []
        m = dirs[0] / "metrics.jsonl" if dirs else None
        return m is not None and m.exists() and any(
            json.loads(l).get("step", 0) >= n and json.loads(l)["kind"] == "step" for l in m.read_text().splitlines())
    assert wait_until(reached, timeout, 0.1), f"step {n} not reached within {timeout} s"


def cut_when_up(p, hosts, victim: str, instances: int, timeout: float) -> str:
    """Once ``instances`` workers said "up", cut ``victim``'s link; podrun's stderr when it has ended."""
    try:
        for _ in range(instances):
            wait_output(p, "up", 60)
        hosts.isolate(victim)
        return p.communicate(timeout=timeout)[1]
    finally:
        end(p)


def test_spare_takes_the_lost_hosts_place(make_ssh_hosts, tmp_path):
    hosts = make_ssh_hosts(4)
    m = marker()
    # the first attempt waits until podrun ends it (the cut), the re-planned one ends at once
    cmd = ["sh", "-c", f'echo "up $RANK of $WORLD_SIZE"; [ "$PODRUN_RESTART_COUNT" != 0 ] || sleep 600 # {m}']
    p = podrun_popen(*launch_args(hosts, hosts.hosts[:3], tmp_path, "runs", "--elastic", "3", "--spare-hosts", "h4",
                                  "--max-restarts", "1"), "--", *cmd)
    err = cut_when_up(p, hosts, "h2", instances=3, timeout=120)
    assert p.returncode == 0, err
    assert "elastic: dropping h2 (host h2 lost" in err and "spare h4 in its place; re-planned 3 -> 3 hosts" in err, err
    s = summary(tmp_path / "runs")
    assert [x["host"] for x in s["instances"]] == ["h1", "h4", "h3"]
    assert s["elastic"]["replans"][0]["spares_used"] == ["h4"] and s["elastic"]["spares"] == []


def test_loss_below_min_ends_the_run_with_its_root_cause(make_ssh_hosts, tmp_path):
    hosts = make_ssh_hosts(3)
    m = marker()
    p = podrun_popen(*launch_args(hosts, hosts.hosts, tmp_path, "runs", "--elastic", "3", "--max-restarts", "2"),
                     "--", "sh", "-c", f"echo up $RANK; sleep 60 # {m}")
    err = cut_when_up(p, hosts, "h2", instances=3, timeout=60)
    assert p.returncode == 255, err
    assert (f"elastic: dropping h2 (host h2 lost: no heartbeat for {KEEPALIVE:g} s (link down, sshd gone or machine frozen)); "
            "the run cannot continue: 2 host(s) left after losing h2, fewer than the elastic minimum 3") in err, err
    assert "root cause: instance 1 on h2" in err
    s = summary(tmp_path / "runs")
    assert s["exit_code"] == 255 and s["root_cause"]["host"] == "h2" and len(s["attempts"]) == 1
    assert s["elastic"]["end"] == "2 host(s) left after losing h2, fewer than the elastic minimum 3"


def test_a_spare_that_cannot_be_reached_is_dropped_and_the_run_goes_on(make_ssh_hosts, tmp_path):
    """The re-planned attempt checks its hosts first: spare h4 (sshd gone) fails that check, so it is dropped
    as a lost host is and the run re-plans again, 3 -> 2 hosts at the same global batch, with no restart spent."""
    hosts = make_ssh_hosts(4)
    hosts.stop_sshd("h4")
    m = marker()
    cmd = ["sh", "-c", f'echo "up $RANK of $WORLD_SIZE"; [ "$PODRUN_RESTART_COUNT" != 0 ] || sleep 600 # {m}']
    p = podrun_popen(*launch_args(hosts, hosts.hosts[:3], tmp_path, "runs", "--global-batch", "12", "--elastic", "2",
                                  "--spare-hosts", "h4", "--max-restarts", "1"), "--", *cmd)
    err = cut_when_up(p, hosts, "h2", instances=3, timeout=120)
    assert p.returncode == 0, err
    said = [line for line in err.splitlines() if "elastic:" in line]
    assert len(said) == 2, err
    assert "dropping h2 (host h2 lost" in said[0] and "spare h4 in its place; re-planned 3 -> 3 hosts" in said[0], err
    assert said[1].startswith("podrun: elastic: dropping h4 (unreachable: cannot connect to"), err
    assert "re-planned 3 -> 2 hosts: 1 x 3 x GA 4 -> 1 x 2 x GA 6 = global batch 12" in said[1], err
    s = summary(tmp_path / "runs")
    assert s["exit_code"] == 0 and [x["host"] for x in s["instances"]] == ["h1", "h3"]
    assert len(s["attempts"]) == 2                         # the failed check started nothing and spent no restart
    rp = s["elastic"]["replans"]
    assert [r["hosts_lost"] for r in rp] == [["h2"], ["h4"]] and [r["restart"] for r in rp] == [1, 1]
    assert rp[0]["preflight"] == [] and len(rp[1]["preflight"]) == 1 and rp[1]["preflight"][0].startswith("h4: ")
    assert rp[1]["old"]["hosts"] == ["h1", "h4", "h3"] and rp[1]["new"]["hosts"] == ["h1", "h3"]
    assert rp[1]["lost_at"] == rp[0]["lost_at"] and rp[1]["restarted_after_s"] > 0   # timed from h2's loss
    plan = json.loads((run_dir(tmp_path / "runs") / "plan-1.json").read_text())
    assert plan["hosts"] == ["h1", "h3"] and plan["global_batch"] == 12


RECIPE_TRAIN = str(Path(__file__).resolve().parents[2] / "recipes" / "resnet18_cifar10" / "train.py")
INPLACE_STEPS = 10


_REFERENCE: dict[int, float] = {}     # the recipe run's losses without a failure: the same on any 3 fresh hosts


def recipe_run(hosts, tmp_path):
    """The resnet18 recipe (GroupNorm: the curve does not depend on the split of the global batch) at global batch
    12 with --elastic 2 on ``hosts``: its command, and the per-step losses of that run without a failure (run once
    per module)."""
    train = [hosts.python, RECIPE_TRAIN, "--data", "synthetic", "--synthetic-size", "240", "--norm", "group",
             "--steps", str(INPLACE_STEPS), "--eval-every", "0", "--threads", "1", "--quiet"]
    if not _REFERENCE:
        ref = podrun(*launch_args(hosts, hosts.hosts, tmp_path, "ref", "--global-batch", "12", "--elastic", "2"),
                     "--", *train, timeout=200)
        assert ref.returncode == 0, ref.stderr[-3000:]
        _REFERENCE.update({n: r["loss"] for n, r in steps(run_dir(tmp_path / "ref")).items()})
    assert sorted(_REFERENCE) == list(range(1, INPLACE_STEPS + 1))
    return train, dict(_REFERENCE)


def _worker_of(tmp_path, rank: int) -> int:
    """The pid of the recipe worker of global ``rank`` in the run under tmp_path (its environment says so)."""
    for d in Path("/proc").iterdir():
        try:
            if RECIPE_TRAIN not in (d / "cmdline").read_bytes().decode(errors="replace"):
                continue
            env = dict(x.split("=", 1) for x in (d / "environ").read_bytes().decode(errors="replace").split("\0")
                       if "=" in x)
        except OSError:
            continue
        if env.get("RANK") == str(rank) and env.get("PODRUN_RUN_DIR", "").startswith(str(tmp_path / "runs")):
            return int(d.name)
    raise AssertionError(f"no worker of rank {rank} under {tmp_path}")


def _run_pids(tmp_path) -> list[int]:
    """The live processes of the run under tmp_path/runs on every host (the hosts share this pid namespace): its
    agents and the ssh clients that carry them (the run directory on their command line) and its workers (it in
    their PODRUN_RUN_DIR); zombies are gone."""
    runs, out = str(tmp_path / "runs"), []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if (d / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            cmd = (d / "cmdline").read_bytes().decode(errors="replace")
            env = (d / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if runs in cmd or f"\0PODRUN_RUN_DIR={runs}" in f"\0{env}":
            out.append(int(d.name))
    return out


def _stderr_until(p, text: str, timeout: float) -> str:
    """podrun's stderr read up to a line with ``text`` (AssertionError after ``timeout`` s or at its end); what was
    read is also kept for ``_stderr_rest``."""
    import select

    fd, seen = p.stderr.fileno(), p.__dict__.setdefault("_err_seen", bytearray())
    deadline = time.monotonic() + timeout
    while text.encode() not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {text!r} on podrun's stderr within {timeout} s:\n{seen.decode(errors='replace')}"
        if select.select([fd], [], [], min(left, 0.1))[0]:
            chunk = os.read(fd, 65536)
            assert chunk, f"podrun ended before saying {text!r}:\n{seen.decode(errors='replace')}"
            seen += chunk
    return seen.decode(errors="replace")


def _stderr_rest(p, timeout: float) -> str:
    """All of podrun's stderr once it has ended: what _stderr_until read, then the rest."""
    rest = p.communicate(timeout=timeout)[1]
    return bytes(p.__dict__.get("_err_seen", b"")).decode(errors="replace") + rest


@pytest.mark.timeout(420)
@pytest.mark.parametrize("survivor", ["recovers", "stopped", "second", "killed"])
def test_survivors_of_a_cut_host_recover_in_place_with_the_losses_of_a_run_without_it(make_ssh_hosts, tmp_path,
                                                                                      survivor):
    """h3 cut after step 3. ``recovers``: the controller re-plans to 2 hosts and tells h1's and h2's agents, whose
    workers abandon their group, re-form it with the new world, take their share of the same global batch on 2
    replicas and go on in their own processes (one attempt, no restart spent): every update is logged once, the
    update in flight is redone once, the losses equal those of the run without the cut (relative 1e-5), and
    `podrun report` shows the path and its breakdown. ``stopped``: h2's worker is stopped (SIGSTOP) at the cut, so
    its abort hangs: the controller names it after its bound (15 s) and restarts the run the old way, from the
    snapshots, with the same losses. ``second`` (--elastic 1): h2 is cut too once the survivors were told the new
    plan (h1 waits for it in the new group): the recovery in place gives up, says why, and the run restarts on h1
    alone from the snapshots, every update logged once and the same losses. ``killed``: the controller is
    SIGKILLed once the survivors were told the new plan, before they trained again: every agent, ssh client and
    worker of the run on every host ends within the agents' bound on the controller's silence and the grace
    before SIGKILL (with room for a loaded machine)."""
    hosts = make_ssh_hosts(3)
    train, want = recipe_run(hosts, tmp_path)
    p = podrun_popen(*launch_args(hosts, hosts.hosts, tmp_path, "runs", "--global-batch", "12", "--elastic",
                                  "1" if survivor == "second" else "2"), "--", *train)
    stopped = None
    try:
        wait_step(tmp_path / "runs", 3, 150)
        if survivor == "stopped":
            stopped = _worker_of(tmp_path, 1)
        hosts.isolate("h3")
        if stopped is not None:
            os.kill(stopped, signal.SIGSTOP)
        if survivor in ("second", "killed"):
            told = _stderr_until(p, "recovering in place", 60)
            if survivor == "killed":
                p.kill()
                p.wait(timeout=10)
                _all_end(tmp_path, told)
                return
            hosts.isolate("h2")
        err = _stderr_rest(p, 200)
    finally:
        end(p)
    assert p.returncode == 0, err[-4000:]
    assert "re-planned 3 -> 2 hosts" in err and "recovering in place" in err, err
    rd = run_dir(tmp_path / "runs")
    logged = [json.loads(line) for line in (rd / "metrics.jsonl").read_text().splitlines()]
    for n, r in steps(rd).items():
        assert r["loss"] == pytest.approx(want[n], rel=1e-5), (n, r["loss"], want[n])
    s = summary(tmp_path / "runs")
    rp = s["elastic"]["replans"][0]
    text = podrun("report", str(rd), timeout=60).stdout
    line = next(x for x in text.splitlines() if "re-plan after step" in x)
    numbers = [r["step"] for r in logged if r["kind"] == "step"]
    if survivor == "second":
        assert "in-place recovery failed (h2 was lost too during the recovery); restarting every worker" in err, err
        assert "recovered in place" not in err, err
        assert s["exit_code"] == 0 and len(s["attempts"]) == 2, s
        assert numbers == list(range(1, INPLACE_STEPS + 1)), numbers      # none lost, none done twice
        assert rp["path"] == "restart" and rp["inplace_failed"] == "h2 was lost too during the recovery", rp
        assert sorted(rp["hosts_lost"]) == ["h2", "h3"] and rp["new"]["hosts"] == ["h1"], rp
        assert len(s["elastic"]["replans"]) == 1 and rp["new"]["global_batch"] == 12, s["elastic"]
        assert "restarted, not in place: h2 was lost too during the recovery" in line, text
        return
    assert rp["hosts_lost"] == ["h3"] and rp["new"]["hosts"] == ["h1", "h2"], rp
    assert rp["new"]["replicas"] == 2 and rp["new"]["global_batch"] == 12 and rp["old"]["replicas"] == 3, rp
    if survivor == "stopped":
        assert "in-place recovery failed (rank 1 on h2 did not abandon its group within 15 s)" in err, err
        assert s["exit_code"] == 0 and len(s["attempts"]) == 2 and len(s["elastic"]["replans"]) == 1, s
        assert rp["path"] == "restart" and rp["inplace_failed"].startswith("rank 1 on h2 did not abandon"), rp
        assert sorted(steps(rd)) == list(range(1, INPLACE_STEPS + 1))
        assert "restarted, not in place: rank 1 on h2 did not abandon its group" in line, text
        return
    assert "recovered in place" in err, err
    assert numbers == list(range(1, INPLACE_STEPS + 1)), numbers          # none lost, none done twice
    assert s["exit_code"] == 0 and len(s["attempts"]) == 1 and len(s["elastic"]["replans"]) == 1, s
    assert rp["path"] == "in-place" and rp["redone"] == rp["at_step"] + 1 and rp["at_step"] >= 3, rp
    assert rp["new"]["local_batch"] * rp["new"]["grad_accum"] == 6, rp
    parts = rp["breakdown"]
    assert all(isinstance(parts[k], float) and parts[k] >= 0 for k in ("abort", "reform", "reshard", "first_step"))
    assert rp["training_after_s"] > 0
    assert json.loads((rd / "plan.json").read_text())["hosts"] == ["h1", "h2"]
    assert "lost h3, 3 -> 2 hosts" in line and "recovered in place" in line, text
    assert all(f"{k} " in line for k in ("detection", "abort", "re-form", "re-shard", "first step")), line


def _all_end(tmp_path, told: str) -> None:
    """After the controller was SIGKILLed in the recovery (``told``: its stderr until then): every process of the
    run ends within the agents' bound on its silence (launch_args' --keepalive) and the grace before SIGKILL."""
    from podrun.wire.agent_args import GRACE_S
    from podrun.wire.liveness import settings

    assert "recovered in place" not in told, told          # killed during the recovery, not after it
    assert _run_pids(tmp_path), "no process of the run found: the check below would prove nothing"
    bound = settings(keepalive=KEEPALIVE).controller_silence + GRACE_S + 10.0      # 10 s: room for a loaded machine
    assert wait_until(lambda: not _run_pids(tmp_path), bound, 0.1), [(pid, _cmd(pid)) for pid in _run_pids(tmp_path)]


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:300]
    except OSError:
        return "(gone)"


def test_a_users_loop_recovers_in_place_through_the_runtime_hook(make_ssh_hosts, tmp_path):
    """tests/elastic/train_inplace.py (the tutorial's DDP script on podrun.runtime.inplace.loop) on 3 hosts at
    global batch 12, h3 cut after update 5: the survivors recover in place in their own processes (one attempt),
    every update is written once, and the losses equal those of the same training on one process over the whole
    global batch (relative 1e-5)."""
    from tests.elastic import train_inplace as script

    hosts = make_ssh_hosts(3)
    out = tmp_path / "losses.txt"
    steps_n = 30
    p = podrun_popen(*launch_args(hosts, hosts.hosts, tmp_path, "runs", "--global-batch", "12", "--elastic", "2"),
                     "--", hosts.python, str(Path(__file__).with_name("train_inplace.py")), "--steps", str(steps_n),
                     "--sleep", "0.2", "--out", str(out))
    try:
        assert wait_until(lambda: out.exists() and out.read_text().count("\n") >= 5, 120, 0.05), "no 5 updates"
        hosts.isolate("h3")
        err = p.communicate(timeout=150)[1]
    finally:
        end(p)
    assert p.returncode == 0, err[-4000:]
    assert "recovering in place" in err and "recovered in place" in err, err
    rows = [line.split() for line in out.read_text().splitlines()]
    assert [int(r[1]) for r in rows] == list(range(1, steps_n + 1)), rows      # none lost, none done twice
    assert {r[5] for r in rows[:5]} == {"3"} and rows[-1][5] == "2", rows
    model, opt = script.model_and_opt()
    for r in rows:
        x, y = script.batch(int(r[1]) - 1)
        opt.zero_grad()
        loss = script.loss_fn(model, x, y)
        loss.backward()
        opt.step()
        assert float(r[3]) == pytest.approx(loss.item(), rel=1e-5), (r, loss.item())
    s = summary(tmp_path / "runs")
    assert s["exit_code"] == 0 and len(s["attempts"]) == 1, s
    (rp,) = s["elastic"]["replans"]
    assert rp["path"] == "in-place" and rp["new"]["hosts"] == ["h1", "h2"] and rp["redone"] == rp["at_step"] + 1, rp
