"""`podrun calibrate` on this machine (real torch, real probes in child processes, the local transport): the
largest local batch is the true largest, the file feeds the plan, a budget below one sample is exit 2."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from podrun.specs.calibration import load
from tests.harness.podrun_proc import PODRUN, run_podrun, with_env

ROOT = Path(__file__).resolve().parents[2]
RECIPE = str(ROOT / "recipes" / "resnet18_cifar10")
BUDGET_GB = 0.3        # resnet18 (CIFAR stem) on CPU: ~275 MB at batch 1..4, +4.5 MB a sample: about 10 fit


def podrun(*args, cwd, timeout=900):
    return run_podrun(*args, timeout=timeout, cwd=cwd, env=with_env(OMP_NUM_THREADS="1"))


def test_calibrate_finds_the_true_largest_batch_and_the_plan_uses_it(tmp_path):
    """The search ends on two measured neighbours: the largest batch fits the budget and one more does not, each
    measured in a child by the calibration itself (its probes in the file); run again here, in another process,
    the two peaks repeat within one sample's memory, so the answer is not an accident of one measurement."""
    from bench.jpeg_tree import make_tree

    tree = make_tree(tmp_path / "jpeg", classes=2, train_per_class=8, val_per_class=1, width=120, height=90)
    r = podrun("calibrate", "--devices-per-host", "2", "--device-memory", str(BUDGET_GB), "--batches", "2,4",
               "--steps", "1", "--data", str(tree), "--input-images", "16", "--json", RECIPE, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(r.stdout)
    path = Path(d["file"])
    assert path == tmp_path / "runs" / "calibrations" / "resnet18_cifar10-local.yaml"
    cal = load(path)
    largest = cal.memory.largest_local_batch
    probes = {p.local_batch: p for p in cal.memory.probes}
    assert len(cal.memory.probes) <= 10, cal.memory.probes
    budget = int(BUDGET_GB * 1e9)
    assert probes[largest].fits and probes[largest].peak_bytes <= budget, cal.memory.probes
    assert not probes[largest + 1].fits and probes[largest + 1].peak_bytes > budget, cal.memory.probes
    assert all(p.fits == (b <= largest) for b, p in probes.items()), cal.memory.probes
    assert [p.local_batch for p in cal.throughput] == [2, 4] and all(p.images_per_second > 0 for p in cal.throughput)
    assert all(p.cpu_seconds is not None and p.cpu_seconds > 0 for p in cal.throughput), cal.throughput   # CPU time
    assert cal.network.intra_host is not None and cal.network.intra_host.ranks == 2
    assert cal.network.inter_host is None                              # one host
    assert "memory probe 1: local batch 1" in r.stderr                 # the progress lines
    # the input pipeline on the tree (podrun data bench's code on the host's first rank): one row per worker count
    from podrun.train.data_bench import default_counts

    inp = cal.input
    assert inp is not None and inp.data == str(tree) and inp.image_size == 32 and inp.hosts == 1, inp
    assert [x.workers for x in inp.rates] == default_counts(inp.cores) and inp.images == 16, inp
    assert all(x.images_per_second > 0 for x in inp.rates) and inp.decoder in ("simplejpeg", "pil"), inp
    assert "input at 0 loader worker(s):" in r.stderr
    from podrun.calibrate import step
    from podrun.specs import load_recipe

    recipe = load_recipe(RECIPE)
    per_sample = probes[largest + 1].peak_bytes - probes[largest].peak_bytes
    for b in (largest, largest + 1):
        again = step.probe(recipe, b)["peak_bytes"]
        assert abs(again - probes[b].peak_bytes) < per_sample, (b, again, probes[b], per_sample)
    p = subprocess.run([*PODRUN, "plan", "--devices-per-host", "2", RECIPE, "--calibration",
                        "resnet18_cifar10-local", "--json"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    plan = json.loads(p.stdout)
    assert plan["local_batch"] <= largest and plan["global_batch"] == 64
    text = " ".join(plan["estimate"]["assumptions"])
    assert plan["estimate"]["input_seconds"] > 0 and f"(measured: {tree} (" in text
    assert "core(s) a rank, measured;" in text, text       # the step's cores from its CPU time, in the CPU model
    assert any(f"<= max {largest} (the largest that fits" in n for n in plan["notes"])


def test_a_budget_below_one_sample_is_exit_2_saying_the_smallest_that_fits(tmp_path):
    r = podrun("calibrate", "--devices-per-host", "1", "--device-memory", "0.05", "--batches", "1", "--steps", "1",
               RECIPE, cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "is smaller than one sample of resnet18_cifar10" in r.stderr and "give --device-memory of at least 0.2" \
        in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert not (tmp_path / "runs" / "calibrations").exists() or not list((tmp_path / "runs" / "calibrations").iterdir())


def test_a_probe_that_cannot_run_for_another_reason_fails_the_calibration_naming_it(tmp_path):
    """At 8 px, resnet18's last BatchNorm sees one value per channel at local batch 1, which it refuses in training:
    that is no memory limit, so the calibration fails naming the probe's error (exit 1, no file), rather than
    calling the budget smaller than one sample."""
    r = podrun("calibrate", "--devices-per-host", "1", "--device-memory", "0.3", "--batches", "2", "--steps", "1",
               "--image-size", "8", RECIPE, cwd=tmp_path)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "no calibration file written" in r.stderr and "smaller than one sample" not in r.stderr, r.stderr[-3000:]
    (run,) = [d for d in (tmp_path / "runs").iterdir() if d.name.startswith("calibrate-")]
    log = (run / "instance-0.log").read_text()
    assert "the memory probe at local batch 1 could not run: ValueError: Expected more than 1 value per channel" \
        in log, log[-3000:]
    assert not (tmp_path / "runs" / "calibrations").exists() or not list((tmp_path / "runs" / "calibrations").iterdir())
