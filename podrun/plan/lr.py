"""Learning-rate and warmup rescaling when the global batch differs from the recipe's reference."""
from __future__ import annotations

import math


def scale(value: float, rule: str, global_batch: int, reference_batch: int) -> float:
    ratio = global_batch / reference_batch
    if rule == "linear":
        return value * ratio
    if rule == "sqrt":
        return value * math.sqrt(ratio)
    return value


def describe(rule: str, base: float, reference_batch: int, global_batch: int, lr: float) -> str:
    if global_batch == reference_batch or rule == "none":
        return f"learning rate {lr:.6g} (recipe's, rule {rule})"
    return (f"learning rate rescaled by the {rule} rule: {base:.6g} x "
            f"{'sqrt' if rule == 'sqrt' else ''}({global_batch}/{reference_batch}) = {lr:.6g}")
