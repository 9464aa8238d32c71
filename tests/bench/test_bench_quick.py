"""The pure benchmarks run in quick mode and give finite ratios against their peers (no timing asserted)."""
import importlib.util
import json
import math
import subprocess
import sys


def test_bench_quick_estimate_and_fanout(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bench", "--quick", "--out", str(tmp_path), "estimate", "fanout"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for name in ("estimate", "fanout"):
        rec = json.loads((tmp_path / f"{name}.json").read_text())
        assert rec["command"] == f"python -m bench --quick {name}" and rec["rows"]
        for row in rec["rows"]:
            assert row["value"] > 0 and (row["ratio"] is None or math.isfinite(row["ratio"]))
    est = json.loads((tmp_path / "estimate.json").read_text())["rows"]
    assert len(est) >= 10 and all(0.5 < r["ratio"] < 2 for r in est)    # the model within 2x of every figure


def test_bench_unknown_name_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bench", "--out", str(tmp_path), "nope"], capture_output=True, text=True)
    assert r.returncode == 2 and "unknown benchmark" in r.stderr


def _has_timm() -> bool:
    return importlib.util.find_spec("timm") is not None


def test_bench_gpu_loops_run_on_cpu_with_or_without_timm():
    """bench_gpu's code paths (plain AMP loop, the runner, the FLOP count) on CPU with a tiny model, so a
    session with a GPU only has to run it. With timm the peer is measured and every row has a ratio to
    it; without timm a row says it is not installed and no ratio is made up."""
    import bench.bench_gpu as g

    assert g.peak_for("NVIDIA H100 80GB HBM3") == 989e12 and g.peak_for("NVIDIA H100 PCIe") == 756e12
    assert g.peak_for("NVIDIA H200") == 989e12 and g.peak_for("Tesla T4") is None
    rows = g.measure(True, device="cpu", models=(("resnet18", "resnet18", 32, 4),), compile=False, counts=(2, 1, 1))
    measured = {r["subject"]: r for r in rows if r["value"] is not None}
    assert set(measured) == {"podrun model, plain loop", "podrun runner"}, rows
    assert all(r["value"] > 0 and r["unit"] == "img/s" for r in measured.values())
    missing = [r for r in rows if r["value"] is None]
    if _has_timm():
        assert not missing, rows
        for r in measured.values():
            assert r["peer"] == "timm resnet18, plain loop" and r["peer_value"] > 0
            assert math.isclose(r["ratio"], r["value"] / r["peer_value"], rel_tol=0.05)
    else:
        assert [r["subject"] for r in missing] == ["timm, plain loop"], rows
        assert "timm is not installed" in missing[0]["note"]
        assert all(r["peer"] is None and r["ratio"] is None for r in measured.values())
    assert g.train_flops(__import__("podrun.models", fromlist=["build"]).build("resnet18", 1000), 2, 32, "cpu") > 1e7


def test_bench_gpu_runs_where_cuda_is_and_says_so_where_not(monkeypatch):
    """Without a CUDA device the bench says so in its one row. With one, the loops run on it (the tiny
    model, one repeat of the quick mode) and ``run`` hands over to the full measurement, which is
    replaced here by a FAKE that records the call: the full one takes minutes and is the bench itself."""
    import torch

    import bench.bench_gpu as g

    if not torch.cuda.is_available():
        rows = g.run(True)
        assert len(rows) == 1 and rows[0]["value"] is None
        assert rows[0]["note"].startswith("no CUDA device")
        return
    rows = g.measure(True, device="cuda", models=(("resnet18", "resnet18", 32, 4),), compile=False)
    measured = [r for r in rows if r["value"] is not None]
    assert {r["subject"] for r in measured} >= {"podrun model, plain loop", "podrun runner"}, rows
    assert all(r["value"] > 0 and torch.cuda.get_device_name(0) in r["note"] for r in measured)
    calls = []
    monkeypatch.setattr(g, "measure", lambda quick: calls.append(quick) or [])
    assert g.run(True) == [] and calls == [True]
