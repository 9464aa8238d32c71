"""Elastic tables: the same global batch on every feasible host count, reasons for the others, the CLI."""
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from podrun.errors import PlanError
from podrun.plan import Overrides, make_plan
from podrun.elastic.table import elastic_table, parse_range
from podrun.specs import load_cluster, load_recipe
from tests.plan.plan_oracle import brute_force

PODRUN = [sys.executable, "-m", "podrun"]


def test_pod256_efficientnet_down_to_8_hosts():
    t = elastic_table(load_cluster("ipu-pod256"), load_recipe("efficientnet_b4"), Overrides(), 8)
    assert [r.hosts for r in t.rows] == list(range(16, 7, -1))
    ok = {r.hosts: (r.plan.replicas, r.plan.local_batch, r.plan.grad_accum) for r in t.rows if r.feasible}
    assert ok == {16: (128, 3, 16), 12: (96, 2, 32), 8: (64, 3, 32)}
    bad = {r.hosts: r.reason for r in t.rows if not r.feasible}
    assert bad[15] == "global batch 6144 is not a multiple of 120 replicas"
    assert set(bad) == {15, 14, 13, 11, 10, 9}
    # the top row is the plan `podrun plan` gives on all the hosts
    full = make_plan(load_cluster("ipu-pod256"), load_recipe("efficientnet_b4"))
    top = t.rows[0].plan
    assert (top.replicas, top.local_batch, top.grad_accum, top.learning_rate) == \
        (full.replicas, full.local_batch, full.grad_accum, full.learning_rate)


def test_reason_from_the_planner_when_divisible():
    t = elastic_table(load_cluster("ipu-pod64"), load_recipe("efficientnet_b4"), Overrides(global_batch=64), 1)
    r4 = t.rows[0]
    assert r4.hosts == 4 and not r4.feasible
    assert r4.reason == "global batch 64 cannot be reached exactly with 32 replicas (max local batch 3, min GA 4)"


def test_max_defaults_to_nodes_and_range_checks():
    t = elastic_table(load_cluster("ipu-pod256"), load_recipe("efficientnet_b4"), Overrides(nodes=12), 10)
    assert [r.hosts for r in t.rows] == [12, 11, 10]
    with pytest.raises(PlanError, match="more hosts than cluster 'ipu-pod64' has"):
        elastic_table(load_cluster("ipu-pod64"), load_recipe("efficientnet_b4"), Overrides(), 2, 9)
    with pytest.raises(PlanError, match="1 <= MIN <= MAX"):
        elastic_table(load_cluster("ipu-pod64"), load_recipe("efficientnet_b4"), Overrides(), 5)


@pytest.mark.parametrize("text,expected", [("8", (8, None)), ("8:16", (8, 16)), ("1:1", (1, 1))])
def test_parse_range(text, expected):
    assert parse_range(text) == expected


@pytest.mark.parametrize("text", ["0", "-1", "x", "8:4", "8:", ":8", "1.5"])
def test_parse_range_refuses(text):
    with pytest.raises(PlanError) as e:
        parse_range(text)
    assert e.value.exit_code == 2 and "--elastic" in e.value.message


def test_bare_command_pins_the_batch_of_the_full_plan():
    cluster = load_cluster("ipu-pod16").with_hosts(("a", "b", "c", "d"), 2)
    t = elastic_table(cluster, None, Overrides(), 1)
    assert t.global_batch == 8
    assert [(r.hosts, r.plan.grad_accum if r.feasible else None) for r in t.rows] == [(4, 1), (3, None), (2, 2), (1, 4)]


# -- properties ---------------------------------------------------------------------------------

@settings(max_examples=150, deadline=None)
@given(hosts=st.integers(1, 12), dph=st.sampled_from([1, 2, 4, 8]), min_hosts=st.integers(1, 12),
       which=st.integers(0, 2), data=st.data())
