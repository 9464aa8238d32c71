"""Models: CPU forward+backward img/s for resnet18 (cifar), resnet50 and efficientnet_b4_g16, each beside a peer.

Peers, timed interleaved with their subject in the same run (medians over repeats):
  resnet18 cifar stem, channels_last   vs  the same model, contiguous (NCHW)
  resnet50 (BatchNorm)                 vs  resnet50 norm='group' (GroupNorm(32))
  efficientnet_b4_g16                  vs  efficientnet_b4 (torchvision's B4, depthwise, expansion 6)
One train step = forward, cross-entropy, backward (no optimizer), fp32, torch's default threads.
"""
from __future__ import annotations

import statistics
import time


def _step_time(model, x, y) -> float:
    import torch

    t0 = time.perf_counter()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def _pair(subject: tuple, peer: tuple, *, batch: int, px: int, classes: int, repeats: int) -> dict:
    """Time subject and peer interleaved; each is (label, name, build kwargs, channels_last)."""
    import torch

    from podrun import models

    built = []
    for label, name, kw, cl in (subject, peer):
        torch.manual_seed(0)
        m = models.build(name, num_classes=classes, **kw).train()
        x = torch.randn(batch, 3, px, px)
        if cl:
            m = m.to(memory_format=torch.channels_last)
            x = x.to(memory_format=torch.channels_last)
        y = torch.randint(0, classes, (batch,))
        for _ in range(3):  # warm-up: the first steps run 3-7x slower (allocator, oneDNN kernels)
            _step_time(m, x, y)
        built.append((label, m, x, y))
    times = {label: [] for label, *_ in built}
    for _ in range(repeats):
        for label, m, x, y in built:
            times[label].append(_step_time(m, x, y))
    (s_label, *_), (p_label, *_) = built
    s_ips = batch / statistics.median(times[s_label])
    p_ips = batch / statistics.median(times[p_label])
    return {"benchmark": "cpu train step", "subject": s_label, "value": round(s_ips, 2), "peer": p_label,
            "peer_value": round(p_ips, 2), "ratio": round(s_ips / p_ips, 3), "unit": "img/s (median)",
            "note": f"batch {batch}, {px} px, fp32, {torch.get_num_threads()} threads, "
                    f"{repeats} interleaved repeats"}


def run(quick: bool) -> list[dict]:
    repeats = 5 if quick else 15
    small, mid = (32, 64) if quick else (32, 128)
    batch = 8 if quick else 32
    return [
        _pair(("resnet18 cifar channels_last", "resnet18", {"stem": "cifar"}, True),
              ("resnet18 cifar NCHW", "resnet18", {"stem": "cifar"}, False),
              batch=batch, px=small, classes=10, repeats=repeats),
        _pair(("resnet50 BatchNorm", "resnet50", {}, False),
              ("resnet50 GroupNorm", "resnet50", {"norm": "group"}, False),
              batch=batch // 2, px=mid, classes=1000, repeats=repeats),
        _pair(("efficientnet_b4_g16", "efficientnet_b4_g16", {}, False),
              ("efficientnet_b4", "efficientnet_b4", {}, False),
              batch=batch // 2, px=mid, classes=1000, repeats=repeats),
    ]
