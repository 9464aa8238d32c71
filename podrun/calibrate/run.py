"""`podrun calibrate`'s controller: the worker launched on the hosts through podrun launch's own path (plan,
request, transport, supervision), its result read from the run directory, the calibration file written whole."""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from podrun import __version__, safefs
from podrun.specs.calibration import (Calibration, InputRate, InputResult, LinkResult, MemoryProbe, MemoryResult,
                                      NetworkResult, OverlapResult, RatePoint, SUBDIR, check_name, dumps, utc_now)
from podrun.errors import LaunchError, PlanError
from podrun.plan.inputs import PlanOptions
from podrun.rundir.layout import make_runs_dir, new_run_id, private_subdir

WORKER = "podrun.calibrate.worker"


@dataclass(frozen=True)
class CalibrateOptions:
    recipe: str
    plan: PlanOptions = PlanOptions()                          # the host options (cluster, hosts, devices per host ...)
    device_memory_gb: float | None = None       # None: the cluster spec's device memory
    batches: tuple[int, ...] = ()               # local batches to time; () the plans' own
    steps: int = 5
    image_size: int | None = None               # input side in pixels; None: the recipe's
    largest_batch: int | None = None            # the largest local batch, given: no memory search
    name: str | None = None                     # None: <recipe>-<cluster>
    runs_dir: str = "runs"
    transport: str | None = None
    ssh_config: str | None = None
    python: str | None = None
    master_port: int | None = None
    data: str | None = None                     # a sample of the user's data: the input pipeline timed on it
    input_images: int = 128                     # images timed per loader worker count


def budget_of(opts: CalibrateOptions, cluster) -> tuple[int | None, str]:
    """(bytes, where from): --device-memory, else the spec's device memory; none at all is an error (exit 2).
    With --largest-batch there is no search and no budget: (None, "--largest-batch N"); with --device-memory
    too, an error (exit 2): the one makes the other meaningless."""
    if opts.largest_batch is not None:
        if opts.device_memory_gb is not None:
            raise PlanError("--largest-batch and --device-memory were both given: --largest-batch takes the largest "
                            "local batch as given and skips the memory search that --device-memory bounds",
                            hint="give --device-memory to search for the largest batch, or --largest-batch alone")
        return None, f"--largest-batch {opts.largest_batch}"
    if opts.device_memory_gb is not None:
        return int(opts.device_memory_gb * 1e9), f"--device-memory {opts.device_memory_gb:g} GB"
    gb = cluster.device.memory_gb
    if gb > 0:
        return int(gb * 1e9), f"device memory {gb:g} GB of cluster spec {cluster.name}"
    raise PlanError(f"cluster spec {cluster.name} gives no device memory (device.memory_gb is 0) for the "
                    "largest-batch search", hint="pass --device-memory GB (on CPU: the memory one worker may use)")


def launch_options(opts: CalibrateOptions, recipe_path: str, budget: int | None, run_id: str):
    """podrun launch's options for the calibration worker: the same plan options, the worker as a module, started
    cold (its memory probes are child processes of their own, whose peak a zygote's shared pages would blur)."""
    from podrun.launch.options import LaunchOptions, OutputOptions, RestartOptions, TargetOptions, TransportOptions
    from podrun.launch.request import SSHOptions

    args = [WORKER, "--recipe", recipe_path, "--steps", str(opts.steps)]
    args += ["--largest", str(opts.largest_batch)] if budget is None else ["--budget", str(budget)]
    if opts.batches:
        args += ["--batches", ",".join(str(b) for b in opts.batches)]
    if opts.image_size is not None:
        args += ["--image-size", str(opts.image_size)]
    if opts.data is not None:
        args += ["--data", os.path.abspath(opts.data), "--input-images", str(opts.input_images)]
    return LaunchOptions(
        target=TargetOptions(args=tuple(args), module=True, needs=("yaml", "torch", "numpy")),
        plan=opts.plan,
        transports=TransportOptions(transport=opts.transport, ssh=SSHOptions(config_path=opts.ssh_config),
                                    python=opts.python, master_port=opts.master_port),
        output=OutputOptions(run_id=run_id, runs_dir=opts.runs_dir),
        restarts=RestartOptions(warm=False),
    )


