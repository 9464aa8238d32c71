"""The pure benchmarks run in quick mode and give finite ratios against their peers (no timing asserted)."""
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


def test_bench_gpu_loops_run_on_cpu_and_say_what_is_missing():
    """bench_gpu's code paths (plain AMP loop, the runner, the FLOP count) on CPU with a tiny model, so a
    session with a GPU only has to run it. Here there is no CUDA and no timm: the rows say so."""
    import bench.bench_gpu as g

    assert g.peak_for("NVIDIA H100 80GB HBM3") == 989e12 and g.peak_for("NVIDIA H100 PCIe") == 756e12
    assert g.peak_for("NVIDIA H200") == 989e12 and g.peak_for("Tesla T4") is None
    rows = g.measure(True, device="cpu", models=(("resnet18", "resnet18", 32, 4),), compile=False)
    measured = {r["subject"]: r for r in rows if r["value"] is not None}
    assert set(measured) == {"podrun model, plain loop", "podrun runner"}, rows
    assert all(r["value"] > 0 and r["unit"] == "img/s" for r in measured.values())
    missing = [r for r in rows if r["value"] is None]
    assert missing and all("timm is not installed" in r["note"] for r in missing)
    assert g.train_flops(__import__("podrun.models", fromlist=["build"]).build("resnet18", 1000), 2, 32, "cpu") > 1e7
    assert g.run(True)[0]["note"].startswith("no CUDA device")
