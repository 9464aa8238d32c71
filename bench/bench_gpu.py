"""GPU training throughput (issue 6): podrun's models and runner against timm's models in a plain AMP loop,
same device, batch and precision, side by side in one run; MFU for ViT-B/16. Needs a CUDA device and timm.

    python -m bench gpu             # resnet50 and vit_b16 at 224 px, efficientnet_b4 at 320 px
    python -m bench --quick gpu     # fewer steps

Subjects per model, repeats interleaved (timm, podrun model, podrun runner, timm, ...), img/s from the
median step time after warm-up:
- peer: timm.create_model(NAME) in a plain loop: bf16 autocast, SGD with momentum (torch's default
  foreach path), float32 NCHW input already on the device, no compile (what a hand-written loop does);
- podrun model, plain loop: podrun.models.build(NAME) in exactly that loop (the models alone);
- podrun runner: podrun.train.runner.train on synthetic uint8 images (normalised on the device),
  bf16, channels_last, fused SGD, prefetch thread: what `podrun launch recipes/...` runs; with
  compile as a fourth subject (torch.compile, default mode).
MFU: FLOPs of one training step counted by torch.utils.flop_counter on the model itself (forward and
backward), times steps/s, over the device's dense bf16 peak (PEAK_BF16). Without a CUDA device this
returns one row that says so: nothing is measured on a CPU here (bench/gpu_check.py runs the same code on the CPU
at tiny sizes, to keep it working).

The compiled subject runs once per model (its compile, 30-90 s on a GPU, would dominate the repeats), after
every model's eager subjects, so that a run cut short keeps those. A runner's step row is the time between two
fetches of its step statistics (one host sync per ``sync_every`` updates) shared by the updates between them; the
runner subjects fetch every ``warmup`` updates, so the warm-up (and the compile) is an interval of its own and does
not dilute the timed updates (on CUDA the default, every 10, put warm-up and timed updates in one interval).
"""
from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

# (podrun name, timm name, image size, batch)
MODELS = (("resnet50", "resnet50", 224, 256), ("efficientnet_b4", "efficientnet_b4", 320, 64),
          ("vit_b16", "vit_base_patch16_224", 224, 256))
# Dense bf16 tensor-core peak, FLOP/s: NVIDIA H100 SXM and H200 datasheets give 1,979 TFLOPS with
# sparsity, i.e. 989 TFLOPS dense; H100 PCIe 1,513 with sparsity (756 dense); A100 312 dense.
PEAK_BF16 = {"H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12, "A100": 312e12}


def peak_for(device_name: str) -> float | None:
    for key in sorted(PEAK_BF16, key=len, reverse=True):      # "H100 PCIe" before "H100"
        if key.lower() in device_name.lower():
            return PEAK_BF16[key]
    return None


def plain_loop(model, batch: int, size: int, steps: int, warmup: int, device: str = "cuda") -> list[float]:
    """Seconds per step of a hand-written AMP loop (the peer's loop, used for both model families),
    timed over all steps after warm-up with one synchronisation at each end, so the host queues ahead."""
    import torch
    import torch.nn.functional as F

    model = model.to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, size, size, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)
    dtype = torch.bfloat16
    t = 0.0
    for i in range(warmup + steps):
        if i == warmup:
            _sync(device)
            t = time.perf_counter()
        with torch.autocast(device_type=device, dtype=dtype):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    _sync(device)
    return [(time.perf_counter() - t) / steps]


def model_kwargs(name: str, size: int) -> dict:
    """podrun's build options for inputs of ``size`` pixels: the ViT's position table is sized by them."""
    from podrun import models as pm

    return {"image_size": size} if "image_size" in pm.options(name) else {}


def runner_steps(name: str, batch: int, size: int, steps: int, warmup: int, run_dir: Path, *,
                 compile: bool = False, device: str = "cuda", threads: int | None = None) -> list[float]:
    """Per-step seconds of podrun's runner (its own metrics), as the recipes run it, after ``warmup`` updates:
    the runner fetches its step statistics (one host sync) every ``warmup`` updates, so the warm-up is an interval
    of its own; no snapshot, no checkpoint."""
    from podrun.runtime.env import read_worker_info
    from podrun.rundir.metrics import read_metrics
    from podrun.train.runner import TrainConfig, train

    cfg = TrainConfig(model=name, model_kwargs=model_kwargs(name, size), data="synthetic", image_size=size,
                      num_classes=1000, synthetic_size=batch * 4, steps=warmup + steps, global_batch=batch, lr=0.01,
                      optimizer="sgd", momentum=0.9, amp="bf16", channels_last=True, compile=compile, device=device,
                      run_dir=str(run_dir), resume=False, eval_every=0, console=False, checkpoint_every=0,
                      keep_checkpoints=0, snapshots=False, sync_every=max(1, warmup), threads=threads)
    train(cfg, read_worker_info({}))
    step = [r["step_seconds"] for r in read_metrics(run_dir) if r.get("kind") == "step"]
    return step[warmup:]


