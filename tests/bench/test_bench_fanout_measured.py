"""bench/bench_fanout.py's measured model: the per-host costs it fits from a scale run's JSON, and what it leaves out."""
from __future__ import annotations

import json

import pytest

from bench import bench_fanout as bf


def _scale_json(tmp_path, runs: dict) -> object:
    """A scale record holding ``runs`` ({(subject, hosts, per_host): [figures]}) as bench_scale writes them."""
    raw = [{"subject": s, "hosts": n, "per_host": k, "runs": v} for (s, n, k), v in runs.items()]
    path = tmp_path / "scale-20261125-0000.json"
    path.write_text(json.dumps({"rows": [{"benchmark": "scale raw", "raw": raw}]}))
    return path


def _fig(n: int, cpu_per_host: float, fixed: float, idle_per_host: float, up: float) -> dict:
    return {"cpu_up_s": fixed + cpu_per_host * n, "idle_cpu_frac": idle_per_host * n, "up_s": up}


def test_the_fit_recovers_the_per_host_costs(tmp_path):
    s = "podrun ssh (OpenSSH)"
    path = _scale_json(tmp_path, {(s, n, 4): [_fig(n, 0.09, 0.3, 0.0015, 2.0 + 0.1 * n)] for n in (8, 16, 32, 64)})
    fit = bf.measured(path, s, 4)
    assert fit["cpu_per_host_s"] == pytest.approx(0.09) and fit["cpu_fixed_s"] == pytest.approx(0.3)
    assert fit["heartbeat_cpu_per_host"] == pytest.approx(0.0015)
    assert fit["sizes"] == [8, 16, 32, 64] and fit["up_largest_s"] == pytest.approx(8.4)
    assert fit["start_s"] == pytest.approx(2.8 - 0.09 * 8)     # the smallest size's launch less its per-host CPU


def test_one_size_or_another_subject_gives_no_fit(tmp_path):
    s = "podrun ssh (OpenSSH)"
    path = _scale_json(tmp_path, {(s, 64, 4): [_fig(64, 0.09, 0.3, 0.001, 9.0)],
                                  ("mpirun (Open MPI) tree", 8, 4): [_fig(8, 0.07, 0.0, 0.0, 2.0)]})
    assert bf.measured(path, s, 4) is None                       # a line needs two sizes
    assert bf.measured(path, s, 1) is None
    assert bf.measured(path, "pdsh", 4) is None


def test_the_projection_spends_the_cpu_on_one_core(tmp_path, monkeypatch):
    monkeypatch.setattr(bf, "simulate", lambda hosts, preflight, cost=None: 0.25)   # podrun's own pools, stubbed
    assert bf.measured_model(512, {"cpu": 0.09, "start": 2.0}) == pytest.approx(0.25 + 0.09 * 512 + 2.0)


def test_mpirun_tree_levels():
    assert [bf.tree_levels(n) for n in (8, 64, 65, 512, 4096, 4097)] == [1, 1, 2, 2, 2, 3]


def test_a_tree_launch_costs_the_root_one_level_of_hosts_and_a_remote_start_per_level(tmp_path):
    """Inside a Grid Engine job both podrun --transport mpirun and mpirun launch through Open MPI's tree: the root's
    CPU per host counts for the first level only (TREE_RADIX hosts), the remote start once per level, and both
    subjects are projected by the same model."""
    s, peer = "podrun mpirun, Grid Engine qrsh", "mpirun (Open MPI), Grid Engine qrsh"
    path = _scale_json(tmp_path, {
        **{(s, n, 4): [_fig(n, 0.02, 1.0, 0.001, 3.0 + 0.02 * n)] for n in (8, 64)},
        **{(peer, n, 4): [_fig(n, 0.01, 0.1, 0.0, 2.0 + 0.01 * n)] for n in (8, 64)}})
    fit = bf.measured(path, s, 4)
    assert bf.tree_model(64, fit) == pytest.approx(0.02 * 64 + 3.0)
    assert bf.tree_model(512, fit) == pytest.approx(0.02 * 64 + 3.0 * 2)       # 8 x 64: two levels
    [r512] = [r for r in bf.projected_tree([path], s, peer) if "512 hosts" in r["subject"]]
    assert r512["value"] == pytest.approx(0.02 * 64 + 6.0, abs=1e-3)
    assert r512["peer_value"] == pytest.approx(0.01 * 64 + 2.0 * 2, abs=1e-3)
    assert r512["ratio"] == pytest.approx(r512["value"] / r512["peer_value"], abs=1e-3)


def test_agents_that_join_are_projected_from_their_named_measured_parts(tmp_path):
    """With joined agents (srun's step, one agent a node), the projection is podrun's own start + the engine's
    launch of one agent a node (its own tree model, from the peer's fit) + one agent's start + the controller's CPU
    per joined host x hosts + one worker's start, each a median of the podrun subject at its largest size; a run
    without those figures (agents per rank, before they joined) keeps the subject's own tree model."""
    s, peer = "podrun srun", "srun"
    parts = {"engine_start_s": 0.4, "agent_cpu_up_s": 0.06, "join_ms": 0.3, "worker_start_cpu_s": 0.05}
    path = _scale_json(tmp_path, {
        **{(s, n, 4): [{**_fig(n, 0.007, 0.4, 0.0, 3.0 + 0.1 * n), **parts}] for n in (8, 64)},
        **{(peer, n, 4): [_fig(n, 0.001, 0.0, 0.0, 1.0 + 0.05 * n)] for n in (8, 64)}})
    peer_fit = bf.measured(path, peer, 4)
    assert bf.joined_costs(path, s, 4) == {"file": path.name, "hosts": 64, "podrun_start_s": 0.4,
                                           "agent_start_s": 0.06, "join_cpu_per_host_s": pytest.approx(0.0003),
                                           "worker_start_s": 0.05}
    [r512] = [r for r in bf.projected_tree([path], s, peer) if "512 hosts" in r["subject"]]
    engine = 0.001 * 64 + (1.0 + 0.05 * 8 - 0.001 * 8) * 2
    assert r512["peer_value"] == pytest.approx(engine, abs=1e-3)
    assert r512["value"] == pytest.approx(0.4 + engine + 0.06 + 0.0003 * 512 + 0.05, abs=1e-3)
    assert "podrun_start_s 400.0 ms" in r512["note"] and "join_cpu_per_host_s 0.3 ms x 512" in r512["note"]
    without = _scale_json(tmp_path, {(s, n, 4): [_fig(n, 0.007, 0.4, 0.0, 3.0 + 0.1 * n)] for n in (8, 64)})
    assert bf.joined_costs(without, s, 4) is None
