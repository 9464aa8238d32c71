"""Snapshots and checkpoints of CUDA tensors round-trip bitwise, through podrun's public functions only: the
snapshot writer and recover (podrun.runtime.snapshot), checkpoint.save and load_latest (podrun.train.checkpoint)."""
from __future__ import annotations

from tests.gpu.needs import cuda_or_twin

KEY = "gpu-check-" + "k" * 32


def _state(device: str) -> dict:
    """A training state as the runner holds it on the device after one update: a channels_last model's weights
    and BatchNorm buffers, fused SGD's momentum, and tensors of every dtype a run keeps, with the values that
    break a careless copy (NaN, infinities, -0.0, a subnormal) and a view that is not contiguous."""
    import torch
    import torch.nn.functional as F

    from podrun import models

    torch.manual_seed(0)
    model = models.build("resnet18", num_classes=10).to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=device == "cuda" or None)
    x = torch.randn(4, 3, 32, 32, device=device).to(memory_format=torch.channels_last)
    with torch.autocast(device, dtype=torch.bfloat16):
        F.cross_entropy(model(x), torch.arange(4, device=device)).backward()
    opt.step()
    odd = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-40, 3.0], device=device)
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 1,
            "extra": {"bf16": torch.randn(5, 7, device=device).to(torch.bfloat16),
                      "fp16": torch.randn(3, device=device).half(), "odd": odd, "int64": torch.arange(9, device=device),
                      "bool": torch.rand(6, device=device) > 0.5, "view": torch.randn(6, 4, device=device).t(),
                      "scalar": torch.tensor(2.5, device=device)}}


def _tensors(tree, path="state"):
    """(path, tensor) for every tensor in a state, in a fixed order."""
    import torch

    if isinstance(tree, torch.Tensor):
        yield path, tree
    elif isinstance(tree, dict):
        for k in sorted(tree, key=str):
            yield from _tensors(tree[k], f"{path}[{k!r}]")
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from _tensors(v, f"{path}[{i}]")


def _differences(want: dict, got: dict, *, device: str | None, strides: bool) -> list[str]:
    """Where ``got`` is not ``want`` bit for bit (dtype, shape, every byte; with ``device`` on that device type;
    with ``strides`` the same memory layout)."""
    import torch

    a, b = dict(_tensors(want)), dict(_tensors(got))
    out = [f"{p}: missing" for p in a if p not in b] + [f"{p}: unexpected" for p in b if p not in a]
    for p in a.keys() & b.keys():
        x, y = a[p], b[p]
        if x.dtype != y.dtype or x.shape != y.shape:
            out.append(f"{p}: {x.dtype} {tuple(x.shape)} became {y.dtype} {tuple(y.shape)}")
            continue
        if device is not None and y.device.type != device:
            out.append(f"{p}: on {y.device}, not {device}")
        if strides and x.stride() != y.stride():
            out.append(f"{p}: strides {x.stride()} became {y.stride()}")
        bits = lambda t: t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)  # noqa: E731
        if not torch.equal(bits(x), bits(y)):
            out.append(f"{p}: the bytes differ")
    return sorted(out)


def test_cuda_state_round_trips_bitwise_through_snapshot_and_checkpoint(tmp_path):
    """Snapshot: the writer copies the device tensors into its slot in the background (the raw format, no pickle),
    recover reads them back on the CPU bit for bit, and loading them into a fresh channels_last model on the device
    gives its state dict bit for bit, layout kept. Checkpoint: saved from the device and loaded onto it
    (map_location, as a resume on CUDA does), every tensor comes back on the device with its bytes and strides."""
    device = cuda_or_twin()
    import torch

    from podrun import models
    from podrun.runtime import snapshot
    from podrun.train import checkpoint

    state = _state(device)
    assert {t.device.type for _, t in _tensors(state)} == {device}
    state["rng"] = checkpoint.rng_state()       # the generators, as the runner saves them (CUDA's with a device)
    assert ("cuda" in state["rng"]) is (device == "cuda")

    writer = snapshot.Writer(tmp_path / "shm" / "host-0", key=KEY)
    try:
        writer.submit(1, state)
        got = snapshot.recover(writer, newer_than=-1)
        assert got is not None and got.step == 1 and got.state["step"] == 1, got
        assert writer.read(1)[0] == snapshot.RAW, "the state fell back to torch.save"
    finally:
        writer.close()
    assert _differences(state, got.state, device="cpu", strides=False) == []
    torch.manual_seed(1)
    fresh = models.build("resnet18", num_classes=10).to(device).to(memory_format=torch.channels_last)
    fresh.load_state_dict(got.state["model"])
    assert _differences(state["model"], fresh.state_dict(), device=device, strides=True) == []
    _restores_rng(got.state["rng"], state["rng"])

    path = checkpoint.save(state, tmp_path / "ckpt", step=1, keep=2)
    found = checkpoint.load_latest(tmp_path / "ckpt", map_location=device)
    assert found is not None and found[0] == path and found[1]["step"] == 1, found
    assert _differences(state, found[1], device=device, strides=True) == []
    _restores_rng(found[1]["rng"], state["rng"])        # save.restore's order: loaded onto the device, then set


def _restores_rng(loaded: dict, saved: dict) -> None:
    """checkpoint.set_rng_state of a state read back puts every generator where ``saved`` had it."""
    import random

    import numpy as np
    import torch

    from podrun.train import checkpoint

    random.seed(7), np.random.seed(7), torch.manual_seed(7)     # elsewhere first (CUDA's too)
    checkpoint.set_rng_state(loaded)
    now = checkpoint.rng_state()
    assert now["python"] == saved["python"]
    assert now["numpy"][0] == saved["numpy"][0] and now["numpy"][2:] == saved["numpy"][2:]
    assert _differences({k: v for k, v in saved.items() if k != "python"},
                        {k: v for k, v in now.items() if k != "python"}, device=None, strides=False) == []
