"""`python -m bench.gpu_check OUT_DIR`: the GPU proof in one prepared call (issue 44, docs/gpu-check.md): the
CUDA-path tests, `bench gpu` quick, and `podrun calibrate` against a launched run, each part a process of its own
under a time limit, every figure as JSON and a short log under OUT_DIR; without CUDA, the same parts in their CPU
form at tiny sizes, said in one line.

Only what a bare device image holds: podrun from this working tree (PYTHONPATH), torch, timm when there, click,
rich, pyyaml, numpy, pytest; paramiko is hidden from every process it starts (the image has none), no network.
OUT_DIR gets summary.json, log.txt (the short log), output.txt (each part's output), tests.json, bench.json and
calibrate.json: six files, flat, as a lent machine sends back at most eight.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("tests", "calibrate", "bench")        # in this order: the correctness first, the elastic benchmark last
TWIN_ENV = "PODRUN_GPU_TESTS_DEVICE"            # tests/gpu/needs.py: 'cpu' runs the CUDA-path tests' CPU twins
REPORT_ENV = "PODRUN_GPU_TESTS_REPORT"          # tests/gpu/conftest.py: one JSON line per test as it ends
GRACE_S = 10                                    # SIGTERM to SIGKILL for a part stopped at its limit


@dataclass(frozen=True)
class Form:
    """What the parts run: on a CUDA device, or the CPU form (tiny sizes, to keep the code working here)."""

    name: str                   # the torch device: cuda | cpu
    limits: dict                # seconds per part
    total: int                  # seconds for the whole call
    deselect: str | None        # pytest -k: the tests not run in this form
    bench_models: tuple         # bench_gpu.measure's (podrun name, timm name, image size, batch)
    bench_counts: tuple         # (steps, warm-up, repeats)
    bench_compiled: tuple       # the models whose compiled runner is measured (once)
    recipe: str
    calibrate: tuple            # `podrun calibrate` size options
    run: tuple                  # the launched run's recipe arguments, besides --steps
    run_steps: int
    warm_steps: int             # the run's first updates, left out of its step time


# Sized in docs/gpu-check.md and measured on an H200 (bench/RESULTS.md): tests 72 s, calibrate 161 s (its memory
# search and the 100-step run), bench's eager figures ~160 s; the whole call stops by 430 s (its start and the call
# within a lent machine's 15 minutes); bench, last, has what the others left of it, up to its own limit.
CUDA = Form(name="cuda", limits={"tests": 90, "calibrate": 175, "bench": 165}, total=430, deselect=None,
            bench_models=(("resnet50", "resnet50", 224, 256), ("vit_b16", "vit_base_patch16_224", 224, 256),
                          ("efficientnet_b4", "efficientnet_b4", 320, 64)),
            bench_counts=(10, 5, 2), bench_compiled=("resnet50", "vit_b16"), recipe="resnet50",
            calibrate=("--steps", "5"), run=("--log-every", "10"), run_steps=100, warm_steps=10)
# The CPU form keeps the code working, nothing more: the smallest sizes each part runs at (the ViT at 16 px is one
# patch and its class token; one timed update after one warm-up; a run of 12 steps, 10 of them timed).
CPU = Form(name="cpu", limits={"tests": 120, "calibrate": 120, "bench": 90}, total=330, deselect="not compile",
           bench_models=(("resnet50", "resnet50", 32, 2), ("vit_b16", "vit_base_patch16_224", 16, 2),
                         ("efficientnet_b4", "efficientnet_b4", 64, 2)),    # 64: at 32 px its last map is 1x1
           bench_counts=(1, 1, 1), bench_compiled=(), recipe="resnet18_cifar10",
           calibrate=("--largest-batch", "8", "--image-size", "8", "--steps", "2"),
           run=("--image-size", "8", "--threads", "1", "--log-every", "5"), run_steps=12, warm_steps=2)


def write_json(path: Path, value) -> None:
    path.write_text(json.dumps(value, indent=1) + "\n")


def facts() -> dict:
    """This machine as the figures need it: torch, the device, the peer library. CUDA initialised here does the
    parts no harm: each is a new program (exec), not a fork of this one."""
    import importlib.util

    import torch

    cuda = torch.cuda.is_available()
    timm = importlib.util.find_spec("timm") is not None
    out = {"python": platform.python_version(), "host": platform.node(), "torch": torch.__version__,
           "cuda": cuda, "cuda_version": torch.version.cuda, "timm": None, "paramiko": "hidden (the image has none)"}
    if timm:
        import timm as t

        out["timm"] = t.__version__
    if cuda:
        p = torch.cuda.get_device_properties(0)
        out.update(device=p.name, memory_bytes=p.total_memory, capability=f"{p.major}.{p.minor}",
                   multiprocessors=p.multi_processor_count, nccl=str(torch.cuda.nccl.version()))
    return out


def hide_paramiko(work: Path) -> Path:
    """A folder whose `paramiko` cannot be imported, first on every part's path: a part that needs it fails here
    as it would on the device image."""
    d = work / "hide"
    (d / "paramiko").mkdir(parents=True)
    (d / "paramiko" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'paramiko' (hidden by bench.gpu_check: the device image has "
        "none)\", name='paramiko')\n")
    return d


def gpu_spec(work: Path, f: dict) -> Path:
    """A cluster spec of this machine's one GPU (JSON is YAML): its model key (h100, h200) and 90 % of its memory
    as the calibration's budget (the CUDA context and the allocator's cache take the rest)."""
    name = f["device"].lower()
    model = next((m for m in ("h200", "h100", "a100", "v100") if m in name), "gpu")
    spec = {"name": "this-gpu", "description": f"this machine's {f['device']}, one worker (bench.gpu_check)",
            "hosts": ["localhost"], "devices_per_host": 1,
            "device": {"kind": "gpu", "model": model, "memory_gb": round(f["memory_bytes"] * 0.9 / 1e9, 1)},
            "interconnect": {k: {"name": "none (one device)", "bandwidth_gbps": 100, "latency_us": 5,
                                 "source": "unused: one device"} for k in ("intra_host", "inter_host")},
            "scheduler": "none", "transport": "local", "engine": "torch"}
    path = work / "this-gpu.yaml"
    write_json(path, spec)
    return path


# -- the parts' own processes ----------------------------------------------------------------------------------

class _Failed(Exception):
    """A step of a part that failed: its message goes into the part's JSON."""


def _podrun(*args, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    cp = subprocess.run([sys.executable, "-m", "podrun", *map(str, args)], capture_output=True, text=True, cwd=cwd)
    print(f"$ podrun {' '.join(map(str, args))}\nexit {cp.returncode}\n{cp.stderr[-3000:]}", flush=True)
    if check and cp.returncode != 0:
        raise _Failed(f"podrun {args[0]} exited {cp.returncode}: {cp.stderr.strip()[-1500:]}")
    return cp


def part_calibrate(form: Form, out: Path, work: Path, f: dict) -> int:
    """`podrun calibrate` for the recipe on this machine's one device, `podrun plan --calibration` at the recipe's
    global batch and at the smallest timed local batch with GA 1, and a launched run of that plan: the estimate
    beside the run's step time (the median of its step rows after the warm-up). calibrate.json after each step."""
    rec: dict = {"form": form.name, "recipe": form.recipe}
    try:
        _calibrate(form, work, f, rec, lambda: write_json(out / "calibrate.json", rec))
        return 0
    except _Failed as exc:
        rec["error"] = str(exc)
        return 1
    finally:
        write_json(out / "calibrate.json", rec)


def _calibrate(form: Form, work: Path, f: dict, rec: dict, save) -> None:
    from podrun.rundir.metrics import read_metrics

    recipe = str(ROOT / "recipes" / form.recipe)
    where = ["--cluster", str(gpu_spec(work, f))] if form.name == "cuda" else \
        ["--cluster", "local", "--devices-per-host", "1"]
    runs = work / "runs"
    calibrate = ["calibrate", *where, *form.calibrate, "--runs-dir", runs, "--name", "gpu-check", "--json", recipe]
    t0 = time.monotonic()
    c = _podrun(*calibrate, cwd=work, check=form.name == "cpu")
    if c.returncode != 0:       # the search failed on the device: kept, and the rate and estimate still measured
        rec["search_failed"] = c.stderr.strip()[-1500:]
        c = _podrun(*calibrate[:-1], "--largest-batch", "256", recipe, cwd=work)
    rec["calibrate_seconds"] = round(time.monotonic() - t0, 1)
    cal = json.loads(c.stdout)
    rec["calibration"] = {k: cal.get(k) for k in ("device", "memory", "throughput", "image_size", "seconds")}
    save()
    batch = min(r["local_batch"] for r in cal["throughput"])
    rec["plans"] = {}
    for key, extra in (("recipe_global_batch", ()), ("run", ("--global-batch", batch))):
        d = json.loads(_podrun("plan", *where, "--calibration", cal["file"], *extra, "--json", recipe, cwd=work).stdout)
        rec["plans"][key] = {k: d[k] for k in ("local_batch", "grad_accum", "global_batch")} | {
            k: d["estimate"][k] for k in ("step_seconds", "images_per_second")}
    save()
    argv = ["launch", *where, "--calibration", cal["file"], "--global-batch", batch, "--runs-dir", runs, "--run-id",
            "gpu-check-run", recipe, "--data", "synthetic", "--steps", form.run_steps, *form.run, "--eval-every", "0",
            "--keep-checkpoints", "0", "--quiet"]
    _podrun(*argv, cwd=work)
    steps = [r["step_seconds"] for r in read_metrics(runs / "gpu-check-run")
             if r.get("kind") == "step" and r["step"] > form.warm_steps]
    if not steps:
        raise _Failed(f"the run wrote no step after step {form.warm_steps}")
    run_step, est = statistics.median(steps), rec["plans"]["run"]["step_seconds"]
    rec["run"] = {"command": "podrun " + " ".join(map(str, argv)), "steps": form.run_steps,
                  "timed_from_step": form.warm_steps + 1, "step_seconds": run_step, "rows": len(steps)}
    rec["estimate_vs_run"] = {"estimate_step_seconds": est, "run_step_seconds": run_step,
                              "ratio": round(est / run_step, 3), "within_10_percent": abs(est / run_step - 1) <= 0.10}


def part_bench(form: Form, out: Path, work: Path, f: dict) -> int:
    """`bench gpu` quick (bench/bench_gpu.py), its rows written after each model."""
    from bench import bench_gpu

    record = {"benchmark": "gpu", "quick": True, "form": form.name,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": f"{f.get('device', 'cpu')}; torch {f['torch']}; timm {f['timm']}",
              "command": "python -m bench.gpu_check OUT (its bench part: python -m bench --quick gpu)", "rows": []}

    def on_rows(rows):
        record["rows"] = rows
        write_json(out / "bench.json", record)
        print(f"bench: {len(rows)} rows so far", flush=True)

    rows = bench_gpu.measure(True, device=form.name, models=form.bench_models, compile=form.name == "cuda",
                             counts=form.bench_counts, compiled=form.bench_compiled, on_rows=on_rows,
                             threads=1 if form.name == "cpu" else None)
    if form.name == "cuda":     # ResNet-50 from JPEG, the device's decoder beside device-resident input (a GPU only)
        from bench import gpu_check_data

        on_rows(rows + gpu_check_data.measure("cuda", **gpu_check_data.CUDA_SIZES))
    return 0


# -- the call: each part in its own process group, stopped at its limit ----------------------------------------

def _stop(p: subprocess.Popen) -> None:
    """SIGTERM to the part's process group (podrun's controllers stop their workers on it), SIGKILL after GRACE_S."""
    for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, 30)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _tests_json(report: Path, out: Path, form: Form) -> dict:
    results = [json.loads(line) for line in report.read_text().splitlines() if line.strip()] if report.exists() else []
    counts: dict = {}
    for r in results:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    value = {"form": form.name, "twin": form.name == "cpu", "deselect": form.deselect, "counts": counts,
             "results": results}
    write_json(out / "tests.json", value)
    return counts


