"""bench/gpu_check.py's CPU form, end to end, so that the call prepared for a lent GPU keeps working here: every
part in a process of its own under its limit, its figures as JSON under the folder given; a part over its limit
stopped and said so; the CUDA-path tests (tests/gpu) failing, never skipping, where no device is."""
from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILES = ["bench.json", "calibrate.json", "log.txt", "output.txt", "summary.json", "tests.json"]
# The whole call's parts under limits no shorter than the test's own bound (pytest's timeout, 600 s): a loaded
# machine's pace is not what the test checks; a part stopped at its limit is the next test's, with a limit of 3 s.
ROOM_S = 540
ROOM = ("--total", str(ROOM_S), *(a for p in ("tests", "calibrate", "bench") for a in ("--limit", f"{p}={ROOM_S}")))


def gpu_check(out: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.gpu_check", str(out), "--cpu", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def _ours(word: str) -> list[str]:
    """Command lines of live processes that name ``word``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if word in cmd and int(pid) != os.getpid():
            found.append(cmd)
    return found


def test_the_cpu_form_runs_every_part_and_writes_its_figures(tmp_path):
    """One line says it is the CPU form; the three parts end ok; the folder holds six flat files (a lent machine
    sends back at most eight); the CUDA-path tests ran as their CPU twins (compile left out, said per test);
    the calibrated estimate and the launched run's step time at GA 1 are both measured; every podrun subject of
    `bench gpu` has img/s and timm's row says it is absent rather than faking it. Each part's limit is the test's
    own (ROOM): how fast a loaded machine runs them is not asserted."""
    out = tmp_path / "out"
    r = gpu_check(out, *ROOM, timeout=ROOM_S + 30)
    detail = r.stdout[-3000:] + ((out / "output.txt").read_text()[-4000:] if (out / "output.txt").exists() else "")
    assert r.returncode == 0, detail
    assert r.stdout.splitlines()[0].startswith("CPU form asked for (--cpu)") or \
        r.stdout.splitlines()[0].startswith("no CUDA device here"), r.stdout
    assert sorted(p.name for p in out.iterdir()) == FILES and all((out / f).is_file() for f in FILES)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["form"] == "cpu" and [(p["part"], p["status"]) for p in summary["parts"]] == \
        [("tests", "ok"), ("calibrate", "ok"), ("bench", "ok")], summary["parts"]
    assert all(p["seconds"] <= p["limit_s"] for p in summary["parts"])
    assert summary["limits_s"] == dict.fromkeys(("tests", "calibrate", "bench"), ROOM_S) == \
        dict.fromkeys(("tests", "calibrate", "bench"), summary["total_limit_s"]), summary["limits_s"]

    tests = json.loads((out / "tests.json").read_text())
    outcomes = {t["test"].split("::")[-1]: t["outcome"] for t in tests["results"]}
    assert outcomes == {"test_one_rank_nccl_group_through_podrun_launch": "passed",
                        "test_cuda_state_round_trips_bitwise_through_snapshot_and_checkpoint": "passed",
                        **{f"test_runner_one_update_in_bf16_channels_last[eager-{o}]": "passed"
                           for o in ("sgd", "lars")},
                        **{f"test_runner_one_update_in_bf16_channels_last[compile-{o}]": "deselected"
                           for o in ("sgd", "lars")}}, tests

    cal = json.loads((out / "calibrate.json").read_text())
    e = cal["estimate_vs_run"]
    assert cal["plans"]["run"]["grad_accum"] == 1 and cal["run"]["rows"] >= 10, cal
    assert all(math.isfinite(v) and v > 0 for v in (e["estimate_step_seconds"], e["run_step_seconds"], e["ratio"]))

    rows = json.loads((out / "bench.json").read_text())["rows"]
    for model in ("resnet50", "vit_b16", "efficientnet_b4"):
        mine = {r["subject"]: r for r in rows if r["benchmark"] == f"GPU train throughput, {model}"}
        assert all(mine[s]["value"] > 0 for s in ("podrun model, plain loop", "podrun runner")), mine
        peer = mine["timm, plain loop"]
        if importlib.util.find_spec("timm") is None:        # this machine: said, not faked
            assert peer["value"] is None and "timm is not installed" in peer["note"], peer
        else:
            assert mine["podrun runner"]["peer_value"] > 0 and mine["podrun runner"]["ratio"] > 0, mine
    assert "hidden by bench.gpu_check" not in (out / "output.txt").read_text()     # nothing reached for paramiko
    log = (out / "log.txt").read_text().splitlines()
    assert len(log) < 40 and log[-1].startswith("gpu-check: 3 of 3 parts ok"), log


def test_a_part_over_its_limit_is_stopped_and_said(tmp_path):
    """bench with a 3 s limit: stopped (its whole process group), the log and summary say so, exit 1, and no
    process of it is left."""
    out = tmp_path / "out"
    r = gpu_check(out, "--parts", "bench", "--limit", "bench=3", timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    part = json.loads((out / "summary.json").read_text())["parts"]
    assert [(p["part"], p["status"]) for p in part] == [("bench", "stopped at its limit of 3 s")], part
    assert "bench: stopped at its limit of 3 s" in (out / "log.txt").read_text()
    assert _ours(str(out)) == []


def test_the_cuda_path_tests_fail_not_skip_without_a_device(tmp_path):
    """tests/gpu with no device (CUDA_VISIBLE_DEVICES empty hides any) and no twin: every test fails at once with
    'needs a CUDA device'; none passes, none is skipped."""
    report = tmp_path / "report.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "PODRUN_GPU_TESTS_DEVICE"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider", "-q",
                        "tests/gpu"], capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**env, "CUDA_VISIBLE_DEVICES": "", "PODRUN_GPU_TESTS_REPORT": str(report)})
    assert r.returncode == 1, r.stdout[-3000:]
    results = [json.loads(line) for line in report.read_text().splitlines()]
    assert len(results) == 6 and all(t["outcome"] == "failed" and t["message"].startswith("Failed: needs a CUDA device")
                                     for t in results), results
    assert "skipped" not in r.stdout and "6 failed" in r.stdout, r.stdout[-2000:]
