"""The snapshot slot's format: a state of plain values and tensors as a JSON layout header and raw bytes, read back
without unpickling anything.

A slot's data file is ``MAGIC``, the header's length (8 bytes, little-endian), the header (UTF-8 JSON), then the
tensors' and arrays' bytes, each at an offset that is a multiple of ``ALIGN`` from the start of the file. The
header is the state's tree: a JSON array is a list; a JSON object is one tagged value: ``{"tuple": [...]}``,
``{"dict": [[key, value], ...]}`` (keys int or str, in order; ``"ordered": true`` for an OrderedDict),
``{"float": "nan" | "inf" | "-inf"}``, ``{"tensor": [dtype, shape, offset, nbytes]}`` (torch, on the CPU when read),
``{"ndarray": [dtype, shape, offset, nbytes]}`` (numpy, its dtype string, e.g. ``<u4``), ``{"bytes": [offset,
nbytes]}``; None, bools, ints, floats and strings are themselves. Nothing else can be written (``Unsupported``):
the caller decides what to do with such a state. torch and numpy are imported only when a value needs them.
"""
from __future__ import annotations

import json
import math
import struct
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

MAGIC = b"podrun-raw-state 1\n"
ALIGN = 64
_LEN = struct.Struct("<Q")
_NUMPY_KINDS = "biufc"          # numpy dtypes written raw: bool, signed, unsigned, float, complex


class Unsupported(TypeError):
    """A value the raw format cannot express (its path in the state and its type)."""


class Corrupt(ValueError):
    """Bytes that are not a raw state (bad magic, header or offsets)."""


def _pad(n: int) -> int:
    return -n % ALIGN


class _Layout:
    def __init__(self) -> None:
        self.blobs: list[Any] = []        # buffers (memoryview-able), in file order
        self.size = 0                     # bytes of the data region laid out so far

    def place(self, buf) -> tuple[int, int]:
        view = memoryview(buf).cast("B")
        self.size += _pad(self.size)
        at = self.size
        self.blobs.append((at, view))
        self.size += view.nbytes
        return at, view.nbytes

    def encode(self, v: Any, path: str) -> Any:
        t = type(v)
        if v is None or t is bool or t is int or t is str:
            return v
        if t is float:
            return v if math.isfinite(v) else {"float": repr(v)}
        if t is list:
            return [self.encode(x, f"{path}[{i}]") for i, x in enumerate(v)]
        if t is tuple:
            return {"tuple": [self.encode(x, f"{path}[{i}]") for i, x in enumerate(v)]}
        if t is dict or t is OrderedDict:
            pairs = []
            for k, x in v.items():
                if type(k) is not int and type(k) is not str:
                    raise Unsupported(f"{path}: a dict key of type {type(k).__name__}")
                pairs.append([k, self.encode(x, f"{path}[{k!r}]")])
            return {"dict": pairs, "ordered": True} if t is OrderedDict else {"dict": pairs}
        if t is bytes:
            return {"bytes": list(self.place(v))}
        mod = t.__module__
        if mod == "torch" and t.__name__ == "Tensor":
            return {"tensor": self._tensor(v, path)}
        if mod == "numpy" and t.__name__ == "ndarray":
            return {"ndarray": self._ndarray(v, path)}
        raise Unsupported(f"{path}: a value of type {t.__module__}.{t.__qualname__}")

    def _tensor(self, v, path: str) -> list:
        import torch

        if v.layout != torch.strided or v.is_quantized or v.is_nested:
            raise Unsupported(f"{path}: a {v.layout} tensor")
        t = v.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
        flat = t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
        at, n = self.place(flat.numpy())
        return [str(t.dtype).removeprefix("torch."), list(t.shape), at, n]

    def _ndarray(self, v, path: str) -> list:
        import numpy as np

        if v.dtype.kind not in _NUMPY_KINDS or v.dtype.fields is not None:
            raise Unsupported(f"{path}: a numpy array of dtype {v.dtype}")
        a = np.ascontiguousarray(v)
        at, n = self.place(a.reshape(-1).view(np.uint8))
        return [a.dtype.str, list(a.shape), at, n]


def layout(state: Any) -> tuple[bytes, list[tuple[int, memoryview]], int]:
    """(the file's head: magic, length and header, padded; the data's (offset in the file, bytes) in order; the
    file's size). Raises Unsupported for a value the format cannot express."""
    lay = _Layout()
    tree = lay.encode(state, "state")
    header = json.dumps(tree, separators=(",", ":"), allow_nan=False).encode()
    head = MAGIC + _LEN.pack(len(header)) + header
    head += b"\0" * _pad(len(head))
    base = len(head)
    blobs = [(base + at, view) for at, view in lay.blobs]
    return head, blobs, base + lay.size