def figures(out: Path) -> list[str]:
    """The figures in a few lines, for the log and the console: each test's outcome, the estimate beside the run,
    each measured row of the benchmark."""
    def read(name):
        try:
            return json.loads((out / name).read_text())
        except (OSError, ValueError):
            return None

    lines = []
    for r in (read("tests.json") or {}).get("results", []):
        lines.append(f"  test {r['outcome']:10} {r['seconds']:6.1f} s  {r['test']}"
                     + (f": {r['message'][:160]}" if r.get("message") else ""))
    cal = read("calibrate.json") or {}
    if "estimate_vs_run" in cal:
        e = cal["estimate_vs_run"]
        lines.append(f"  calibrate {cal['recipe']}: estimate {e['estimate_step_seconds']:.4g} s per step, run "
                     f"{e['run_step_seconds']:.4g} s: ratio {e['ratio']} (within 10 %: {e['within_10_percent']})")
    elif cal:
        lines.append(f"  calibrate {cal['recipe']}: {cal.get('error', 'not finished')[:300]}")
    for r in (read("bench.json") or {}).get("rows", []):
        lines.append(f"  bench {r['benchmark'].rsplit(', ', 1)[-1]}, {r['subject']}: {r['value']} {r['unit']}"
                     + (f" ({r['ratio']}x timm)" if r.get("ratio") else "") + f"; {r['note'][:140]}")
    return lines


