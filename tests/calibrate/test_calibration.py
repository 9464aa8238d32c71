"""The calibration file (load, atomic save, errors naming file and field), the plan with measured inputs
(--calibration: measured rate, links and largest local batch; refused for another setup; stale warned), and the
largest-batch search on modelled memory curves (a pure function of the batch: a stand-in for a device)."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from podrun.specs.calibration import (Calibration, InputRate, InputResult, LinkResult, MemoryProbe, MemoryResult,
                                      NetworkResult, OverlapResult, RatePoint, dumps, find, hidden_fraction, load)
from podrun.calibrate.run import save
from podrun.calibrate.search import largest_fit
from podrun.errors import SpecError
from podrun.plan.measured import Measured
from tests.harness.podrun_proc import run_podrun, with_env

ROOT = Path(__file__).resolve().parents[2]
RECIPE = str(ROOT / "recipes" / "resnet18_cifar10")
GOLDEN = Path(__file__).resolve().parent / "golden"


def inputs(cores: int, *rates: tuple[int, float], data: str = "/data/imagenet") -> InputResult:
    return InputResult(data=data, decoder="simplejpeg", cores=cores, image_size=32, images=128,
                       rates=tuple(InputRate(w, r, 2.5) for w, r in rates))


def sample(**kw) -> Calibration:
    c = Calibration(
        format=1, recipe="resnet18_cifar10", model="resnet18", cluster="local", device="cpu",
        hosts=("localhost",), devices_per_host=2, measured_at="2026-11-25T12:00:00Z", podrun_version="0.1.0",
        precision="fp32",
        memory=MemoryResult(budget_bytes=300_000_000, budget_source="--device-memory 0.3 GB", method="rss",
                            largest_local_batch=12,
                            probes=(MemoryProbe(1, True, 275_000_000), MemoryProbe(16, False, 324_000_000))),
        throughput=(RatePoint(4, 0.5, 8.0), RatePoint(8, 0.9, 8 / 0.9)),
        network=NetworkResult(backend="gloo", intra_host=LinkResult(2, 44_695_848, 8.0, 80.0, 0.05)),
        seconds=60.0)
    return replace(c, **kw)


def words(table: str) -> str:
    """A rendered table's words in order, its rules and cell borders left out (a cell's text may wrap)."""
    return " ".join(w for w in table.split() if w.strip("│┃┌┐└┘├┤┬┴┼─━╇╈┡┩┏┓┗┛"))


def podrun(*args, cwd=None, env=None):
    return run_podrun(*args, timeout=120, cwd=cwd, env=with_env(**(env or {})))


def test_save_then_load_gives_the_same_calibration_and_leaves_no_temporary_file(tmp_path):
    c = sample(input=inputs(2, (0, 80.0), (1, 90.0), (2, 170.0)))
    path = save(c, tmp_path / "runs", "r18")
    assert path == tmp_path / "runs" / "calibrations" / "r18.yaml"
    assert load(path) == c
    assert find("r18", tmp_path / "runs") == path
    assert oct(path.stat().st_mode & 0o777) == "0o600" and oct(path.parent.stat().st_mode & 0o777) == "0o700"
    save(replace(c, seconds=61.0), tmp_path / "runs", "r18")            # over the old one, by rename
    assert load(path).seconds == 61.0
    assert sorted(p.name for p in path.parent.iterdir()) == ["r18.yaml"]


@pytest.mark.parametrize("edit, field", [
    (lambda t: t.replace("largest_local_batch: 12", "largest_local_batch: 0"), "memory.largest_local_batch"),
    (lambda t: t.replace("measured_at: '2026-11-25T12:00:00Z'", "measured_at: yesterday"), "measured_at"),
    (lambda t: t.replace("bus_bandwidth_gbps: 8.0", "bus_bandwidth_gbps: fast"),
     "network.intra_host.bus_bandwidth_gbps"),
    (lambda t: t.replace("recipe: resnet18_cifar10\n", ""), "recipe"),
    (lambda t: t.replace("workers: 2,", "workers: 1,"), "input.rates"),
    (lambda t: t.replace("images_per_second: 170.0", "images_per_second: 0"), "input.rates.2.images_per_second"),
])
def test_a_bad_calibration_file_is_exit_2_naming_the_file_and_the_field(tmp_path, edit, field):
    bad = tmp_path / "bad.yaml"
    bad.write_text(edit(dumps(sample(input=inputs(2, (0, 80.0), (1, 90.0), (2, 170.0))))))
    with pytest.raises(SpecError) as exc:
        load(bad)
    assert str(bad) in exc.value.message and field in exc.value.message
    r = podrun("plan", "--calibration", str(bad), RECIPE)
    assert r.returncode == 2 and str(bad) in r.stderr and field in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_plan_with_a_calibration_uses_the_measured_rate_links_and_largest_batch(tmp_path):
    save(sample(), tmp_path / "runs", "r18")
    env = {"PODRUN_CLUSTER_SPECS_PATH": ""}
    plain = json.loads(podrun("plan", "--devices-per-host", "2", RECIPE, "--json", cwd=tmp_path, env=env).stdout)
    r = podrun("plan", "--devices-per-host", "2", RECIPE, "--calibration", "r18", "--json", "--max-age", "100000",
               cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    # global batch 64 on 2 replicas: 32 per replica; the largest local batch <= 12 dividing 32 is 8 (GA 4)
    assert (d["global_batch"], d["local_batch"], d["grad_accum"]) == (64, 8, 4)
    assert (plain["global_batch"], plain["local_batch"]) == (64, 32)
    e = d["estimate"]
    assert e["per_replica_images_per_second"] == pytest.approx(8 / 0.9, rel=1e-3)
    # 2 replicas on one host: the measured intra-host bus bandwidth, 2(d-1)/d x B / bw + 2(d-1) x latency
    comm = 44_695_848 * 8 / 8e9 + 2 * 80e-6
    assert e["allreduce_seconds"] == pytest.approx(comm, rel=1e-3)
    assert e["step_seconds"] == pytest.approx(4 * 0.9 + comm, rel=1e-3)
    text = " ".join(e["assumptions"])
    assert "measured at local batch 8 (calibration r18" in text and "2026-11-25T12:00:00Z" in text
    assert "8 Gb/s and 80 us (measured bus bandwidth" in text and "inter-host 10 Gb/s" in text   # the spec's
    assert "the input pipeline is not yet measured (podrun data bench" in text     # not "free"
    assert any("largest that fits 0.3 GB (--device-memory 0.3 GB)" in n for n in d["notes"])


def test_another_clusters_or_recipes_calibration_is_refused_saying_what_differs(tmp_path):
    save(sample(cluster="dgx-h100", device="gpu-h100"), tmp_path / "runs", "other")
    r = podrun("plan", RECIPE, "--calibration", "other", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "cluster 'dgx-h100' (the plan's is 'local')" in r.stderr and "device 'gpu-h100' (the plan's is 'cpu')" \
        in r.stderr
    save(sample(recipe="resnet50", model="resnet50"), tmp_path / "runs", "r50")
    r = podrun("plan", RECIPE, "--calibration", "r50", cwd=tmp_path)
    assert r.returncode == 2 and "recipe 'resnet50' (the plan's is 'resnet18_cifar10')" in r.stderr
    r = podrun("plan", RECIPE, "--calibration", "nothing", cwd=tmp_path)
    assert r.returncode == 2 and "no calibration named 'nothing'" in r.stderr and "other, r50" in r.stderr


def test_a_stale_calibration_is_used_with_a_warning(tmp_path):
    save(sample(measured_at="2020-01-01T00:00:00Z"), tmp_path / "runs", "old")
    r = podrun("plan", "--devices-per-host", "2", RECIPE, "--calibration", "old", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "podrun: warning: calibration" in r.stderr and "days old (measured 2020-01-01T00:00:00Z; --max-age 30" \
        in r.stderr
    r = podrun("plan", "--devices-per-host", "2", RECIPE, "--calibration", "old", "--max-age", "100000",
               cwd=tmp_path)
    assert r.returncode == 0 and "warning" not in r.stderr


def test_the_input_size_is_kept_said_in_the_assumptions_and_warned_when_not_the_recipes(tmp_path):
    """A calibration measured at 16 px (the size resnet18_cifar10's train.py trains --data digits at, its recipe
    says 32) is used for the plan, with the size in its assumptions and a warning that its rates hold at 16 px;
    one at the recipe's size gets no warning; a file written before the field (no image_size) still loads."""
    save(sample(image_size=16), tmp_path / "runs", "px16")
    assert load(tmp_path / "runs" / "calibrations" / "px16.yaml").image_size == 16
    r = podrun("plan", "--devices-per-host", "2", RECIPE, "--calibration", "px16", "--max-age", "100000", "--json",
               cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "measured at 16 px inputs, the recipe's are 32 px: its rates and largest local batch hold for runs at " \
           "16 px" in r.stderr
    assert "16 px inputs" in " ".join(json.loads(r.stdout)["estimate"]["assumptions"])
    save(sample(image_size=32), tmp_path / "runs", "px32")
    r = podrun("plan", "--devices-per-host", "2", RECIPE, "--calibration", "px32", "--max-age", "100000",
               cwd=tmp_path)
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    old = tmp_path / "old.yaml"
    old.write_text(dumps(sample()))
    assert "image_size: null" in old.read_text()
    old.write_text(old.read_text().replace("image_size: null\n", ""))
    assert load(old).image_size is None


def test_a_bad_image_size_for_calibrate_is_exit_2_naming_the_option(tmp_path):
    r = podrun("calibrate", "--device-memory", "1", "--image-size", "0", RECIPE, cwd=tmp_path)
    assert r.returncode == 2 and "--image-size" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_measured_overlap_hides_its_fraction_of_the_all_reduce_in_the_plans_step(tmp_path):
    """A calibration whose DDP step hid 40 % of the all-reduce: the plan's step is compute + 60 % of the ring
    model's all-reduce (the all-reduce itself unchanged), the assumptions say so with the measured figures, and
    `podrun plan` shows the hidden part; without an overlap the step is compute + all-reduce."""
    o = OverlapResult(ranks=2, local_batch=8, step_seconds=0.9, allreduce_seconds=0.5, synced_step_seconds=1.2,
                      hidden_fraction=hidden_fraction(0.9, 0.5, 1.2))
    assert o.hidden_fraction == pytest.approx(0.4)
    save(sample(overlap=o), tmp_path / "runs", "ov")
    save(sample(), tmp_path / "runs", "plain")
    args = ("plan", "--devices-per-host", "2", RECIPE, "--max-age", "100000")
    with_overlap = json.loads(podrun(*args, "--calibration", "ov", "--json", cwd=tmp_path).stdout)["estimate"]
    without = json.loads(podrun(*args, "--calibration", "plain", "--json", cwd=tmp_path).stdout)["estimate"]
    comm = 44_695_848 * 8 / 8e9 + 2 * 80e-6
    assert with_overlap["allreduce_seconds"] == without["allreduce_seconds"] == pytest.approx(comm, rel=1e-3)
    assert without["step_seconds"] == pytest.approx(4 * 0.9 + comm, rel=1e-3)
    assert with_overlap["step_seconds"] == pytest.approx(4 * 0.9 + 0.6 * comm, rel=1e-3)
    assert (with_overlap["allreduce_hidden_fraction"], without["allreduce_hidden_fraction"]) == (0.4, 0.0)
    text = " ".join(with_overlap["assumptions"])
    assert "40% of the all-reduce hidden behind the backward pass (measured: a DDP step of 2 ranks at local " \
           "batch 8 took 1.2 s, the step alone 0.9 s and one all-reduce of the gradient 0.5 s" in text
    assert "no overlap of communication with compute" in " ".join(without["assumptions"])
    shown = podrun(*args, "--calibration", "ov", cwd=tmp_path).stdout
    assert "40% of it hidden" in shown


def test_an_overlap_measured_at_nothing_hidden_is_said_as_measured(tmp_path):
    """A DDP step that hid none of its all-reduce (as a busy machine can measure): the plan's step is compute +
    all-reduce, as without a measure, and the assumptions say 0 % was measured, with the figures, rather than the
    unmeasured default."""
    o = OverlapResult(ranks=2, local_batch=8, step_seconds=0.9, allreduce_seconds=0.5, synced_step_seconds=1.5,
                      hidden_fraction=hidden_fraction(0.9, 0.5, 1.5))
    assert o.hidden_fraction == 0
    save(sample(overlap=o), tmp_path / "runs", "none")
    args = ("plan", "--devices-per-host", "2", RECIPE, "--max-age", "100000", "--json")
    est = json.loads(podrun(*args, "--calibration", "none", cwd=tmp_path).stdout)["estimate"]
    text = " ".join(est["assumptions"])
    assert est["allreduce_hidden_fraction"] == 0
    assert "0% of the all-reduce hidden behind the backward pass (measured: a DDP step of 2 ranks at local " \
           "batch 8 took 1.5 s" in text
    assert "no overlap of communication with compute" not in text


@pytest.mark.parametrize("step, allreduce, synced, hidden", [
    (1.0, 0.5, 1.5, 0.0),          # nothing hidden: one after the other
    (1.0, 0.5, 1.0, 1.0),          # all of it hidden
    (1.0, 0.5, 1.25, 0.5),
    (1.0, 0.5, 1.9, 0.0),          # slower than both: 0, never below
    (1.0, 0.5, 0.8, 1.0),          # faster than the step alone (noise): 1, never above
])
def test_the_hidden_fraction_is_within_0_and_1(step, allreduce, synced, hidden):
    assert hidden_fraction(step, allreduce, synced) == pytest.approx(hidden)


def test_a_bad_overlap_in_a_calibration_file_is_exit_2_naming_the_field(tmp_path):
    o = OverlapResult(ranks=2, local_batch=8, step_seconds=0.9, allreduce_seconds=0.5, synced_step_seconds=1.2,
                      hidden_fraction=0.4)
    bad = tmp_path / "bad.yaml"
    bad.write_text(dumps(sample(overlap=o)).replace("hidden_fraction: 0.4", "hidden_fraction: 1.5"))
    with pytest.raises(SpecError) as exc:
        load(bad)
    assert str(bad) in exc.value.message and "overlap.hidden_fraction" in exc.value.message


def test_plan_with_a_calibration_imports_neither_torch_nor_paramiko(tmp_path):
    save(sample(), tmp_path / "runs", "r18")
    code = ("import sys; from podrun.cli.main import main; "
            f"rc = main(['plan','--devices-per-host','2',{RECIPE!r},'--calibration','r18']); "
            "bad=[m for m in ('torch','paramiko') if m in sys.modules]; sys.stderr.write(f'RC:{rc} HEAVY:'+','.join(bad))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert "RC:0 HEAVY:" in r.stderr and r.stderr.split("HEAVY:")[1].strip() == "", r.stderr


def test_step_time_is_a_line_through_the_measured_batches():
    m = Measured(where="w", step_seconds=((4, 0.5), (8, 0.9), (16, 1.7)))
    assert m.step_at(8) == 0.9
    assert m.step_at(12) == pytest.approx(1.3)
    assert m.step_at(32) == pytest.approx(3.3)          # beyond: the last two points' line
    assert m.step_at(2) == pytest.approx(0.3)            # below: the first two points' line
    assert Measured(where="w", step_seconds=((8, 0.8),)).step_at(4) == pytest.approx(0.4)


@pytest.mark.parametrize("base, per_sample", [(275e6, 4.5e6), (100.0, 1.0), (2e9, 3e8)])
@pytest.mark.parametrize("largest", [1, 2, 3, 12, 33, 64, 100, 127, 128, 500])
def test_the_search_finds_the_largest_batch_of_a_modelled_straight_memory_curve_in_at_most_10_probes(
        base, per_sample, largest):
    """A stand-in device: the step's memory is base + per_sample x batch (what the probes measure on CPU)."""
    budget = base + per_sample * (largest + 0.5)
    found, probes = largest_fit(lambda b: {"peak_bytes": base + per_sample * b}, budget)
    assert found == largest and len(probes) <= 10, [p.local_batch for p in probes]
    assert {p.local_batch for p in probes} >= {largest, largest + 1} - {0}   # both sides of the edge were run


def test_the_search_on_a_modelled_floor_then_line_and_on_probes_that_die():
    """Stand-ins: a flat floor below batch 5 (as on CPU, where small batches fit in what is resident), and a
    device whose probes die (no peak measured) above batch 40."""
    floor = lambda b: {"peak_bytes": max(275e6, 250e6 + 4.5e6 * b)}   # noqa: E731
    found, probes = largest_fit(floor, 250e6 + 4.5e6 * 33.5)
    assert found == 33 and len(probes) <= 10
    dies = lambda b: {"peak_bytes": 1000 + b} if b <= 40 else {"peak_bytes": None, "error": "killed"}   # noqa: E731
    found, probes = largest_fit(dies, 10 ** 9)
    assert found == 40 and len(probes) <= 12, [p.local_batch for p in probes]    # no line past a dead probe
    found, probes = largest_fit(lambda b: {"peak_bytes": 500 + b}, 400)
    assert found is None and [p.local_batch for p in probes] == [1]


def test_the_search_on_a_measured_floor_then_line_curve_takes_at_most_10_probes():
    """The peaks `podrun calibrate --image-size 16 --device-memory 0.3` measured for resnet18_cifar10 on a namespace
    host (a floor of ~275 MB up to batch 16, then ~1.1 MB a sample; between them, straight lines): the largest
    batch, 42, in at most 10 probes. A line drawn on the floor's noise, or a miss on the floor counted against the
    line above it, took 12."""
    measured = {1: 261_607_424, 2: 275_554_304, 3: 275_619_840, 4: 275_554_304, 8: 274_968_576, 16: 274_989_056,
                39: 296_095_744, 40: 297_091_072, 42: 299_266_048, 43: 300_355_584, 84: 345_649_152,
                128: 396_419_072}
    xs = sorted(measured)

    def peak(b):
        i = next((i for i, x in enumerate(xs) if x >= b), len(xs) - 1)
        (b0, m0), (b1, m1) = (xs[i - 1], measured[xs[i - 1]]), (xs[i], measured[xs[i]])
        return {"peak_bytes": m1 if b == b1 else int(m0 + (m1 - m0) * (b - b0) / (b1 - b0))}

    found, probes = largest_fit(peak, 300_000_000)
    assert found == 42 and len(probes) <= 10, [p.local_batch for p in probes]
    assert {p.local_batch for p in probes} >= {42, 43}


def test_launch_with_a_calibration_runs_the_measured_largest_batch(tmp_path):
    save(sample(), tmp_path / "runs", "r18")
    r = podrun("launch", "--dry-run", "--json", "--devices-per-host", "2", "--calibration", "r18", RECIPE,
               "--data", "digits", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    workers = json.loads(r.stdout)["instances"][0]["workers"]
    assert {(w["PODRUN_LOCAL_BATCH"], w["PODRUN_GRAD_ACCUM"]) for w in workers} == {("8", "4")}
    r = podrun("launch", "--dry-run", "--calibration", "r18", "--cluster", "dgx-h100", "--hosts", "a,b", RECIPE,
               "--data", "digits", cwd=tmp_path)
    assert r.returncode == 2 and "cluster 'local' (the plan's is 'dgx-h100')" in r.stderr, r.stderr


def test_calibrate_without_a_memory_budget_on_cpu_is_exit_2_naming_the_option(tmp_path):
    r = podrun("calibrate", RECIPE, cwd=tmp_path)
    assert r.returncode == 2 and "gives no device memory" in r.stderr and "--device-memory" in r.stderr, r.stderr
    r = podrun("calibrate", "--device-memory", "1", "--batches", "8,x", RECIPE, cwd=tmp_path)
    assert r.returncode == 2 and "--batches" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "runs").exists()


def test_a_given_largest_batch_is_kept_as_given_and_the_plan_says_it_was_not_searched(tmp_path):
    """`calibrate --largest-batch N` skips the memory search: the file has no budget and no probes, says where the
    batch came from, loads back the same, and the plan's note says the batch was given, not searched."""
    from podrun.calibrate.run import summary_rows

    given = MemoryResult(budget_bytes=None, budget_source="--largest-batch 12", method="given",
                         largest_local_batch=12)
    c = sample(memory=given)
    path = save(c, tmp_path / "runs", "r18")
    assert load(path) == c and "budget_bytes: null" in path.read_text()
    assert dict(summary_rows(c))["largest local batch"] == "12, given (--largest-batch 12; not searched)"
    r = podrun("plan", "--devices-per-host", "2", RECIPE, "--calibration", "r18", "--json", "--max-age", "100000",
               cwd=tmp_path, env={"PODRUN_CLUSTER_SPECS_PATH": ""})
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["local_batch"] == 8
    assert any("given to podrun calibrate (--largest-batch 12), not searched" in n for n in d["notes"]), d["notes"]


def test_calibrate_with_both_a_given_largest_batch_and_a_budget_is_exit_2_naming_both(tmp_path):
    r = podrun("calibrate", "--largest-batch", "8", "--device-memory", "1", RECIPE, cwd=tmp_path)
    assert r.returncode == 2 and "--largest-batch and --device-memory" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "runs").exists()
    r = podrun("calibrate", "--largest-batch", "0", RECIPE, cwd=tmp_path)
    assert r.returncode == 2 and "--largest-batch" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_measured_input_is_in_the_plans_step_and_the_plan_says_when_it_bounds_it(tmp_path):
    """podrun calibrate --data's input rates in the plan (pure; no torch). On a CPU device (resnet18_cifar10 on 2
    ranks of a host of 3 cores: 1 loader worker a rank, 2 on the host) the loader workers share the cores with the
    compute and overlap it: the step is the longest of the device's part (3.64 s), the input (64 samples at the
    15 img/s measured at 2 workers: 4.27 s) and their core-seconds over the 3 cores. Slow input bounds the step,
    and the plan names what would change it (2 workers a rank reach the 19 img/s measured at 3; the cores a host
    needs; staging). Fast input (150 img/s, with the step's CPU time measured: 1 core a rank) hides behind the
    compute: the step is the device's. Without --data the plan says input is not yet measured."""
    save(sample(input=inputs(3, (0, 6.0), (1, 9.0), (2, 15.0), (3, 19.0))), tmp_path / "runs", "slow")
    save(sample(input=inputs(3, (0, 60.0), (1, 90.0), (2, 150.0), (3, 190.0)),
                throughput=(RatePoint(4, 0.5, 8.0, 0.5), RatePoint(8, 0.9, 8 / 0.9, 0.9))), tmp_path / "runs", "fast")
    args = ("plan", "--devices-per-host", "2", RECIPE, "--max-age", "100000")
    slow = json.loads(podrun(*args, "--calibration", "slow", "--json", cwd=tmp_path).stdout)["estimate"]
    fast = json.loads(podrun(*args, "--calibration", "fast", "--json", cwd=tmp_path).stdout)["estimate"]
    comm = 44_695_848 * 8 / 8e9 + 2 * 80e-6
    assert slow["compute_seconds"] == fast["compute_seconds"] == pytest.approx(4 * 0.9)
    assert slow["input_seconds"] == pytest.approx(64 / 15.0, rel=1e-4)
    assert slow["step_seconds"] == pytest.approx(64 / 15.0, rel=1e-4)     # the input alone is the longest
    assert slow["images_per_second"] == pytest.approx(64 / slow["step_seconds"], rel=1e-2)
    assert slow["input_bound"] is True and fast["input_bound"] is False and fast["input_levers"] == []
    assert fast["input_seconds"] == pytest.approx(64 / 150.0, rel=1e-4)
    # the compute's 2 cores (1 a rank, measured) and the input's: (7.29 + 0.16) core-seconds over those 2 cores
    assert fast["step_seconds"] == pytest.approx((2 * (4 * 0.9 + comm) + 64 * 2.5e-3) / 2, rel=1e-4)
    levers = slow["input_levers"]
    assert levers[0].startswith("loader workers: --loader-workers 2 (4 on each host) at the 19 img/s"), levers
    assert any(x.startswith("cores: to keep pace with the device's 3644.9 ms a step a host must decode 18 img/s, "
                            "about 3 loader workers at the 7.5 img/s a worker measured at 2") for x in levers), levers
    assert any(x.startswith("staging:") for x in levers) and not any("nvJPEG" in x for x in levers), levers
    text = " ".join(slow["assumptions"])
    assert "input 15 img/s a host at 2 loader worker(s) (2 rank(s) x 1), 64 samples a host a step: 4266.7 ms " \
           "(measured: /data/imagenet (simplejpeg, 32 px" in text
    assert "their core-seconds over the cores, (10.9 + 0.16) / 3 = 3698.2 ms (the compute 1.5 core(s) a rank, the " \
           "rank's share, not measured; the input 2.5 ms of CPU an image; 3 of the host's 3 cores" in text, text
    fast_text = " ".join(fast["assumptions"])
    assert "(7.29 + 0.16) / 2 = 3724.9 ms (the compute 1 core(s) a rank, measured; the input 2.5 ms of CPU an " \
           "image; 2 of the host's 3 cores" in fast_text, fast_text
    assert "not yet measured" not in text
    shown = podrun(*args, "--calibration", "slow", cwd=tmp_path).stdout
    assert "the step is bound by input, not the device" in words(shown)
    assert "would change the input: loader workers" in shown
    save(sample(), tmp_path / "runs", "none")
    plain = json.loads(podrun(*args, "--calibration", "none", "--json", cwd=tmp_path).stdout)["estimate"]
    assert plain["input_seconds"] is None and plain["input_bound"] is False
    assert "the input pipeline is not yet measured" in " ".join(plain["assumptions"])
    assert "input not yet measured (podrun calibrate --data PATH)" in words(podrun(*args, cwd=tmp_path).stdout)


@pytest.mark.parametrize("device, device_cores, input_rate, cpu_ms, used, step, bound", [
    # input-bound, 1 torch thread: 32 images of 62 ms CPU beside a 0.4 s step on 2 cores: (0.4 + 1.984) / 2
    (0.4, 1.0, 30.0, 62.0, 2.0, 1.192, True),
    # the same on a host shared with others' work: the input kept 0.5 cores busy, the compute 1: (0.4 + 1.984) / 1
    (0.4, 1.0, 30.0, 62.0, 0.5, 2.384, True),
    # the input alone longest (its workers' rate), as on an accelerator
    (0.4, 1.0, 20.0, 30.0, 2.0, 1.6, True),
    # the cores the bound: neither alone is as long, the two's core-seconds are; input costs the more of them
    (1.0, 1.0, 35.0, 56.25, 2.0, 1.4, True),
    # the same bound by the cores, the compute the costlier (2 cores busy): not input-bound
    (1.0, 2.0, 100.0, 18.75, 2.0, 1.3, False),
    # the compute long, the input cheap: hidden behind it (a resnet18 folder run at 32 px)
    (24.0, 1.9, 365.0, 2.5, 2.0, 24.0, False),
])
def test_on_a_cpu_device_the_step_is_the_longest_of_compute_input_and_their_core_seconds_over_the_cores(
        device, device_cores, input_rate, cpu_ms, used, step, bound):
    """The plan's CPU model (pure): 32 samples a step on one rank of a 2-core host with 2 loader workers; the step
    is max(device, input alone, (device x its cores + samples x CPU an image) / cores), the figures measured ones,
    the cores the more that the input (at its largest count, 4 workers: ``used``) or the compute kept busy."""
    from podrun.plan.estimate import cores_given, input_term, shared_cores_step
    from podrun.plan.measured import InputMeasured

    inp = InputMeasured(where="here", rates=((0, input_rate / 2), (2, input_rate), (4, used * 1e3 / 50.0)), cores=2,
                        decoder="simplejpeg", cpu_ms=((0, cpu_ms * 0.9), (2, cpu_ms), (4, 50.0)))
    assert inp.cores_used() == pytest.approx(used)
    t = input_term(inp, samples_per_host=32, ranks_per_host=1, device_part=device, device_kind="cpu",
                   compute_cores=device_cores)
    assert t.seconds == pytest.approx(32 / input_rate)
    assert t.step == pytest.approx(step, rel=1e-6) and t.bound is bound
    assert t.step == shared_cores_step(device=device, device_core_seconds=device * device_cores,
                                       input_wall=32 / input_rate, input_core_seconds=32 * cpu_ms / 1e3,
                                       cores=cores_given(2, used, device_cores))
    assert cores_given(2, used, None) == cores_given(2, None, device_cores) == 2.0     # both measured, or the host's
    gpu = input_term(inp, samples_per_host=32, ranks_per_host=1, device_part=device, device_kind="gpu-h100")
    assert gpu.step == max(device, 32 / input_rate)     # beside the device: the longer, the cores not shared


def test_on_an_accelerator_input_runs_beside_the_device_and_the_plan_names_the_device_decoder(tmp_path):
    """One DGX H100 host (8 ranks of 14 of its 112 cores' loader workers each), resnet18_cifar10 at local batch 8:
    the device's step (10 ms) and the host's input (64 samples at 3,000 img/s, 21.3 ms) run side by side, the step
    is the longer, input bounds it and nvJPEG is among the levers. The estimate's JSON is the golden file's."""
    cal = sample(cluster="dgx-h100", device="gpu-h100", hosts=("dgx01",), devices_per_host=8,
                 throughput=(RatePoint(8, 0.01, 800.0),), network=NetworkResult(backend="nccl"),
                 input=inputs(112, (0, 250.0), (1, 300.0), (2, 590.0), (64, 2600.0), (112, 3000.0)))
    save(cal, tmp_path / "runs", "h100")
    r = podrun("plan", "--cluster", "dgx-h100", "--nodes", "1", RECIPE, "--calibration", "h100", "--max-age",
               "100000", "--json", cwd=tmp_path, env={"PODRUN_CLUSTER_SPECS_PATH": ""})
    assert r.returncode == 0, r.stderr
    e = json.loads(r.stdout)["estimate"]
    assert e["input_seconds"] == pytest.approx(64 / 3000.0, rel=1e-4) and e["input_bound"] is True
    assert e["step_seconds"] == pytest.approx(64 / 3000.0, rel=1e-4)            # max(device, input)
    assert any("nvJPEG" in x for x in e["input_levers"])
    golden = GOLDEN / "plan-input-bound-gpu.json"
    assert e == json.loads(golden.read_text()), json.dumps(e, indent=1)


def test_calibrate_with_data_that_is_not_there_is_exit_2_naming_it(tmp_path):
    r = podrun("calibrate", "--largest-batch", "2", "--data", str(tmp_path / "nowhere"), RECIPE, cwd=tmp_path)
    assert r.returncode == 2 and f"--data {tmp_path / 'nowhere'}: no such folder here" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "runs").exists()
