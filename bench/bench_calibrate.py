"""The calibrated estimate against the truth (docs/calibrate.md): on namespace hosts whose links are shaped by tc
and whose processes are bound to cores of their own (a core each at 1 and 2 hosts, two hosts a core at 4: this
machine has 2), `podrun calibrate`, then `podrun plan --calibration`, then a real `podrun launch` of the recipe
for some steps, at 1, 2 and 4 hosts; the plan's step time, img/s and scaling (img/s over n x the 1-host img/s)
beside the run's, and the uncalibrated estimate (the recipe's published rate, the spec's links) beside both."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.rows import row

ROOT = Path(__file__).resolve().parents[1]
RECIPE = str(ROOT / "recipes" / "resnet18_cifar10")
BUDGET_GB = 0.3
# the inputs' side on both sides of the comparison: the recipe's train.py trains --data digits at 16 px (its
# recipe.yaml says 32, CIFAR-10's): the calibration measures at the size the run trains at, given to both
IMAGE_SIZE = 16


def _podrun(*args, cwd: Path, timeout: float = 1500) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "podrun", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _hosts_args(hosts, names) -> list[str]:
    from tests.ports import free_port

    return ["--hosts", ",".join(names), "--devices-per-host", "1", "--transport", "ssh", "--ssh-config",
            hosts.ssh_config_path, "--master-port", str(free_port(2))]


def one_count(hosts, names, tmp: Path, *, steps: int, timed_from: int, calib_steps: int = 5,
              largest: int | None = None) -> dict:
    """Calibrate on ``names``, plan with and without the calibration, launch ``steps`` steps: the figures.
    ``largest``: the largest local batch given to calibrate (no memory search), else searched under BUDGET_GB."""
    hosts_args = _hosts_args(hosts, names)
    memory = ["--device-memory", str(BUDGET_GB)] if largest is None else ["--largest-batch", str(largest)]
    t0 = time.monotonic()
    c = _podrun("calibrate", *hosts_args, *memory, "--steps", str(calib_steps),
                "--image-size", str(IMAGE_SIZE), "--name", f"n{len(names)}", "--runs-dir", str(tmp / "runs"),
                "--json", RECIPE, cwd=tmp)
    if c.returncode != 0:
        raise RuntimeError(f"calibrate on {len(names)} host(s) failed: {c.stderr[-2000:]}")
    calib_s = time.monotonic() - t0
    cal = json.loads(c.stdout)
    plan_args = ["--hosts", ",".join(names), "--devices-per-host", "1"]
    pc = json.loads(_podrun("plan", *plan_args, RECIPE, "--calibration", cal["file"], "--json", cwd=tmp).stdout)
    pu = _podrun("plan", *plan_args, RECIPE, "--local-batch", str(pc["local_batch"]), "--json", cwd=tmp)
    pu = json.loads(pu.stdout)
    run_id = f"bench-n{len(names)}-{int(time.time())}"
    r = _podrun("launch", *_hosts_args(hosts, names), "--calibration", cal["file"], "--runs-dir", str(tmp / "runs"),
                "--run-id", run_id, RECIPE, "--data", "digits", "--image-size", str(IMAGE_SIZE), "--steps", str(steps),
                "--log-every", "1", "--eval-every", "0", "--quiet", cwd=tmp)
    if r.returncode != 0:
        raise RuntimeError(f"launch on {len(names)} host(s) failed: {r.stderr[-2000:]}")
    rows = [json.loads(line) for line in (tmp / "runs" / run_id / "metrics.jsonl").read_text().splitlines() if line]
    step_s = [x["step_seconds"] for x in rows if x.get("kind") == "step" and x["step"] >= timed_from]
    run_step = statistics.median(step_s)
    return {"hosts": len(names), "calibrate_seconds": calib_s, "probes": len(cal["memory"]["probes"]),
            "largest_local_batch": cal["memory"]["largest_local_batch"],
            "inter_host_gbps": (cal["network"]["inter_host"] or {}).get("bus_bandwidth_gbps"),
            "local_batch": pc["local_batch"], "grad_accum": pc["grad_accum"], "global_batch": pc["global_batch"],
            "plan_step": pc["estimate"]["step_seconds"], "plan_ips": pc["estimate"]["images_per_second"],
            "uncal_step": pu["estimate"]["step_seconds"], "uncal_ips": pu["estimate"]["images_per_second"],
            "run_step": run_step, "run_ips": pc["global_batch"] / run_step, "run_steps": step_s,
            "file": cal["file"], "plan_allreduce": pc["estimate"]["allreduce_seconds"],
            "plan_hidden": pc["estimate"]["allreduce_hidden_fraction"], "assumptions": pc["estimate"]["assumptions"]}


def compare(hosts, counts, tmp: Path, *, steps: int, timed_from: int) -> list[dict]:
    return [one_count(hosts, hosts.hosts[:n], tmp, steps=steps, timed_from=timed_from) for n in counts]


def rows_of(results: list[dict], mbit: float) -> list[dict]:
    out = []
    one = next((r for r in results if r["hosts"] == 1), None)
    for r in results:
        n = r["hosts"]
        what = f"resnet18_cifar10, {n} host(s), {mbit:g} Mbit/s"
        dec = f"b={r['local_batch']} GA={r['grad_accum']} G={r['global_batch']}"
        bare = r["plan_step"] + r["plan_allreduce"] * r["plan_hidden"]     # the same, nothing hidden
        hidden = "" if n == 1 else (f"; {r['plan_hidden']:.0%} of the all-reduce hidden (measured), without it "
                                    f"{bare:.3f} s ({bare / r['run_step']:.2f}x)")
        out.append(row("calibrated estimate vs run", f"{what}: step time", r["plan_step"], "s",
                       f"{dec}{hidden}; uncalibrated estimate {r['uncal_step']:.3f} s "
                       f"({r['uncal_step'] / r['run_step']:.2f}x the run); run: median of {len(r['run_steps'])} steps",
                       "launched run", r["run_step"]))
        out.append(row("calibrated estimate vs run", f"{what}: img/s", r["plan_ips"], "img/s",
                       f"uncalibrated estimate {r['uncal_ips']:.1f} img/s ({r['uncal_ips'] / r['run_ips']:.2f}x)",
                       "launched run", r["run_ips"]))
        if one is not None and n > 1:
            plan_eff = r["plan_ips"] / (n * one["plan_ips"])
            run_eff = r["run_ips"] / (n * one["run_ips"])
            uncal_eff = r["uncal_ips"] / (n * one["uncal_ips"])
            out.append(row("calibrated estimate vs run", f"{what}: scaling vs 1 host", plan_eff * 100, "%",
                           f"{(plan_eff - run_eff) * 100:+.1f} points; uncalibrated {uncal_eff * 100:.1f} % "
                           f"({(uncal_eff - run_eff) * 100:+.1f} points)", "launched run", run_eff * 100, digits=1))
        out.append(row("calibrate", f"{what}: calibration", r["calibrate_seconds"], "s",
                       f"{r['probes']} memory probes, largest local batch {r['largest_local_batch']} under "
                       f"{BUDGET_GB} GB" + (f"; inter-host bus bandwidth {r['inter_host_gbps']:.3g} Gb/s"
                                            if r["inter_host_gbps"] else "")))
    return out


def run(quick: bool) -> list[dict]:
    import tempfile

    from tests.harness import NetnsHosts
    from tests.harness.shaping import give_cores, shape

    mbit = 1000.0
    counts = (1, 2) if quick else (1, 2, 4)
    with NetnsHosts(max(counts)) as hosts, tempfile.TemporaryDirectory(prefix="bench-calibrate-") as d:
        shape(hosts, rate_mbit=mbit)
        results = []
        for n in counts:
            give_cores(hosts, hosts.hosts[:n])
            results += compare(hosts, (n,), Path(d), steps=6 if quick else 10, timed_from=3)
    print(json.dumps(results, indent=1), file=sys.stderr)
    return rows_of(results, mbit)


if __name__ == "__main__":
    from bench.rows import run_alone

    run_alone(run)