class Progress:
    """One line that the workers' 'calibrate:' lines rewrite (a tty), or those lines as they come (else)."""

    def __init__(self, stream=None):
        self.stream = sys.stderr if stream is None else stream
        self.tty = self.stream.isatty()
        self.t0 = time.monotonic()
        self.tail: list[str] = []

    def sink(self, index, host, local_rank, stream, text):
        if text.startswith("calibrate: "):
            line = f"[{time.monotonic() - self.t0:5.1f} s] {text[len('calibrate: '):]}"
            self.stream.write("\r\x1b[2K" + line[:150] if self.tty else line + "\n")
            self.stream.flush()
        else:
            self.tail = (self.tail + [f"[{index} {host}] {text}"])[-20:]

    def close(self):
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def calibrate(opts: CalibrateOptions, progress: Progress | None = None) -> tuple[Calibration, Path]:
    """Run the calibration; (what was measured, the file written). A host that fails: LaunchError naming it, and
    no file; a budget below one sample: PlanError (exit 2) with the smallest that fits."""
    from podrun.launch.prepare import prepare_launch
    from podrun.launch.run import execute
    from podrun.plan.inputs import resolve_plan_inputs

    cluster, recipe, _, _ = resolve_plan_inputs(opts.recipe, opts.plan)
    if opts.data is not None and not Path(opts.data).is_dir():
        raise PlanError(f"--data {opts.data}: no such folder here", hint="give a sample of your data (an "
                        "ImageNet-style folder or its shards from podrun data pack) at the same path here and on "
                        "every host")
    name = check_name(opts.name if opts.name is not None else f"{recipe.name}-{cluster.name}")
    budget, budget_source = budget_of(opts, cluster)
    progress = Progress() if progress is None else progress
    run_id = f"calibrate-{new_run_id()}"
    prepared = prepare_launch(launch_options(opts, os.path.abspath(recipe.path), budget, run_id))
    request = prepared.request
    started = time.monotonic()
    try:
        _, summary = execute(request, sink=progress.sink, notice=lambda t: None)
    finally:
        progress.close()
    if summary.exit_code != 0:
        rc = summary.root_cause or {}
        where = f"host {rc['host']} (instance {rc['instance']}): {rc.get('reason', '')}" if rc.get("host") else \
            f"exit {summary.exit_code}"
        raise LaunchError(f"calibration failed on {where}; no calibration file written",
                          hint=f"logs in {request.run_dir}", exit_code=1)
    result_path = Path(request.run_dir) / "calibration-result.json"
    try:
        result = json.loads(safefs.read_trusted(result_path, "calibration result", limit=1 << 24, error=LaunchError))
    except (OSError, ValueError) as exc:
        raise LaunchError(f"the calibration workers left no result in {result_path} ({exc}); no calibration file "
                          "written", exit_code=1) from None
    plan = request.plan
    if result.get("error") == "budget":
        one = result.get("batch1_bytes")
        need = "it died" if one is None else f"it takes {one / 1e9:.3g} GB ({one / 2**20:.0f} MiB)"
        raise PlanError(f"the memory budget ({budget_source}, {budget / 1e9:.3g} GB) is smaller than one sample of "
                        f"{recipe.name}: a training step at local batch 1 does not fit; {need}",
                        hint="give --device-memory of at least "
                             f"{'that' if one is None else f'{one / 1e9:.3g}'} GB, or a device with more memory")
    cal = build(result, recipe=recipe, cluster=cluster, plan=plan, budget=budget, budget_source=budget_source,
                version=__version__, seconds=time.monotonic() - started)
    return cal, save(cal, opts.runs_dir, name)