def train_flops(model, batch: int, size: int, device: str = "cuda") -> float:
    """FLOPs of one forward + backward at this batch, as torch's flop counter sees them."""
    import torch
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    model = model.to(device).train()
    x = torch.randn(batch, 3, size, size, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)
    with FlopCounterMode(display=False) as counter:
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _free(device: str) -> None:
    import gc

    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def _timed(subjects: dict, repeats: int, batch: int, device: str) -> tuple[dict[str, list[float]], dict[str, str]]:
    """img/s of each subject per repeat, the repeats interleaved; a subject that fails is said ("failed: why"), not
    fatal."""
    ips: dict[str, list[float]] = {k: [] for k in subjects}
    errors: dict[str, str] = {}
    for _ in range(repeats):
        for k, f in subjects.items():
            if k in errors:
                continue
            try:
                ips[k].append(batch / statistics.median(f()))
            except Exception as exc:  # noqa: BLE001 - e.g. compile unavailable: reported, not fatal
                errors[k] = f"failed: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
            _free(device)
    return ips, errors


def measure(quick: bool, device: str = "cuda", models=MODELS, compile: bool = True,
            counts: tuple[int, int, int] | None = None, *, compiled: Iterable[str] | None = None,
            on_rows: Callable[[list[dict]], None] | None = None, threads: int | None = None) -> list[dict]:
    """Rows of train throughput for each model: timm's plain loop (the peer, when installed), podrun's model in
    the same loop, podrun's runner; then, with ``compile``, the compiled runner once for each model in ``compiled``
    (all when None). ``counts`` (steps, warm-up, repeats) overrides the mode's. ``on_rows`` gets every row so far
    after each model (bench/gpu_check.py writes them, so that a run stopped at its time limit keeps them)."""
    import torch

    from podrun import models as pm

    try:
        import timm
    except ImportError:
        timm = None
    steps, warmup, repeats = counts if counts is not None else (10, 5, 2) if quick else (30, 10, 3)
    name_dev = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    peak = peak_for(name_dev) if device == "cuda" else None
    rows: list[dict] = []
    peers: dict[str, float | None] = {}
    flops: dict[str, float] = {}

    def add(ours, theirs, size, batch, ips, errors, how):
        peer = peers[ours]
        for k, vals in ips.items():
            if not vals:
                continue
            v = statistics.median(vals)
            note = f"{name_dev}; bf16; batch {batch} at {size} px; {how}"
            if ours in flops and peak:
                note += (f"; MFU {v * flops[ours] / peak:.1%} ({flops[ours] / 1e9:.1f} GFLOP per image fwd+bwd, "
                         f"peak {peak / 1e12:.0f} TFLOP/s)")
            rows.append({"benchmark": f"GPU train throughput, {ours}", "subject": k, "value": round(v, 1),
                         "peer": f"timm {theirs}, plain loop" if peer else None,
                         "peer_value": round(peer, 1) if peer else None,
                         "ratio": round(v / peer, 3) if peer else None, "unit": "img/s", "note": note})
        for k, why in errors.items():
            rows.append({"benchmark": f"GPU train throughput, {ours}", "subject": k, "value": None, "peer": None,
                         "peer_value": None, "ratio": None, "unit": "img/s", "note": why})
        if on_rows is not None:
            on_rows(list(rows))

    with tempfile.TemporaryDirectory() as tmp:
        def runner(ours, batch, size, compiled_=False):
            return runner_steps(ours, batch, size, steps, warmup, Path(tempfile.mkdtemp(dir=tmp)), compile=compiled_,
                                device=device, threads=threads)

        for ours, theirs, size, batch in models:
            kw = model_kwargs(ours, size)
            subjects = {"podrun model, plain loop": lambda: plain_loop(pm.build(ours, 1000, **kw), batch, size, steps,
                                                                       warmup, device),
                        "podrun runner": lambda: runner(ours, batch, size)}
            if timm is not None:
                timm_kw = {"img_size": size} if "vit" in theirs and size != 224 else {}
                subjects = {"timm, plain loop": lambda: plain_loop(timm.create_model(theirs, num_classes=1000,
                                                                                     **timm_kw),
                                                                   batch, size, steps, warmup, device), **subjects}
            ips, errors = _timed(subjects, repeats, batch, device)
            timm_ips = ips.pop("timm, plain loop", None)
            peers[ours] = statistics.median(timm_ips) if timm_ips else None
            if ours == "vit_b16" and peak:         # the FLOPs serve the MFU alone, which needs the device's peak
                flops[ours] = train_flops(pm.build(ours, 1000, **kw), batch, size, device) / batch
                _free(device)
            if timm is None:
                errors["timm, plain loop"] = "timm is not installed here: no peer"
            add(ours, theirs, size, batch, ips, errors,
                (f"median of {repeats} interleaved repeats of" if repeats > 1 else "one run of")
                + f" {steps} steps after {warmup} warm-up")
        for ours, theirs, size, batch in models if compile else ():
            if compiled is None or ours in compiled:
                ips, errors = _timed({"podrun runner + compile": lambda: runner(ours, batch, size, True)}, 1, batch,
                                     device)
                add(ours, theirs, size, batch, ips, errors,
                    f"one run of {steps} steps after {warmup} warm-up (the compile among them)")
    return rows


def run(quick: bool) -> list[dict]:
    import torch

    if not torch.cuda.is_available():
        return [{"benchmark": "GPU train throughput", "subject": "podrun vs timm", "value": None, "peer": None,
                 "peer_value": None, "ratio": None, "unit": "img/s",
                 "note": "no CUDA device on this machine: not measured (run it on a lent GPU)"}]
    return measure(quick)


if __name__ == "__main__":
    from bench.rows import run_alone

    run_alone(run)
