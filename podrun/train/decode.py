"""Image decoding for the folder datasets: the fastest decoder this host has (simplejpeg, else PIL), JPEG DCT scaling
for sources much larger than the target, and the crop, resize and flip of one sample on the host.

simplejpeg (the ``podrun[data]`` extra) is libjpeg-turbo in a wheel of its own: it decodes straight into a numpy
array and scales in the DCT (1/2, 1/4, 1/8) when asked for a minimum size. PIL is the fall-back of the base install
(its wheels carry libjpeg-turbo too; ``Image.draft`` gives the same DCT scaling). Files that are not JPEGs (PNG, BMP,
WebP) and JPEGs libjpeg-turbo cannot turn into RGB (CMYK) go through PIL whichever decoder is picked. The crop is
resized by torch's uint8 antialiased bilinear kernel (PIL's filter, a third of PIL's resize time here) where its box
falls on whole pixels. The figures behind the choice are in docs/training.md ("The decoder").
"""
from __future__ import annotations

import io
import os
import threading

import numpy as np

DECODER_ENV = "PODRUN_DECODER"      # pil | simplejpeg: force one (the data bench compares them); unset: the fastest
DECODERS = ("simplejpeg", "pil")    # fastest first, as measured on this project's JPEG tree
JPEG_MAGIC = b"\xff\xd8"


class DecodeError(ValueError):
    """Bytes that no decoder here turns into an RGB image."""


def available() -> list[str]:
    """The decoders importable here, fastest first (PIL is always there on an install that trains on folders)."""
    import importlib.util

    return [d for d in DECODERS if importlib.util.find_spec("PIL" if d == "pil" else d) is not None]


def pick(name: str | None = None) -> str:
    """The decoder to use: ``name`` (or $PODRUN_DECODER) when given and installed, else the fastest installed."""
    want = name if name is not None else os.environ.get(DECODER_ENV, "")
    have = available()
    if want:
        if want not in DECODERS:
            raise DecodeError(f"unknown decoder {want!r}; known: {', '.join(DECODERS)}")
        if want not in have:
            raise DecodeError(f"decoder {want!r} is not installed here (installed: {', '.join(have) or 'none'})")
        return want
    if not have:
        raise DecodeError("no image decoder is installed: pip install pillow (or podrun[data] for simplejpeg)")
    return have[0]


def image_size(data: bytes, decoder: str) -> tuple[int, int]:
    """(width, height) from the header alone, without decoding."""
    if decoder == "simplejpeg" and data[:2] == JPEG_MAGIC:
        import simplejpeg

        try:
            h, w, _, _ = simplejpeg.decode_jpeg_header(data)
            return w, h
        except ValueError:
            pass
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            return im.size
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise DecodeError(str(exc) or type(exc).__name__) from None


DCT_FACTORS = (8, 4, 2)     # the DCT scalings libjpeg-turbo runs with its SIMD IDCT; its others (7/8 ... 3/8) cost more
_local = threading.local()  # a decoder's output buffer, reused: one a thread (a rank's prefetch thread, its eval)


def dct_factor(w: int, h: int, box: tuple[float, float, float, float], size: int) -> int:
    """By how much a w x h JPEG may be scaled down in the DCT (8, 4 or 2) so that the crop ``box`` still covers at
    least size x size pixels; 1: the box is under twice the output on a side, decoded at full size."""
    bw, bh = box[2] - box[0], box[3] - box[1]
    return next((f for f in DCT_FACTORS if bw / f >= size and bh / f >= size), 1)


def _buffer(nbytes: int) -> np.ndarray:
    """This thread's decode buffer, grown to at least ``nbytes`` (a fresh array each image costs its pages)."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.nbytes < nbytes:
        buf = _local.buf = np.empty(max(nbytes, 1 << 20), dtype=np.uint8)
    return buf


def decode(data: bytes, decoder: str, factor: int = 1, size: tuple[int, int] | None = None) -> np.ndarray:
    """An (H, W, 3) uint8 array, scaled down in the DCT by ``factor`` (1, 2, 4, 8: ceil(w / factor) wide) when it is
    a JPEG. simplejpeg's array is this thread's buffer, valid until the thread's next decode; ``size``: the (w, h)
    of the header, when the caller has read it. libjpeg-turbo's accurate DCT in both decoders: simplejpeg's pixels
    are PIL's, bit for bit, at full size (its fast DCT saves ~3 % here and would make them differ)."""
    if decoder == "simplejpeg" and data[:2] == JPEG_MAGIC:
        import simplejpeg

        try:
            w, h = size if size is not None else image_size(data, decoder)
            dw, dh = -(-w // factor), -(-h // factor)
            kw = {} if factor == 1 else {"min_width": dw, "min_height": dh}
            out = _buffer(dw * dh * 3)
            return simplejpeg.decode_jpeg(data, colorspace="RGB", buffer=out, **kw)
        except (ValueError, DecodeError):
            pass          # CMYK and other JPEGs libjpeg-turbo cannot make RGB; a damaged file fails in PIL too
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            if factor > 1 and im.format == "JPEG":
                im.draft("RGB", (im.size[0] // factor, im.size[1] // factor))   # PIL picks the scale that fits
            return np.asarray(im.convert("RGB"), dtype=np.uint8)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise DecodeError(str(exc) or type(exc).__name__) from None


def resize(arr: np.ndarray, box: tuple[float, float, float, float], size: int, flip: bool = False) -> np.ndarray:
    """The region ``box`` of an (H, W, 3) array resized to size x size, bilinear with antialiasing (PIL's filter),
    mirrored when ``flip``: an array the caller copies. A box on whole pixels goes through torch's uint8 kernel
    (3-4x PIL's resize here), a fractional one through PIL's resize with the box."""
    if all(float(v).is_integer() for v in box):
        import torch

        x0, y0, x1, y1 = (int(v) for v in box)
        if not arr.flags.writeable:     # PIL's array: torch wants one it may write (it does not)
            arr = np.array(arr)
        x = torch.from_numpy(arr).permute(2, 0, 1)[None, :, y0:y1, x0:x1]      # a view: HWC is channels-last
        x = x.contiguous(memory_format=torch.channels_last)
        out = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", antialias=True,
                                              align_corners=False).permute(0, 2, 3, 1)[0].numpy()
    else:
        from PIL import Image

        arr = np.ascontiguousarray(arr)
        im = Image.frombuffer("RGB", (arr.shape[1], arr.shape[0]), arr, "raw", "RGB", 0, 1)
        out = np.asarray(im.resize((size, size), Image.BILINEAR, box=box))
    return out[:, ::-1] if flip else out


def crop_resize(data: bytes, decoder: str, box: tuple[float, float, float, float], size: int,
                flip: bool = False, wh: tuple[int, int] | None = None) -> np.ndarray:
    """The region ``box`` (left, top, right, bottom in the source's pixels) resized to size x size, bilinear, and
    mirrored when ``flip``: a (size, size, 3) uint8 array (a view the caller copies). The source is DCT-scaled by
    2, 4 or 8 where the box stays at least size x size (dct_factor); ``wh``: the source's (w, h), when known."""
    w, h = wh if wh is not None else image_size(data, decoder)
    arr = decode(data, decoder, dct_factor(w, h, box, size), (w, h))
    sx, sy = arr.shape[1] / w, arr.shape[0] / h
    if sx != 1.0 or sy != 1.0:
        box = (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy)
    return resize(arr, box, size, flip)
