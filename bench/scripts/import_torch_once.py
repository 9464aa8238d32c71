"""bench_start's worker: imports torch, as a training script does first."""
import torch  # noqa: F401
