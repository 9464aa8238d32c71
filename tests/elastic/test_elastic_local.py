"""Elastic restarts with the local transport (4 loopback aliases): the record a re-plan leaves in the run dir."""
from __future__ import annotations

import json
import sys

from tests.launch.helpers import podrun, run_dir, summary
from tests.ports import free_port

HOSTS = "localhost,127.0.0.2,127.0.0.3,127.0.0.4"
# instance 2 fails while the run has 4 instances; on any other plan every instance succeeds
FAIL_ON_4 = ('import os, sys; e = os.environ; print("rank", e["RANK"], "of", e["WORLD_SIZE"], "GA", '
             'e["PODRUN_GRAD_ACCUM"], "G", e["PODRUN_GLOBAL_BATCH"]); '
             'sys.exit(3 if e["PODRUN_NUM_INSTANCES"] == "4" and e["PODRUN_INSTANCE_INDEX"] == "2" else 0)')


def launch_fail_on_4(tmp_path, min_hosts: int):
    """FAIL_ON_4 on the 4 loopback hosts with --elastic MIN_HOSTS and two restarts."""
    return podrun("launch", "--hosts", HOSTS, "--devices-per-host", "1", "--elastic", str(min_hosts),
                  "--max-restarts", "2", "--master-port", str(free_port(6)), "--runs-dir", str(tmp_path / "runs"),
                  "--", sys.executable, "-c", FAIL_ON_4)


def test_failed_instance_host_is_dropped_and_every_plan_kept(tmp_path):
    cp = launch_fail_on_4(tmp_path, min_hosts=2)
    assert cp.returncode == 0, cp.stderr
    assert ("podrun: elastic: dropping 127.0.0.3 (exited with code 3); re-planned 4 -> 2 hosts: "
            "1 x 4 x GA 1 -> 1 x 2 x GA 2 = global batch 4; resuming from the newest snapshot a survivor holds, else the last checkpoint") in cp.stderr
    assert "rank 1 of 2 GA 2 G 4" in cp.stdout
    rd = run_dir(tmp_path / "runs")
    plans = {n: json.loads((rd / n).read_text()) for n in ("plan-0.json", "plan-1.json", "plan.json")}
    assert plans["plan-0.json"]["hosts"] == HOSTS.split(",")
    assert plans["plan-1.json"] == plans["plan.json"] and plans["plan.json"]["hosts"] == ["localhost", "127.0.0.2"]
    s = summary(tmp_path / "runs")
    assert s["exit_code"] == 0 and [a["plan"] for a in s["attempts"]] == ["plan-0.json", "plan-1.json"]
    rp = s["elastic"]["replans"][0]
    assert rp["hosts_lost"] == ["127.0.0.3"] and rp["skipped"] == [
        {"hosts": 3, "reason": "global batch 4 is not a multiple of 3 replicas"}]
    assert (rp["old"]["grad_accum"], rp["new"]["grad_accum"], rp["new"]["global_batch"]) == (1, 2, 4)
    assert rp["restarted_after_s"] > 0 and rp["training_after_s"] is None and rp["at_step"] is None  # no metrics
    assert s["elastic"]["spares"] == ["127.0.0.4"]       # the healthy host the 2-host plan left out
    # podrun report says it too, for a plain command's run
    rep = podrun("report", str(rd))
    assert rep.returncode == 0, rep.stderr
    assert "re-plan: lost 127.0.0.3, 4 -> 2 hosts (local batch 1 x GA 1 -> 1 x GA 2), global batch 4" in rep.stdout
    rep = json.loads(podrun("report", "--json", str(rd)).stdout)
    assert [(r["hosts_lost"], r["new"]["grad_accum"]) for r in rep["replans"]] == [(["127.0.0.3"], 2)]


def test_no_exact_plan_ends_with_the_failures_code(tmp_path):
    cp = launch_fail_on_4(tmp_path, min_hosts=3)
    assert cp.returncode == 3, cp.stderr
    assert ("the run cannot continue: no host count from 3 down to 3 keeps global batch 4 exactly "
            "(3 hosts: global batch 4 is not a multiple of 3 replicas)") in cp.stderr
    s = summary(tmp_path / "runs")
    assert s["status"] == "failed" and s["root_cause"]["host"] == "127.0.0.3" and len(s["attempts"]) == 1
    assert s["elastic"]["end"].startswith("no host count from 3 down to 3")
    assert not (run_dir(tmp_path / "runs") / "plan-1.json").exists()


# instance 2 hangs at step 2 while the run has 3 instances (the others then wait in all_reduce); on 2 it finishes
HANG_ON_3 = ('import os, sys, time, torch, torch.distributed as dist; dist.init_process_group("gloo"); '
             'e = os.environ; hang = e["PODRUN_NUM_INSTANCES"] == "3" and e["PODRUN_INSTANCE_INDEX"] == "2"\n'
             'for step in range(4):\n'
             '    if hang and step == 2: time.sleep(3600)\n'
             '    t = torch.ones(1); dist.all_reduce(t); print("step", step, "world", int(t.item()), flush=True)\n'
             'dist.barrier(); dist.destroy_process_group()\n')


def test_a_hung_host_is_dropped_like_a_lost_one(tmp_path):
    """In an elastic run, a hang (no progress from any rank for --hang-timeout) ends the attempt with the hung
    rank's host as the failure: it is dropped, the run re-plans on the others at the same global batch and
    finishes there."""
    cp = podrun("launch", "--hosts", "localhost,127.0.0.2,127.0.0.3", "--devices-per-host", "1",
                "--global-batch", "6", "--elastic", "2", "--hang-timeout", "4", "--master-port", str(free_port(6)),
                "--runs-dir", str(tmp_path / "runs"), "--", sys.executable, "-c", HANG_ON_3, timeout=240)
    assert cp.returncode == 0, cp.stderr
    assert "no progress from any rank for 4.0 s" in cp.stderr, cp.stderr
    assert "podrun: elastic: dropping 127.0.0.3" in cp.stderr and "re-planned 3 -> 2 hosts" in cp.stderr, cp.stderr
    assert "step 3 world 2" in cp.stdout, cp.stdout
    s = summary(tmp_path / "runs")
    assert s["exit_code"] == 0 and len(s["attempts"]) == 2
    assert s["elastic"]["replans"][0]["hosts_lost"] == ["127.0.0.3"]