def run_part(name: str, cmd: list[str], env: dict, limit: float, output: Path) -> dict:
    """One part in a process group of its own, its output appended to ``output``, stopped at ``limit`` seconds."""
    t = time.monotonic()
    with open(output, "a") as sink:
        sink.write(f"\n===== {name} =====\n")
        sink.flush()
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = p.wait(timeout=limit)
            status = "ok" if rc == 0 else f"failed (exit {rc})"
        except subprocess.TimeoutExpired:
            _stop(p)
            rc, status = None, f"stopped at its limit of {limit:.0f} s"
    return {"part": name, "status": status, "seconds": round(time.monotonic() - t, 1), "limit_s": round(limit),
            "exit": rc}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="folder for the JSON figures and the log (made if missing)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--cpu", action="store_true", help="the CPU form even where CUDA is")
    ap.add_argument("--limit", action="append", default=[], metavar="PART=S", help="a part's time limit in seconds")
    ap.add_argument("--total", type=float, metavar="S", help="the whole call's time limit in seconds "
                    "(default: the form's, 430 on a GPU, 330 in the CPU form)")
    ap.add_argument("--part", choices=("calibrate", "bench"), help=argparse.SUPPRESS)     # inside a part's process
    ap.add_argument("--form", choices=("cuda", "cpu"), help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    if args.part:
        work = Path(args.work)
        fn = part_calibrate if args.part == "calibrate" else part_bench
        return fn(CUDA if args.form == "cuda" else CPU, out, work, json.loads((work / "facts.json").read_text()))
    parts = [p for p in args.parts.split(",") if p]
    try:
        given = {k: float(v) for k, v in (x.split("=", 1) for x in args.limit)}
    except ValueError:
        given = {"": 0.0}
    if not parts or set(parts) - set(PARTS) or set(given) - set(PARTS) or not all(v > 0 for v in given.values()):
        ap.error(f"--parts and --limit name parts of {', '.join(PARTS)} (--limit PART=SECONDS, above 0): "
                 f"not {args.parts!r}, {args.limit}")
    if args.total is not None and not args.total > 0:
        ap.error(f"--total is the call's limit in seconds, above 0: not {args.total:g}")
    out.mkdir(parents=True, exist_ok=True)
    t0, log = time.monotonic(), []

    def say(line: str) -> None:
        print(line, flush=True)
        log.append(line)
        (out / "log.txt").write_text("\n".join(log) + "\n")

    f = facts()
    form = CUDA if f["cuda"] and not args.cpu else CPU
    limits = {**form.limits, **given}
    total = form.total if args.total is None else args.total
    if form.name == "cuda":
        say(f"gpu-check on {f['device']} ({f['memory_bytes'] / 2**30:.0f} GiB, torch {f['torch']}, CUDA "
            f"{f['cuda_version']}, NCCL {f['nccl']}, timm {f['timm']})")
    else:
        say(f"{'CPU form asked for (--cpu)' if f['cuda'] else 'no CUDA device here'} (torch {f['torch']}): the CPU "
            f"form runs, the same parts at tiny sizes (the compile tests and compiled subjects left out); no figure "
            f"here is a GPU's")
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    summary = {"command": "python -m bench.gpu_check " + " ".join(sys.argv[1:] if argv is None else argv),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "form": form.name, "facts": f,
               "limits_s": limits, "total_limit_s": total, "parts": []}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(hide_paramiko(work)), str(ROOT), os.environ.get("PYTHONPATH")) if p),
        "PYTHONUNBUFFERED": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    if form.name == "cpu":        # no part reaches a GPU, one thread each (2 cores shared here)
        env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    try:
        write_json(work / "facts.json", f)
        (out / "output.txt").write_text("")
        for name in (p for p in PARTS if p in parts):
            left = total - (time.monotonic() - t0)
            if left < 5:
                summary["parts"].append({"part": name, "status": "not run", "note": "no time left in the call"})
                say(f"{name}: not run: {left:.0f} s left of the call's {total:g} s")
                continue
            if name == "tests":
                cmd = [sys.executable, "-m", "pytest", "-o", "addopts=-ra", "-p", "no:cacheprovider", "-v",
                       "tests/gpu"] + (["-k", form.deselect] if form.deselect else [])
                penv = {**env, REPORT_ENV: str(work / "tests.jsonl")}
                if form.name == "cpu":
                    penv[TWIN_ENV] = "cpu"
            else:
                cmd = [sys.executable, "-m", "bench.gpu_check", str(out), "--part", name, "--form", form.name,
                       "--work", str(work)]
                penv = env
            limit = min(limits[name], left)
            say(f"{name}: started, limit {limit:.0f} s")
            entry = run_part(name, cmd, penv, limit, out / "output.txt")
            if name == "tests":
                entry["tests"] = _tests_json(work / "tests.jsonl", out, form)
            summary["parts"].append(entry)
            say(f"{name}: {entry['status']} in {entry['seconds']:.0f} s"
                + (f"; tests {entry['tests']}" if name == "tests" else ""))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        summary["seconds"] = round(time.monotonic() - t0, 1)
        write_json(out / "summary.json", summary)
    for line in figures(out):
        say(line)
    ok = sum(p["status"] == "ok" for p in summary["parts"])
    say(f"gpu-check: {ok} of {len(summary['parts'])} parts ok in {summary['seconds']:.0f} s "
        f"({'on ' + f['device'] if form.name == 'cuda' else 'CPU form'}); figures in {out}")
    return 0 if ok == len(summary["parts"]) else 1


if __name__ == "__main__":
    sys.exit(main())