def build(result: dict, *, recipe, cluster, plan, budget: int | None, budget_source: str, version: str,
          seconds: float) -> Calibration:
    """The Calibration from the workers' result (a dict only here, at the boundary)."""
    from podrun.calibrate.step_method import method_for

    def link(d):
        return None if d is None else LinkResult(**d)

    net = result["network"]
    return Calibration(
        format=1, recipe=recipe.name, model=recipe.model.name, cluster=cluster.name, device=plan.device_kind,
        hosts=tuple(plan.hosts), devices_per_host=plan.devices_per_host, measured_at=utc_now(),
        podrun_version=version, precision=recipe.precision,
        memory=MemoryResult(budget_bytes=budget, budget_source=budget_source,
                            method="given" if budget is None else method_for(result["device"]),
                            largest_local_batch=result["largest"],
                            probes=tuple(MemoryProbe(local_batch=p["local_batch"], fits=p["fits"],
                                                     peak_bytes=p["peak_bytes"], error=p.get("error", ""))
                                         for p in result["probes"])),
        throughput=tuple(RatePoint(**p) for p in result["throughput"]),
        network=NetworkResult(backend=net["backend"], intra_host=link(net["intra_host"]),
                              inter_host=link(net["inter_host"])),
        seconds=round(seconds, 1), image_size=result.get("image_size"),
        overlap=None if result.get("overlap") is None else OverlapResult(**result["overlap"]),
        input=None if result.get("input") is None else InputResult(
            **{**result["input"], "rates": tuple(InputRate(**r) for r in result["input"]["rates"])}),
    )


def summary_rows(c: Calibration) -> list[tuple[str, str]]:
    """The summary table: (what, measured)."""
    m = c.memory
    largest = (f"{m.largest_local_batch} under {m.budget_bytes / 1e9:.3g} GB ({m.budget_source}; "
               f"{len(m.probes)} probes)" if m.searched else
               f"{m.largest_local_batch}, given ({m.budget_source}; not searched)")
    rows = [("hosts", f"{', '.join(c.hosts)} ({c.devices_per_host} x {c.device} each)"),
            ("inputs", "not recorded" if c.image_size is None else f"{c.image_size} x {c.image_size} px"),
            ("largest local batch", largest)]
    for p in c.throughput:
        rows.append((f"rate at local batch {p.local_batch}",
                     f"{p.images_per_second:.1f} img/s per device ({p.step_seconds * 1e3:.0f} ms a step)"))
    for key, link in (("intra-host all-reduce", c.network.intra_host), ("inter-host all-reduce", c.network.inter_host)):
        if link is not None:
            rows.append((key, f"bus bandwidth {link.bus_bandwidth_gbps:.3g} Gb/s, latency {link.latency_us:.0f} us "
                              f"({link.ranks} ranks, {link.message_bytes / 2**20:.1f} MiB)"))
    o = c.overlap
    if o is not None:
        rows.append(("data-parallel step", f"{o.synced_step_seconds * 1e3:.0f} ms at local batch {o.local_batch} on "
                                           f"{o.ranks} ranks: {o.hidden_fraction:.0%} of the all-reduce "
                                           f"({o.allreduce_seconds * 1e3:.0f} ms) hidden"))
    i = c.input
    if i is not None:
        rates = ", ".join(f"{r.images_per_second:.0f} at {r.workers}" for r in i.rates)
        rows.append(("input pipeline", f"img/s by loader workers: {rates} ({i.decoder}, {i.image_size} px, "
                                       f"{i.cores} cores, {i.data}; the slowest of {i.hosts} host(s))"))
    rows.append(("took", f"{c.seconds:.0f} s"))
    return rows


def save(c: Calibration, runs_dir: str | Path, name: str) -> Path:
    """Write <runs>/calibrations/<name>.yaml whole: a new private file beside it, then a rename over it, so a
    reader sees the old file or the new one, never a part. The runs dir is made as a launch makes it, the
    calibrations folder private (0700, checked with lstat)."""
    folder = private_subdir(make_runs_dir(runs_dir), SUBDIR, "calibrations directory")
    target = folder / f"{check_name(name)}.yaml"
    return safefs.write_file(target, dumps(c), "calibration file")    # a new private file (0600), renamed over it
