"""The recipes' runner on CUDA, one update each: bf16 autocast, channels_last, fused SGD or LARS, eager and compiled,
as `podrun launch recipes/...` runs it (podrun.train.runner.train in this process, synthetic uint8 images)."""
from __future__ import annotations

import math

import pytest

from tests.gpu.needs import cuda_or_twin


def _case(compiled: bool, device: str) -> tuple[str, int, int]:
    """(model, image size, local batch). Eager: the LARS recipe's resnet50. Compiled: resnet18, whose compile (its
    graph, not its size, sets the cost: some 30 s on the device, docs/gpu-check.md) keeps the pair inside the
    tests' budget; `bench gpu` compiles resnet50 and vit_b16 at their full size."""
    if compiled:
        return "resnet18", 32, 8
    return ("resnet50", 64, 8) if device == "cuda" else ("resnet50", 32, 4)


@pytest.mark.parametrize("optimizer", ["sgd", "lars"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compile"])
def test_runner_one_update_in_bf16_channels_last(tmp_path, optimizer, compiled):
    """Seen from inside the step (torch's global optimizer and module hooks, not podrun's records alone): every
    parameter on the device, the 4-d ones channels_last, fp32 gradients, torch's fused SGD kernel on CUDA (LARS
    is podrun's own multi-tensor optimiser, never fused); eager, every convolution's output bf16 and channels_last;
    compiled, dynamo made a graph. One update, a finite loss, the run record says the device and bf16."""
    device = cuda_or_twin()
    import torch
    from torch import nn
    from torch._dynamo.utils import counters
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from podrun.runtime.env import read_worker_info
    from podrun.rundir.metrics import read_metrics
    from podrun.train.runner import TrainConfig, train

    model, size, batch = _case(compiled, device)
    updates, convs = [], []

    def on_step(opt, args, kwargs):
        params = [p for g in opt.param_groups for p in g["params"]]
        updates.append({"optimizer": type(opt).__name__, "fused": bool(opt.defaults.get("fused")),
                        "devices": sorted({p.device.type for p in params}),
                        "channels_last": all(p.is_contiguous(memory_format=torch.channels_last)
                                             for p in params if p.dim() == 4),
                        "grads": sorted({str(p.grad.dtype) for p in params if p.grad is not None})})

    def on_forward(module, args, out):
        if isinstance(module, nn.Conv2d):
            convs.append((out.dtype, out.is_contiguous(memory_format=torch.channels_last)))

    hooks = [register_optimizer_step_pre_hook(on_step)]
    if compiled:
        torch._dynamo.reset()
        counters.clear()
    else:                   # a global hook inside a compiled region would break its graph: eager only
        hooks.append(nn.modules.module.register_module_forward_hook(on_forward))
    cfg = TrainConfig(model=model, data="synthetic", image_size=size, num_classes=10, synthetic_size=batch * 2,
                      steps=1, global_batch=batch, lr=0.01, optimizer=optimizer, momentum=0.9, amp="bf16",
                      channels_last=True, compile=compiled, device=device, run_dir=str(tmp_path), resume=False,
                      snapshots=False, eval_every=0, console=False, keep_checkpoints=0,
                      threads=1 if device == "cpu" else None)
    try:
        summary = train(cfg, read_worker_info({}))
    finally:
        for h in hooks:
            h.remove()

    assert summary["steps"] == 1 and summary["not_written"] == [], summary
    assert len(updates) == 1, updates
    seen = updates[0]
    assert seen["optimizer"] == {"sgd": "SGD", "lars": "LARS"}[optimizer], seen
    assert seen["fused"] is (optimizer == "sgd" and device == "cuda"), seen
    assert seen["devices"] == [device] and seen["channels_last"] and seen["grads"] == ["torch.float32"], seen
    records = read_metrics(tmp_path)
    start = next(r for r in records if r.get("kind") == "run" and r.get("event") == "start")
    assert start["device"] == device and start["amp"] == "bfloat16", start
    losses = [r["loss"] for r in records if r.get("kind") == "step"]
    assert len(losses) == 1 and math.isfinite(losses[0]), records
    if compiled:
        assert counters["stats"]["unique_graphs"] >= 1, dict(counters["stats"])
    else:
        assert convs and all(dtype == torch.bfloat16 and last for dtype, last in convs), set(convs)
