"""Image decoding for the folder datasets: the fastest decoder this host has (simplejpeg, else PIL), JPEG DCT scaling
for sources much larger than the target, and the crop, resize and flip of one sample on the host.

simplejpeg (the ``podrun[data]`` extra) is libjpeg-turbo in a wheel of its own: it decodes straight into a numpy
array and scales in the DCT (1/2, 1/4, 1/8) when asked for a minimum size. PIL is the fall-back of the base install
(its wheels carry libjpeg-turbo too; ``Image.draft`` gives the same DCT scaling). Files that are not JPEGs (PNG, BMP,
WebP) and JPEGs libjpeg-turbo cannot turn into RGB (CMYK) go through PIL whichever decoder is picked. The figures
behind the choice are in docs/training.md ("The decoder").
"""
from __future__ import annotations

import io
import os

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


def decode(data: bytes, decoder: str, min_size: tuple[int, int] | None = None) -> np.ndarray:
    """An (H, W, 3) uint8 array; with ``min_size`` (w, h) it may come DCT-scaled down, never below that size (the
    caller scales its box by the array's size over the header's)."""
    if decoder == "simplejpeg" and data[:2] == JPEG_MAGIC:
        import simplejpeg

        kw = {} if min_size is None else {"min_width": int(min_size[0]), "min_height": int(min_size[1])}
        try:
            return simplejpeg.decode_jpeg(data, colorspace="RGB", **kw)
        except ValueError:
            pass          # CMYK and other JPEGs libjpeg-turbo cannot make RGB; a damaged file fails in PIL too
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            if min_size is not None and im.format == "JPEG":
                im.draft("RGB", (int(min_size[0]), int(min_size[1])))
            return np.asarray(im.convert("RGB"), dtype=np.uint8)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise DecodeError(str(exc) or type(exc).__name__) from None


def crop_resize(data: bytes, decoder: str, box: tuple[float, float, float, float], size: int,
                flip: bool = False) -> np.ndarray:
    """The region ``box`` (left, top, right, bottom in the source's pixels) resized to size x size, bilinear, and
    mirrored when ``flip``: a (size, size, 3) uint8 array. The source is DCT-scaled while the box stays >= size."""
    from PIL import Image

    w, h = image_size(data, decoder)
    bw, bh = box[2] - box[0], box[3] - box[1]
    # the smallest decode that keeps the box at least size x size
    need = (max(1, -(-w * size // max(1, int(bw)))), max(1, -(-h * size // max(1, int(bh)))))
    scaled = need if need[0] < w and need[1] < h else None
    im = None
    if decoder == "simplejpeg" and data[:2] == JPEG_MAGIC:
        try:
            im = Image.fromarray(decode(data, decoder, scaled))
        except DecodeError:
            im = None         # PIL's turn below, which names the damage
    if im is None:            # PIL end to end: its own image, no round trip through an array (1.7x less CPU)
        try:
            with Image.open(io.BytesIO(data)) as src:
                if scaled is not None and src.format == "JPEG":
                    src.draft("RGB", scaled)
                im = src.convert("RGB")
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
            raise DecodeError(str(exc) or type(exc).__name__) from None
    sx, sy = im.size[0] / w, im.size[1] / h
    im = im.resize((size, size), Image.BILINEAR, box=(box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy))
    if flip:
        im = im.transpose(Image.FLIP_LEFT_RIGHT)
    return np.asarray(im, dtype=np.uint8)
