"""The device-agnostic runner recipes call: loop, GA with no_sync, AMP, LARS and schedules, data, checkpoints, metrics."""
from __future__ import annotations

__all__ = ["TrainConfig", "TrainError", "decompose", "train"]


def __getattr__(name):  # torch loads only when the runner is used (podrun report reads metrics without it)
    if name in __all__:
        from podrun.train import runner

        return getattr(runner, name)
    raise AttributeError(name)
