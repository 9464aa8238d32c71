"""Planner: the seed table, decomposition properties, errors that name the nearest feasible batches."""
import pytest
from hypothesis import given, settings, strategies as st

from podrun.errors import PlanError
from podrun.plan import Overrides, make_plan
from podrun.plan.decompose import decompose, feasible, pipeline_bubble
from podrun.wire.worker_env import POPDIST_NAMES, PODRUN_NAMES, TORCHRUN_NAMES, worker_env, workers_per_instance
from podrun.plan.model import Plan
from podrun.specs import load_cluster, load_recipe
from tests.plan.plan_oracle import brute_force


@pytest.mark.parametrize("pod,replicas,ga,instances", [(16, 8, 256, 1), (64, 32, 64, 4), (128, 64, 32, 8), (256, 128, 16, 16)])
def test_seed_table_efficientnet_b4(pod, replicas, ga, instances):
    p = make_plan(load_cluster(f"ipu-pod{pod}"), load_recipe("efficientnet_b4"))
    assert (p.replicas, p.local_batch, p.grad_accum, p.global_batch) == (replicas, 3, ga, 6144)
    assert p.instances == instances and p.replicas_per_instance == 8 and p.devices_per_replica == 2
    assert p.pipeline_bubble == pytest.approx(1 / (ga + 1), abs=1e-6)
    assert p.learning_rate == pytest.approx(2 ** -9.5 * 6144, rel=1e-4)


def test_placement_covers_every_replica_once():
    p = make_plan(load_cluster("ipu-pod64"), load_recipe("efficientnet_b4"))
    seen = []
    for pl in p.placement:
        seen += range(pl.replica_offset, pl.replica_offset + pl.local_replicas)
        assert len(pl.devices) == pl.local_replicas * p.devices_per_replica
    assert seen == list(range(p.replicas))
    assert [pl.host for pl in p.placement] == list(p.hosts)


def test_instances_per_host_split_devices():
    p = make_plan(load_cluster("ipu-pod16"), load_recipe("efficientnet_b4"), Overrides(instances_per_host=2))
    assert p.instances == 2 and p.replicas_per_instance == 4
    assert p.placement[1].devices == tuple(range(8, 16)) and p.placement[1].local_index == 1


def test_lr_rescaled_linearly_and_said():
    p = make_plan(load_cluster("ipu-pod16"), load_recipe("efficientnet_b4"), Overrides(global_batch=3072))
    assert p.learning_rate == pytest.approx(8.4853 / 2)
    assert any("rescaled by the linear rule" in n for n in p.notes)


def test_unreachable_global_batch_names_neighbours():
    with pytest.raises(PlanError) as e:
        make_plan(load_cluster("ipu-pod16"), load_recipe("efficientnet_b4"), Overrides(global_batch=6150))
    msg = str(e.value)
    assert "6150" in msg and "6144 below" in msg and "6152 above" in msg
    assert "--global-batch 6144" in msg and "--global-batch 6152" in msg
    assert e.value.exit_code == 2


def test_devices_not_divisible_by_replica_size():
    with pytest.raises(PlanError, match="cannot be split into replicas of 2"):
        make_plan(load_cluster("ipu-pod16"), load_recipe("efficientnet_b4"), Overrides(devices_per_host=15))


def test_local_batch_above_max_is_refused():
    with pytest.raises(PlanError, match="exceeds the recipe's max local batch 3"):
        make_plan(load_cluster("ipu-pod16"), load_recipe("efficientnet_b4"), Overrides(local_batch=4))


def test_too_many_nodes():
    with pytest.raises(PlanError, match="more hosts than cluster 'ipu-pod64' has"):
        make_plan(load_cluster("ipu-pod64"), load_recipe("efficientnet_b4"), Overrides(nodes=5))


def test_abci_resnet50_fujitsu_decomposition():
    p = make_plan(load_cluster("abci"), load_recipe("resnet50"), Overrides(nodes=512))
    assert (p.replicas, p.local_batch, p.grad_accum, p.global_batch) == (2048, 40, 1, 81920)
    assert 0 < p.estimate.scaling_efficiency < 1


def test_bare_command_plan():
    p = make_plan(load_cluster("ipu-pod16").with_hosts(("a", "b"), 4), None)
    assert (p.replicas, p.local_batch, p.grad_accum) == (8, 1, 1)


def test_plan_json_round_trip():
    p = make_plan(load_cluster("ipu-pod64"), load_recipe("efficientnet_b4"))
    assert Plan.from_dict(p.to_dict()) == p


def test_env_contract_complete_and_consistent():
    p = make_plan(load_cluster("abci").with_hosts(("a", "b"), 4), load_recipe("resnet18_cifar10"),
                  Overrides(global_batch=64))
    envs = [worker_env(p, i, r, run_id="x", run_dir="/r", plan_path="/r/plan.json", master_addr="a", master_port=29500)
            for i in range(p.instances) for r in range(workers_per_instance(p))]
    assert sorted(int(e["RANK"]) for e in envs) == list(range(8))
    for e in envs:
        # PODRUN_SNAPSHOT_DIR only in a run that can restart (tests/runtime/test_snapshot.py)
        assert set(PODRUN_NAMES + TORCHRUN_NAMES) - {"PODRUN_SNAPSHOT_DIR"} == set(PODRUN_NAMES + TORCHRUN_NAMES) & set(e)
        assert e["WORLD_SIZE"] == "8" and e["LOCAL_WORLD_SIZE"] == "4" and e["PODRUN_GLOBAL_BATCH"] == "64"
    ipu = make_plan(load_cluster("ipu-pod64"), load_recipe("efficientnet_b4"))
    e = worker_env(ipu, 3, 0, run_id="x", run_dir="/r", plan_path="/p", master_addr="a", master_port=1)
    assert set(POPDIST_NAMES) <= set(e) and e["POPDIST_REPLICA_INDEX_OFFSET"] == "24" and e["WORLD_SIZE"] == "4"


# -- properties ---------------------------------------------------------------------------------

sizes = st.integers(min_value=1, max_value=64)


@settings(max_examples=400, deadline=None)
@given(hosts=st.integers(1, 32), dph=st.sampled_from([1, 2, 4, 8, 16]), p=st.sampled_from([1, 2, 4]),
       max_local=st.integers(1, 64), min_ga=st.integers(1, 8), data=st.data())
def test_planner_succeeds_exactly_when_a_decomposition_exists(hosts, dph, p, max_local, min_ga, data):
    """Both directions: a refusal is checked against a brute-force search as much as a plan is, so a
    planner that wrongly refused a reachable global batch fails here."""
    # half the draws build g from a decomposition near the limits (local batch up to max_local + 1, GA from
    # min_ga - 1), so that the edges of feasibility are drawn often, not only by chance
    if data.draw(st.booleans(), label="built") and (hosts * dph) % p == 0:
        b = data.draw(st.integers(1, max_local + 1), label="b")
        a = data.draw(st.integers(max(1, min_ga - 1), min_ga + 8), label="a")
        g = hosts * dph // p * b * a
        lb = data.draw(st.sampled_from([None, b, max(1, b - 1)]), label="lb")
        ga = data.draw(st.sampled_from([None, a, a + 1]), label="ga")
    else:
        g = data.draw(st.integers(1, 20000), label="g")
        lb = data.draw(st.one_of(st.none(), sizes), label="lb")
        ga = data.draw(st.one_of(st.none(), sizes), label="ga")
    found = brute_force(devices=hosts * dph, devices_per_replica=p, instances=hosts, max_local=max_local,
                        min_ga=min_ga, g=g, lb=lb, ga=ga)
    try:
        d = decompose(devices=hosts * dph, devices_per_replica=p, instances=hosts, max_local_batch=max_local,
                      min_grad_accum=min_ga, global_batch=g, local_batch=lb, grad_accum=ga)
    except PlanError as exc:
        assert not found, f"refused {g} though {found[-1]} (local batch, GA) meets it: {exc}"
        assert exc.exit_code == 2 and str(exc)
        return
    assert found, f"planned {d} though no decomposition meets {g}"
    assert d.local_batch * d.replicas * d.grad_accum == g
    assert d.replicas * p == hosts * dph and d.replicas % hosts == 0
    assert 1 <= d.local_batch <= max_local and d.grad_accum >= min_ga
    assert (d.local_batch, d.grad_accum) in found
    if lb is not None:
        assert d.local_batch == lb
    if ga is not None:
        assert d.grad_accum == ga
    if lb is None and ga is None:   # the largest local batch that works
        assert d.local_batch == max(b for b, _ in found)


@settings(max_examples=300, deadline=None)
@given(replicas=st.integers(1, 256), max_local=st.integers(1, 32), min_ga=st.integers(1, 4), g=st.integers(1, 50000))
def test_feasible_agrees_with_brute_force(replicas, max_local, min_ga, g):
    """The planner's own oracle (used for the neighbours it offers) against the brute-force one."""
    d = feasible(g, replicas, max_local, min_ga, None, None)
    found = brute_force(devices=replicas, devices_per_replica=1, instances=1, max_local=max_local,
                        min_ga=min_ga, g=g, lb=None, ga=None)
    assert (d is None) == (not found)
    if d is not None:
        assert (d.local_batch, d.grad_accum) == max(found)


@settings(max_examples=300, deadline=None)
@given(replicas=st.integers(1, 256), max_local=st.integers(1, 32), g=st.integers(1, 50000))
def test_infeasible_error_offers_feasible_neighbours(replicas, max_local, g):
    def reachable(n):
        return bool(brute_force(devices=replicas, devices_per_replica=1, instances=1, max_local=max_local,
                                min_ga=1, g=n, lb=None, ga=None))

    if reachable(g):
        decompose(devices=replicas, devices_per_replica=1, instances=1, max_local_batch=max_local,
                  min_grad_accum=1, global_batch=g)
        return
    with pytest.raises(PlanError) as e:
        decompose(devices=replicas, devices_per_replica=1, instances=1, max_local_batch=max_local,
                  min_grad_accum=1, global_batch=g)
    import re
    offered = [int(n) for n in re.findall(r"--global-batch (\d+)", e.value.hint or "")]
    assert offered, e.value.hint
    for n in offered:
        assert reachable(n)


@given(p=st.integers(1, 8), ga=st.integers(1, 512))
def test_bubble_in_range(p, ga):
    b = pipeline_bubble(p, ga)
    assert 0 <= b < 1 and (b == 0) == (p == 1)
