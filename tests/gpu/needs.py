"""The device a CUDA-path test runs on: CUDA; without one the test FAILS naming what it needs (never skips), unless
PODRUN_GPU_TESTS_DEVICE=cpu asks for its CPU twin (the same test on the CPU: what bench/gpu_check.py's CPU form runs,
so that the tests themselves are known to work before a device is lent)."""
from __future__ import annotations

import os

import pytest

TWIN_ENV = "PODRUN_GPU_TESTS_DEVICE"
NEEDS = "needs a CUDA device"


def cuda_or_twin() -> str:
    """'cuda', or 'cpu' for the twin; anything else fails the calling test at once."""
    if os.environ.get(TWIN_ENV) == "cpu":
        return "cpu"
    import torch

    if not torch.cuda.is_available():
        pytest.fail(f"{NEEDS}: torch {torch.__version__} sees none (torch.cuda.is_available() is False); run it on a "
                    f"GPU (python -m bench.gpu_check OUT), or as its CPU twin with {TWIN_ENV}=cpu", pytrace=False)
    return "cuda"
