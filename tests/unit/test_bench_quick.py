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