def test_each_row_is_feasible_exactly_when_a_decomposition_exists(hosts, dph, min_hosts, which, data):
    """Every row against a brute-force search, in both directions: a row the planner wrongly refuses
    fails here as much as a row that misses the global batch."""
    recipe, base = [("efficientnet_b4", "ipu-pod16"), ("resnet50", "abci"), ("resnet18_cifar10", "local")][which]
    cluster = load_cluster(base).with_hosts(tuple(f"h{i}" for i in range(hosts)), dph)
    rec = load_recipe(recipe)
    dev = cluster.device
    p = rec.lookup("devices_per_replica", dev.key, dev.kind)
    max_local = rec.lookup("max_local_batch", dev.key, dev.kind)
    min_ga = rec.lookup("min_grad_accum", dev.key, dev.kind) or 1
    iph = cluster.instances_per_host
    # half the draws build g from a decomposition on one of the host counts, so that feasible rows are common
    n0 = data.draw(st.integers(1, hosts), label="n0")
    if data.draw(st.booleans(), label="built") and (n0 * dph) % p == 0:
        b = data.draw(st.integers(1, max_local + 1), label="b")
        g = n0 * dph // p * b * data.draw(st.sampled_from([max(1, min_ga - 1), min_ga, min_ga + 1, 2 * min_ga + 3]), label="a")
        lb = data.draw(st.sampled_from([None, b]), label="lb")
    else:
        g = data.draw(st.integers(1, 4096), label="g")
        lb = data.draw(st.one_of(st.none(), st.integers(1, 8)), label="lb")
    ov = Overrides(global_batch=g, local_batch=lb)
    if min_hosts > hosts:
        with pytest.raises(PlanError) as e:
            elastic_table(cluster, rec, ov, min_hosts)
        assert e.value.exit_code == 2
        return
    t = elastic_table(cluster, rec, ov, min_hosts)
    assert t.global_batch == g
    assert [r.hosts for r in t.rows] == list(range(hosts, min_hosts - 1, -1))
    for r in t.rows:
        found = [] if (dph // iph) % p else brute_force(
            devices=r.hosts * dph, devices_per_replica=p, instances=r.hosts * iph, max_local=max_local,
            min_ga=min_ga, g=g, lb=lb, ga=None)
        assert r.feasible == bool(found), (r.hosts, g, lb, found, r.reason)
        d = r.to_dict()
        if r.feasible:
            p_ = r.plan
            assert p_.local_batch * p_.replicas * p_.grad_accum == g == p_.global_batch == d["global_batch"]
            assert (p_.local_batch, p_.grad_accum) in found
            assert len(p_.hosts) == r.hosts and r.reason is None
            assert {"hosts", "replicas", "local_batch", "grad_accum", "global_batch"} <= set(d)
            if lb is not None:
                assert p_.local_batch == lb
        else:
            assert r.reason and d["reason"] == r.reason and d["hosts"] == r.hosts
    assert len({r.plan.learning_rate for r in t.rows if r.feasible}) <= 1


# -- the command --------------------------------------------------------------------------------

def run(*args):
    env = {**os.environ, "COLUMNS": "200"}      # one line per row, so a row's text can be searched
    return subprocess.run(PODRUN + list(args), capture_output=True, text=True, timeout=60, env=env)


def test_cli_json_and_table():
    r = run("plan", "--pod", "256", "recipes/efficientnet_b4", "--elastic", "8", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert [e["hosts"] for e in d["elastic"]] == list(range(16, 7, -1))
    assert all(e["global_batch"] == 6144 for e in d["elastic"] if e["feasible"])
    assert d["elastic"][1] == {"hosts": 15, "feasible": False,
                               "reason": "global batch 6144 is not a multiple of 120 replicas"}
    t = run("plan", "--pod", "256", "recipes/efficientnet_b4", "--elastic", "8:12")
    assert t.returncode == 0 and "not a multiple of 88 replicas" in t.stdout and "127,093" not in t.stdout
    assert "2 of 5 host counts keep global batch 6144 exactly" in t.stdout
    narrow = subprocess.run(PODRUN + ["plan", "--pod", "256", "recipes/efficientnet_b4", "--elastic", "8"],
                            capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "80"})
    lines = narrow.stdout.splitlines()     # one line per host count, in 80 columns; durations as a person reads them
    assert max(len(line.rstrip()) for line in lines) <= 80 and len(lines) <= 9 + 10, narrow.stdout
    assert "  15 hosts: global batch 6144 is not a multiple of 120 replicas" in lines, narrow.stdout
    assert any(line.split()[:1] == ["16"] and line.endswith("58 min 48 s") for line in map(str.rstrip, lines))


@pytest.mark.parametrize("args,needle", [
    (["--elastic", "0"], "--elastic 0: host counts need 1 <= MIN <= MAX"),
    (["--elastic", "2:9"], "elastic MAX 9 is more hosts than cluster 'ipu-pod64' has (4)"),
    (["--elastic", "a:b"], "is not MIN or MIN:MAX"),
])
def test_cli_bad_range_exit_2(args, needle):
    r = run("plan", "--pod", "64", "recipes/efficientnet_b4", *args)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr
