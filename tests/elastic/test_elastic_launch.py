"""The elastic re-plan decision, exhaustively: dropped hosts, spares, the floor, the kept global batch."""
import itertools
import os
import json

import pytest

from podrun.elastic.replan import (ElasticPolicy, describe, failed_hosts, first_step_after, last_step, next_plan,
                                   resumed_after)
from podrun.plan import Overrides, make_plan
from podrun.elastic.table import elastic_table
from podrun.rundir.metrics import StepLog
from podrun.rundir.summary import Summary
from podrun.specs import load_cluster, load_recipe

POD256 = load_cluster("ipu-pod256")
EFF = load_recipe("efficientnet_b4")


def policy(min_hosts, spares=(), cluster=POD256, recipe=EFF, ov=Overrides()):
    g = make_plan(cluster, recipe, ov).global_batch
    return ElasticPolicy(cluster, recipe, ov, g, min_hosts, tuple(spares))


def test_one_lost_host_of_16_goes_to_12():
    pol = policy(8)
    cur = make_plan(POD256, EFF)
    r = next_plan(pol, cur, ["pod256-host3"])
    assert r.reason is None and r.hosts_lost == ("pod256-host3",) and r.spares_used == ()
    p = r.plan
    assert len(p.hosts) == 12 and "pod256-host3" not in p.hosts
    assert (p.replicas, p.local_batch, p.grad_accum, p.global_batch) == (96, 2, 32, 6144)
    assert p.learning_rate == cur.learning_rate
    # 15, 14, 13 were tried and refused; the 3 healthy hosts left out wait as spares
    assert [n for n, _ in r.skipped] == [15, 14, 13]
    assert r.spares_left == ("pod256-host13", "pod256-host14", "pod256-host15")
    assert p.hosts == tuple(h for h in cur.hosts if h != "pod256-host3")[:12]


def test_spare_takes_the_lost_hosts_place():
    pol = policy(8, spares=("spare-a", "spare-b"))
    cur = make_plan(POD256, EFF)
    r = next_plan(pol, cur, ["pod256-host5"])
    assert r.spares_used == ("spare-a",) and r.spares_left == ("spare-b",)
    assert r.plan.hosts[5] == "spare-a" and len(r.plan.hosts) == 16
    assert (r.plan.replicas, r.plan.grad_accum) == (cur.replicas, cur.grad_accum)
    assert r.plan.placement[5].host == "spare-a"


def test_below_min_ends_with_the_reason():
    pol = policy(16)
    r = next_plan(pol, make_plan(POD256, EFF), ["pod256-host0"])
    assert r.plan is None and "15 host(s) left after losing pod256-host0, fewer than the elastic minimum 16" == r.reason


def test_no_exact_count_above_min_ends_with_every_reason():
    pol = policy(9)
    r = next_plan(pol, make_plan(POD256, EFF), ["pod256-host0", "pod256-host1", "pod256-host2", "pod256-host3",
                                                 "pod256-host4"])
    assert r.plan is None
    assert r.reason.startswith("no host count from 11 down to 9 keeps global batch 6144 exactly (11 hosts: ")
    assert "9 hosts: global batch 6144 is not a multiple of 72 replicas" in r.reason
    line = describe(r, make_plan(POD256, EFF), 120, "host pod256-host0 lost")
    assert line.startswith("elastic: dropping pod256-host0, pod256-host1, pod256-host2, pod256-host3, pod256-host4 "
                           "(host pod256-host0 lost) after step 120; the run cannot continue: no host count")


def test_describe_a_replan():
    cur = make_plan(POD256, EFF)
    r = next_plan(policy(8), cur, ["pod256-host3"])
    assert describe(r, cur, None) == (
        "elastic: dropping pod256-host3; re-planned 16 -> 12 hosts: 3 x 128 x GA 16 -> 2 x 96 x GA 32 = global batch 6144;"
        " resuming from the newest snapshot a survivor holds, else the last checkpoint")


def test_failure_not_on_a_host_of_the_plan_keeps_the_plan():
    cur = make_plan(POD256, EFF)
    r = next_plan(policy(8), cur, [])
    assert r.plan.hosts == cur.hosts and r.hosts_lost == ()


