"""A deterministic ImageNet-style JPEG tree for the data tests and bench: ``root/{train,val}/<class>/*.jpg``.

Each image is 500 x 375 (ImageNet's typical size), smooth colour gradients from a coarse random field plus pixel
noise, saved at JPEG quality 90: about 96 KB a file, so decode costs what a real photograph's does. The same seed
gives the same bytes.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np

WIDTH, HEIGHT = 500, 375


def image_bytes(rng: np.random.Generator, width: int = WIDTH, height: int = HEIGHT, noise: float = 19.0,
                quality: int = 90) -> bytes:
    """One JPEG: a 6x8 random colour field upsampled bilinearly, plus Gaussian noise of ``noise`` levels."""
    from PIL import Image

    coarse = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8))
    smooth = np.asarray(coarse.resize((width, height), Image.BILINEAR), dtype=np.float32)
    img = np.clip(smooth + rng.normal(0.0, noise, smooth.shape), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(img).save(out, format="JPEG", quality=quality)
    return out.getvalue()


def make_tree(root: str | Path, *, classes: int = 4, train_per_class: int = 25, val_per_class: int = 5,
              seed: int = 0, width: int = WIDTH, height: int = HEIGHT, noise: float = 19.0,
              quality: int = 90) -> Path:
    """Write the tree under ``root`` (made if missing; files already there are rewritten) and return it."""
    root = Path(root)
    for split, per_class in (("train", train_per_class), ("val", val_per_class)):
        for c in range(classes):
            d = root / split / f"class{c:03d}"
            d.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                rng = np.random.default_rng([seed, 0 if split == "train" else 1, c, i])
                (d / f"img{i:05d}.jpg").write_bytes(image_bytes(rng, width, height, noise, quality))
    return root


if __name__ == "__main__":        # python -m bench.jpeg_tree OUT [--classes N] [--per-class N]
    import argparse

    ap = argparse.ArgumentParser(prog="python -m bench.jpeg_tree", description=__doc__)
    ap.add_argument("out")
    ap.add_argument("--classes", type=int, default=4)
    ap.add_argument("--per-class", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    make_tree(a.out, classes=a.classes, train_per_class=a.per_class, val_per_class=max(1, a.per_class // 5),
              seed=a.seed)
