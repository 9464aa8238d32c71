"""Live views of a running launch: its state as one record (state), served as OpenMetrics (prom), written as
TensorBoard event files (tensorboard), shown by `podrun top` (top)."""
from __future__ import annotations

import importlib


def importable(module: str) -> bool:
    """Whether ``module`` (a live view's optional package: the view's NEEDS) imports here."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True