# Exhaustive: every subset of failed hosts of a 6-host cluster, every floor, with and without spares.
SIX = load_cluster("abci").with_hosts(tuple(f"h{i}" for i in range(6)), 4)
R18 = load_recipe("resnet18_cifar10")


@pytest.mark.parametrize("g", [96, 120, 72])
def test_exhaustive_small_cluster(g):
    ov = Overrides(global_batch=g)
    start = make_plan(SIX, R18, ov)
    for k in range(0, 7):
        for failed in itertools.combinations(start.hosts, k):
            for mn in range(1, 7):
                for spares in ((), ("s1",), ("s1", "s2", "s3")):
                    pol = ElasticPolicy(SIX, R18, ov, g, mn, spares)
                    r = next_plan(pol, start, failed)
                    left = 6 - k + min(k, len(spares))
                    assert r.hosts_lost == failed
                    assert r.spares_used == spares[:min(k, len(spares))]
                    if left < mn:
                        assert r.plan is None and "fewer than the elastic minimum" in r.reason
                        continue
                    survivors = [h for h in start.hosts if h not in failed]
                    table = elastic_table(SIX.with_hosts(tuple(survivors + list(r.spares_used)), 4), R18, ov, mn, left,
                                          global_batch=g)
                    best = next((row.hosts for row in table.rows if row.feasible), None)
                    if best is None:
                        assert r.plan is None and r.reason.startswith(f"no host count from {left} down to {mn}")
                        continue
                    p = r.plan
                    assert len(p.hosts) == best and p.global_batch == g
                    assert p.local_batch * p.replicas * p.grad_accum == g
                    assert not set(p.hosts) & set(failed)
                    assert set(p.hosts) | set(r.spares_left) == set(survivors) | set(spares)
                    assert not set(p.hosts) & set(r.spares_left)


def test_failed_hosts_prefers_lost_instances_over_the_root_cause():
    inst = [{"index": 0, "host": "a", "status": "failed", "exit_code": 1},
            {"index": 1, "host": "b", "status": "lost", "exit_code": 255},
            {"index": 2, "host": "c", "status": "failed", "exit_code": 255}]
    assert failed_hosts(_summary(inst, {"host": "a"})) == ("b", "c")
    # a worker that itself exits 255 (its exit was reported) is a failure, not a lost host
    # (b's worker failed first; a's worker then exited 255 on its own)
    worker_255 = [{"index": 0, "host": "a", "status": "failed", "exit_code": 255, "workers": {"0": 255}},
                  {"index": 1, "host": "b", "status": "failed", "exit_code": 1, "workers": {"0": 1}}]
    assert failed_hosts(_summary(worker_255, {"host": "b"})) == ("b",)
    assert failed_hosts(_summary(inst[:1], {"host": "a"})) == ("a",)
    assert failed_hosts(_summary(inst[:1], None)) == ()
    # a survivor whose agent srun's abort of the step killed as the run ended (joined agents): terminated, not lost
    aborted = [{**inst[1], "host": "b"}, {"index": 2, "host": "c", "status": "terminated", "exit_code": 255}]
    assert failed_hosts(_summary(aborted, {"host": "b"})) == ("b",)


def _summary(instances, root_cause):
    return Summary.from_dict({"instances": instances, "root_cause": root_cause})


def test_steps_from_metrics(tmp_path):
    rows = [{"kind": "run", "event": "start", "time": 1.0}, {"kind": "step", "step": 1, "time": 2.0},
            {"kind": "step", "step": 2, "time": 3.0}, {"kind": "run", "event": "resume", "time": 9.0},
            {"kind": "step", "step": 3, "time": 10.0}]
    assert last_step(StepLog.read(tmp_path)) == (None, None)
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    log = StepLog.read(tmp_path)
    assert last_step(log) == (3, 10.0)
    assert first_step_after(log, 3.5) == (3, 10.0)
    assert first_step_after(log, 10.0) == (None, None)
    assert resumed_after(log, 0.5) == {"step": 0, "source": None, "from_rank": None}
    assert resumed_after(log, 3.0) == {"step": None, "source": None, "from_rank": None}
    assert resumed_after(log, 9.0) is None


