"""Decomposition: replicas x local batch x GA = global batch exactly, or a PlanError naming the nearest fits."""
from __future__ import annotations

from dataclasses import dataclass

from podrun.errors import PlanError


@dataclass(frozen=True)
class Decomposition:
    replicas: int
    local_batch: int
    grad_accum: int

    @property
    def global_batch(self) -> int:
        return self.local_batch * self.replicas * self.grad_accum


def pipeline_bubble(devices_per_replica: int, grad_accum: int) -> float:
    """Idle fraction of a GPipe-style pipeline: (P-1)/(GA+P-1); 0 without pipelining."""
    p = devices_per_replica
    return 0.0 if p <= 1 else (p - 1) / (grad_accum + p - 1)


def feasible(g: int, replicas: int, max_local: int, min_ga: int,
             local_batch: int | None, grad_accum: int | None) -> Decomposition | None:
    """The decomposition for global batch g, preferring the largest local batch; None if there is none."""
    if g < 1 or g % replicas:
        return None
    per_replica = g // replicas                  # local batch x GA
    if local_batch is not None and grad_accum is not None:
        return Decomposition(replicas, local_batch, grad_accum) if local_batch * grad_accum == per_replica else None
    if local_batch is not None:
        if per_replica % local_batch or per_replica // local_batch < min_ga:
            return None
        return Decomposition(replicas, local_batch, per_replica // local_batch)
    if grad_accum is not None:
        if per_replica % grad_accum:
            return None
        b = per_replica // grad_accum
        return Decomposition(replicas, b, grad_accum) if 1 <= b <= max_local else None
    for b in range(min(max_local, per_replica), 0, -1):
        if per_replica % b == 0 and per_replica // b >= min_ga:
            return Decomposition(replicas, b, per_replica // b)
    return None


def _nearest(g: int, replicas: int, max_local: int, min_ga: int, local_batch, grad_accum):
    """Nearest feasible global batches below and above g (None where there is none)."""
    step = replicas * (local_batch or 1) * (grad_accum or 1)
    below = above = None
    k = g // step
    for _ in range(100_000):                    # bounded: step-sized walk down
        if k < 1:
            break
        if k * step != g and feasible(k * step, replicas, max_local, min_ga, local_batch, grad_accum):
            below = k * step
            break
        k -= 1
    k = g // step + 1
    for _ in range(100_000):
        if feasible(k * step, replicas, max_local, min_ga, local_batch, grad_accum):
            above = k * step
            break
        k += 1
    return below, above


def _describe(g: int, replicas: int, max_local: int, min_ga: int, local_batch, grad_accum) -> str:
    d = feasible(g, replicas, max_local, min_ga, local_batch, grad_accum)
    return f"--global-batch {g} (local batch {d.local_batch} x {replicas} replicas x GA {d.grad_accum})"


def decompose(*, devices: int, devices_per_replica: int, instances: int, max_local_batch: int,
              min_grad_accum: int = 1, global_batch: int | None, local_batch: int | None = None,
              grad_accum: int | None = None, where: str = "") -> Decomposition:
    """Choose replicas, local batch and GA with local_batch x replicas x GA == global_batch exactly.

    ``global_batch`` None means: the product of the given local batch and GA (both required then).
    """
    ctx = f" ({where})" if where else ""
    if devices % devices_per_replica:
        raise PlanError(
            f"{devices} devices cannot be split into replicas of {devices_per_replica} devices{ctx}",
            hint=f"use a device count that is a multiple of {devices_per_replica} (--nodes) or a recipe "
                 f"with another devices_per_replica",
        )
    replicas = devices // devices_per_replica
    if replicas % instances:
        raise PlanError(
            f"{replicas} replicas cannot be shared evenly by {instances} instances{ctx}",
            hint="change --instances-per-host or --nodes so that instances divide the replicas",
        )
    for name, v in (("--local-batch", local_batch), ("--grad-accum", grad_accum), ("--global-batch", global_batch)):
        if v is not None and v < 1:
            raise PlanError(f"{name} must be at least 1, got {v}")
    if local_batch is not None and local_batch > max_local_batch:
        raise PlanError(
            f"local batch {local_batch} exceeds the recipe's max local batch {max_local_batch} for this device{ctx}",
            hint="lower --local-batch, or raise max_local_batch in the recipe if the device memory allows",
        )
    if grad_accum is not None and grad_accum < min_grad_accum:
        raise PlanError(
            f"GA {grad_accum} is below the recipe's minimum GA {min_grad_accum} for this device{ctx}",
            hint=f"pipelines need GA >= {min_grad_accum} to keep the bubble small; pass --grad-accum {min_grad_accum} or more",
        )
    if global_batch is None:
        if local_batch is None or grad_accum is None:
            raise PlanError("no global batch: give --global-batch, or both --local-batch and --grad-accum")
        return Decomposition(replicas, local_batch, grad_accum)
    d = feasible(global_batch, replicas, max_local_batch, min_grad_accum, local_batch, grad_accum)
    if d is not None:
        return d
    below, above = _nearest(global_batch, replicas, max_local_batch, min_grad_accum, local_batch, grad_accum)
    fixed = ", ".join(f"{n} {v}" for n, v in (("local batch", local_batch), ("GA", grad_accum)) if v is not None)
    options = [_describe(x, replicas, max_local_batch, min_grad_accum, local_batch, grad_accum) for x in (below, above) if x]
    raise PlanError(
        f"global batch {global_batch} cannot be reached exactly with {replicas} replicas"
        + (f" and {fixed}" if fixed else "")
        + f" (max local batch {max_local_batch}, min GA {min_grad_accum}){ctx}; "
        + ("nearest feasible: " + (f"{below} below" if below else "none below")
           + ", " + (f"{above} above" if above else "none above")),
        hint="podrun never changes the global batch by itself; pass " + " or ".join(options) if options
        else "change --nodes or the overrides",
    )
