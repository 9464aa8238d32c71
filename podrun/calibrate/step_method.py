"""How a probe's peak memory is measured, by device (words for the calibration file), without importing torch."""
from __future__ import annotations

CPU_METHOD = ("peak resident set of a child process during two training steps (VmHWM after clear_refs 5) minus "
              "its resident set before the model was built")
CUDA_METHOD = "torch.cuda.max_memory_allocated over two training steps in a child process"


def method_for(device: str) -> str:
    return CUDA_METHOD if device == "cuda" else CPU_METHOD