def pieces(head: bytes, blobs: list[tuple[int, memoryview]]) -> Iterator[memoryview | bytes]:
    """The file's bytes in order (the head, each blob after the zeros that align it)."""
    yield head
    pos = len(head)
    for at, view in blobs:
        if at > pos:
            yield b"\0" * (at - pos)
        yield view
        pos = at + view.nbytes


def load(data: bytes | bytearray | memoryview) -> Any:
    """The state laid out in ``data`` (tensors on the CPU, each a copy). Raises Corrupt for anything malformed."""
    buf = memoryview(data).cast("B")
    if bytes(buf[:len(MAGIC)]) != MAGIC or len(buf) < len(MAGIC) + _LEN.size:
        raise Corrupt("not a raw state (bad magic)")
    (n,) = _LEN.unpack_from(buf, len(MAGIC))
    start = len(MAGIC) + _LEN.size
    if start + n > len(buf):
        raise Corrupt("header runs past the end")
    try:
        tree = json.loads(bytes(buf[start:start + n]))
    except ValueError as exc:
        raise Corrupt(f"header is not JSON: {exc}") from None
    base = start + n + _pad(start + n)
    return _Reader(buf, base).decode(tree)


class _Reader:
    def __init__(self, buf: memoryview, base: int):
        self.buf, self.base = buf, base

    def span(self, at, n) -> tuple[int, int]:
        if type(at) is not int or type(n) is not int or at < 0 or n < 0 or self.base + at + n > len(self.buf):
            raise Corrupt(f"data at {at!r}+{n!r} is outside the slot")
        return self.base + at, n

    def decode(self, v: Any) -> Any:
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, list):
            return [self.decode(x) for x in v]
        if not isinstance(v, dict) or not v:
            raise Corrupt(f"unexpected header value {type(v).__name__}")
        tag = next(iter(v))
        body = v[tag]
        if tag == "tuple":
            return tuple(self.decode(x) for x in body)
        if tag == "dict":
            out = OrderedDict() if v.get("ordered") is True else {}
            for k, x in body:
                if type(k) is not int and type(k) is not str:
                    raise Corrupt(f"a dict key of type {type(k).__name__}")
                out[k] = self.decode(x)
            return out
        if tag == "float":
            if body not in ("nan", "inf", "-inf"):
                raise Corrupt(f"float {body!r}")
            return float(body)
        if tag == "bytes":
            at, n = self.span(*body)
            return bytes(self.buf[at:at + n])
        if tag == "tensor":
            return self._tensor(*body)
        if tag == "ndarray":
            return self._ndarray(*body)
        raise Corrupt(f"unknown tag {tag!r}")

    def _shape(self, shape) -> list[int]:
        if not isinstance(shape, list) or any(type(d) is not int or d < 0 for d in shape):
            raise Corrupt(f"shape {shape!r}")
        return shape

    def _tensor(self, dtype, shape, at, n):
        import torch

        dt = getattr(torch, dtype, None) if isinstance(dtype, str) else None
        if not isinstance(dt, torch.dtype):
            raise Corrupt(f"tensor dtype {dtype!r}")
        shape = self._shape(shape)
        at, n = self.span(at, n)
        count = math.prod(shape)
        if count * dt.itemsize != n:
            raise Corrupt(f"tensor of {shape} {dtype} is not {n} bytes")
        if count == 0:
            return torch.empty(shape, dtype=dt)
        raw = torch.frombuffer(bytearray(self.buf[at:at + n]), dtype=torch.uint8)
        return raw.view(dt).reshape(shape)

    def _ndarray(self, dtype, shape, at, n):
        import numpy as np

        try:
            dt = np.dtype(dtype) if isinstance(dtype, str) else None
        except TypeError:
            dt = None
        if dt is None or dt.kind not in _NUMPY_KINDS or dt.fields is not None:
            raise Corrupt(f"array dtype {dtype!r}")
        shape = self._shape(shape)
        at, n = self.span(at, n)
        if math.prod(shape) * dt.itemsize != n:
            raise Corrupt(f"array of {shape} {dtype} is not {n} bytes")
        return np.frombuffer(self.buf[at:at + n], dtype=dt).reshape(shape).copy()
