"""The snapshot slot's raw format (podrun.runtime.rawstate) and its MAC (podrun.runtime.snapshot), in one process:
the recipe's real state round-trips exactly without pickle, a slot whose bytes changed is refused, a state the format
cannot express falls back to torch.save read with weights_only=True."""
from __future__ import annotations

import collections
import math
import random

import numpy as np
import pytest
import torch

from podrun.wire.worker_env import SNAPSHOT_KEY_NAME
from podrun.runtime import rawstate, snapshot


def _same(a, b, path="state"):
    """Bitwise-equal tensors and arrays (dtype, shape, bytes), equal plain values of the same types."""
    assert type(a) is type(b), (path, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), path
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), path
    elif isinstance(a, np.ndarray):
        assert (a.dtype, a.shape) == (b.dtype, b.shape) and a.tobytes() == b.tobytes(), path
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            _same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), path
    else:
        assert a == b, path


def _recipe_state() -> dict:
    """What podrun.train.save.state holds after 3 updates of ResNet-18 (cifar stem, BatchNorm) with SGD momentum,
    the recipe's LambdaLR schedule, a GradScaler and the rng states (python, numpy, torch)."""
    from podrun.models import build
    from podrun.train import checkpoint as ckpt
    from podrun.train.optim import build_optimizer, build_scheduler

    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    model = build("resnet18", 10, stem="cifar", norm="batch")
    opt = build_optimizer(model, "sgd", 0.1, momentum=0.9, weight_decay=5e-4, nesterov=True)
    sched = build_scheduler(opt, total_steps=10, warmup_steps=2, schedule="cosine")
    scaler = torch.amp.GradScaler("cpu", enabled=True)
    for _ in range(3):
        model(torch.randn(4, 3, 8, 8)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    random.random()
    np.random.rand()
    return {"format": 2, "model": snapshot.freeze(model), "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(), "scaler": scaler.state_dict(), "samples": 3 * 64, "step": 3,
            "global_batch": 64, "seed": 3, "train_size": 1000, "steps_per_epoch": 15, "rng": ckpt.rng_state(),
            "epoch_acc": {"loss": 1.5, "correct": 3.0, "count": 12.0, "seconds": 0.25}}


def test_the_recipe_state_round_trips_exactly_through_a_slot_without_pickle(host_dir, monkeypatch):
    state = _recipe_state()
    state["extra"] = {"bf16": torch.randn(5, 3).to(torch.bfloat16), "t": (1, [2, (3,)], None, True, "s"),
                      0: float("inf"), "od": collections.OrderedDict(b=1, a=2), "empty": torch.zeros(0, 4),
                      "strided": torch.arange(12.0).reshape(3, 4).t(), "big": 2 ** 70, "raw": b"\x00\xff",
                      "numpy_key": np.random.get_state()[1], "nd": np.arange(6, dtype=np.int16).reshape(2, 3)}
    assert isinstance(state["rng"]["python"], tuple) and isinstance(state["extra"]["numpy_key"], np.ndarray)

    def no_pickle(*a, **k):
        raise AssertionError("unpickled")
    monkeypatch.setattr(torch, "load", no_pickle)            # nothing on the way back may unpickle
    w = snapshot.Writer(host_dir)
    w.submit(3, state)
    w.close()
    assert (host_dir / "slot-0.bin").read_bytes().startswith(rawstate.MAGIC)
    got = snapshot.recover(w, -1)
    assert got.step == 3
    _same(state, got.state)
    assert any(type(k) is int for k in got.state["optimizer"]["state"])     # int keys stay ints
    from podrun.train import checkpoint as ckpt

    ckpt.set_rng_state(got.state["rng"])                                     # and the states are usable as such
    np.random.set_state(("MT19937", got.state["extra"]["numpy_key"], 0))


def test_slots_are_private_files_in_private_directories(host_dir):
    w = snapshot.Writer(host_dir)
    w.submit(1, {"x": torch.ones(3)})
    w.close()
    for p in (host_dir.parent, host_dir):
        assert p.stat().st_mode & 0o777 == 0o700, p
    for p in host_dir.iterdir():
        assert p.stat().st_mode & 0o777 == 0o600, p


def test_a_slot_whose_bytes_changed_is_refused_and_the_older_one_used_then_none(host_dir, capfd):
    w = snapshot.Writer(host_dir)
    w.submit(1, {"x": torch.full((100,), 1.0)})
    w.submit(2, {"x": torch.full((100,), 2.0)})
    w.close()
    newest = host_dir / "slot-1.bin"
    data = bytearray(newest.read_bytes())
    data[-1] ^= 1                                             # one bit of the tensor's bytes
    newest.write_bytes(bytes(data))
    got = snapshot.recover(w, -1)
    assert got.step == 1 and torch.equal(got.state["x"], torch.full((100,), 1.0))
    err = capfd.readouterr().err
    assert f"snapshot slot {newest} (update 2) does not match its MAC" in err
    older = host_dir / "slot-0.bin"
    data = bytearray(older.read_bytes())
    data[len(rawstate.MAGIC) + 10] ^= 1                       # a bit of the layout header
    older.write_bytes(bytes(data))
    assert snapshot.recover(w, -1) is None                    # no good slot: the disk checkpoint is the resume


@pytest.mark.parametrize("mac", [snapshot.POLY1305, snapshot.HMAC_SHA256])
def test_a_slot_is_sealed_by_its_mac_and_a_changed_seal_or_byte_is_refused(host_dir, monkeypatch, capfd, mac):
    """Poly1305 under a one-time key from the run's key and the slot's nonce (where cryptography has it), else
    HMAC-SHA256: the slot reads back; its header's nonce, tag or MAC name changed, or one bit of its bytes, and it
    is refused."""
    import json

    if mac == snapshot.HMAC_SHA256:
        monkeypatch.setattr(snapshot, "_poly1305", lambda: None)      # a cryptography without Poly1305
    else:
        assert snapshot._poly1305() is not None, "this machine's cryptography has Poly1305 (a dependency)"
    w = snapshot.Writer(host_dir)
    w.submit(1, {"x": torch.arange(1 << 19, dtype=torch.float32)})    # two MiB: more than one chunk
    w.close()
    header_path, data_path = host_dir / "slot-0.json", host_dir / "slot-0.bin"
    header = json.loads(header_path.read_text())
    assert header["mac"] == mac and len(bytes.fromhex(header["nonce"])) == 16, header
    assert torch.equal(snapshot.recover(w, -1).state["x"], torch.arange(1 << 19, dtype=torch.float32))
    other = snapshot.HMAC_SHA256 if mac == snapshot.POLY1305 else snapshot.POLY1305
    flip = lambda h: ("0" if h[0] != "0" else "1") + h[1:]     # noqa: E731
    for changed in ({**header, "nonce": flip(header["nonce"])}, {**header, "tag": flip(header["tag"])},
                    {**header, "mac": other}, {**header, "mac": "none"}):
        header_path.write_text(json.dumps(changed))
        assert snapshot.recover(w, -1) is None, changed
    header_path.write_text(json.dumps(header))
    data = bytearray(data_path.read_bytes())
    data[len(data) // 2] ^= 1                                   # a bit inside the tensor, not the last chunk's
    data_path.write_bytes(bytes(data))
    assert snapshot.recover(w, -1) is None
    assert "does not match its MAC" in capfd.readouterr().err


def test_another_key_reads_no_slot(host_dir, monkeypatch):
    w = snapshot.Writer(host_dir)
    w.submit(1, {"x": torch.ones(2)})
    w.close()
    monkeypatch.setenv(SNAPSHOT_KEY_NAME, "another run's key")
    assert snapshot.recover(snapshot.Writer(host_dir), -1) is None


def test_no_key_no_snapshots(host_dir, monkeypatch, capfd):
    monkeypatch.delenv(SNAPSHOT_KEY_NAME)
    assert snapshot.open_writer(host_dir, writes=True) is None
    assert f"no {SNAPSHOT_KEY_NAME} in the environment" in capfd.readouterr().err
    assert not host_dir.exists()


class _Opaque:
    pass


def test_a_state_the_raw_format_cannot_express_falls_back_to_torch_save_read_with_weights_only(host_dir, capfd):
    w = snapshot.Writer(host_dir)
    w.submit(1, {"x": torch.ones(2), "size": torch.Size([2, 3])})
    w.close()
    assert "holds state['size']: a value of type torch.Size" in capfd.readouterr().err
    got = snapshot.recover(w, -1)
    assert got.state["size"] == torch.Size([2, 3]) and torch.equal(got.state["x"], torch.ones(2))
    w = snapshot.Writer(host_dir)
    w.submit(2, {"x": _Opaque()})                             # weights_only refuses it: said, not unpickled
    w.close()
    with pytest.raises(snapshot.SnapshotError, match="weights_only=True"):
        snapshot.recover(w, -1)


def test_a_malformed_layout_is_an_error_not_a_crash():
    head, blobs, _size = rawstate.layout({"x": torch.ones(4)})
    data = bytearray(b"".join(bytes(p) for p in rawstate.pieces(head, blobs)))
    assert torch.equal(rawstate.load(bytes(data))["x"], torch.ones(4))
    with pytest.raises(rawstate.Corrupt):
        rawstate.load(bytes(data[:-4]))                       # the tensor runs past the end
    with pytest.raises(rawstate.Corrupt):
        rawstate.load(b"not a slot")
    with pytest.raises(rawstate.Unsupported, match=r"state\['f'\]: a value of type builtins.builtin_function"):
        rawstate.layout({"f": len})