def test_policy_spares_are_the_option_then_hosts_left_out():
    from podrun.elastic.replan import make_policy

    cluster = load_cluster("abci").with_hosts(("a", "b", "c", "d", "e"), 4)
    ov = Overrides(nodes=3, global_batch=48)
    plan = make_plan(cluster, R18, ov)
    pol = make_policy(cluster, R18, ov, plan, 2, "x,y:4", max_restarts=2)
    assert pol.spares == ("x", "y", "d", "e") and pol.global_batch == 48 and pol.min_hosts == 2
    assert pol.cluster.hosts == ("a", "b", "c") and pol.overrides.nodes is None


@pytest.mark.parametrize("args,needle", [
    (["--elastic", "2", "--max-restarts", "0", "--hosts", "a,b,c"],
     "--elastic 2 re-plans on a restart, and --max-restarts is 0"),
    (["--elastic", "3", "--hosts", "a,b,c"], "the run can lose no host"),
    (["--elastic", "4", "--max-restarts", "1", "--hosts", "a,b,c"], "the minimum must be between 1 and the plan's 3 hosts"),
    (["--elastic", "0", "--max-restarts", "1", "--hosts", "a,b,c"], "--elastic: 0 is outside 1.."),
    (["--elastic", "2", "--max-restarts", "1", "--hosts", "a,b,c", "--spare-hosts", "b"], "--spare-hosts b is already one"),
    (["--elastic", "2", "--max-restarts", "1", "--hosts", "a:2,b:2", "--spare-hosts", "c:4"], "the plan needs 2 devices per host"),
    (["--elastic", "2", "--max-restarts", "1", "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1",
      "--run-id", "r"], "one podrun per node (--node-rank) runs one attempt"),
    (["--spare-hosts", "x"], "--spare-hosts takes effect only in an elastic run"),
])
def test_launch_refuses_before_starting_anything(args, needle):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "podrun", "launch", *args, "--", "true"], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "PODRUN_JOIN_KEY": "k" * 32})     # a copy's key: its refusal
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_replanned_attempt_checks_its_hosts_again(tmp_path):
    """Preflight runs on the first attempt and on every re-planned one (spares are first contacted there),
    not on a plain restart of the same hosts, and never with --no-preflight."""
    from dataclasses import replace

    from podrun.cli.options import resolve_plan
    from podrun.launch.run import build_request

    plan = resolve_plan(None, hosts_opt="localhost", devices_per_host=1, environ={})[0]
    req = build_request(plan, ["true"], transport="local", runs_dir=str(tmp_path))
    assert req.checks_hosts() and not req.for_restart(1, 0).checks_hosts()
    assert replace(req, replanned=True).for_restart(2, 0).checks_hosts()
    assert not replace(req, replanned=True, preflight=False).for_restart(1, 0).checks_hosts()
    assert not replace(req, preflight=False).checks_hosts()


def test_summary_is_written_once_an_attempt_and_once_at_the_end(tmp_path, monkeypatch, capsys):
    """An elastic run on this machine's two names: the first attempt fails, the run re-plans to one host, the second
    fails and no plan is left. summary.json is written once per attempt (after its restart or re-plan is decided)
    and once at the end (the account closed); what --json prints is the last record written, and it reads back as
    the same typed value, every status an enum."""
    from podrun.cli.main import main
    from podrun.launch import run
    from podrun.rundir.summary import RunStatus, read_summary

    written = []
    real = run.save_summary

    def counted(run_dir, summary):
        written.append(summary)
        return real(run_dir, summary)

    monkeypatch.setattr(run, "save_summary", counted)
    monkeypatch.chdir(tmp_path)
    rc = main(["launch", "--runs-dir", str(tmp_path / "runs"), "--hosts", "localhost,127.0.0.1",
               "--devices-per-host", "1", "--elastic", "1", "--max-restarts", "5", "--json", "--", "sh", "-c",
               "exit 5"])
    out = capsys.readouterr().out
    assert rc == 5
    run_dir = next((tmp_path / "runs").iterdir())
    s = read_summary(run_dir)
    assert [a.status for a in s.attempts] == [RunStatus.FAILED, RunStatus.FAILED] and s.status is RunStatus.FAILED
    assert len(written) == len(s.attempts) + 1 and len(s.replans) == 2 and s.account.until is not None
    assert json.loads(out) == json.loads((run_dir / "summary.json").read_text()) == written[-1].to_dict()
