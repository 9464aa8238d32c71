"""Decomposition: replicas x local batch x GA = global batch exactly, or a PlanError naming the nearest fits."""
from __future__ import annotations

import math
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
    b = _largest_divisor(per_replica, min(max_local, per_replica // min_ga))
    return None if b is None else Decomposition(replicas, b, per_replica // b)


def divisors(n: int) -> list[int]:
    """The divisors of n >= 1, ascending (trial division up to sqrt(n))."""
    small, large = [], []
    for i in range(1, math.isqrt(n) + 1):
        if n % i == 0:
            small.append(i)
            if i != n // i:
                large.append(n // i)
    return small + large[::-1]


def _largest_divisor(n: int, cap: int) -> int | None:
    """The largest divisor of n that is at most cap, or None."""
    return max((d for d in divisors(n) if d <= cap), default=None)


_WALK = 20_000      # step-sized tries in each direction when looking for the nearest feasible batch


def _nearest(g: int, replicas: int, max_local: int, min_ga: int, local_batch, grad_accum):
    """Nearest feasible global batches below and above g (None where there is none)."""
    step = replicas * (1 if local_batch is None else local_batch) * (1 if grad_accum is None else grad_accum)
    # no batch below replicas x min GA x (local batch or 1) can be reached
    k_min = -(-replicas * min_ga * (1 if local_batch is None else local_batch) // step)

    def fits(k: int) -> bool:
        return k * step != g and feasible(k * step, replicas, max_local, min_ga, local_batch, grad_accum) is not None

    top, up = g // step, max(g // step + 1, k_min)     # bounded: _WALK step-sized tries down, then up
    below = next((k * step for k in range(top, max(max(1, k_min) - 1, top - _WALK), -1) if fits(k)), None)
    return below, next((k * step for k in range(up, up + _WALK) if fits(k)), None)


def _refused(why: str, ctx: str, hint: str) -> PlanError:
    """The PlanError for ``why`` (its reason), the message followed by the context."""
    return PlanError(why + ctx, reason=why, hint=hint)


def decompose(*, devices: int, devices_per_replica: int, instances: int, max_local_batch: int,
              min_grad_accum: int = 1, global_batch: int | None, local_batch: int | None = None,
              grad_accum: int | None = None, where: str = "", devices_per_host: int | None = None,
              instances_per_host: int = 1, max_hosts: int = 0) -> Decomposition:
    """Choose replicas, local batch and GA with local_batch x replicas x GA == global_batch exactly.

    ``global_batch`` None means: the product of the given local batch and GA (both required then).
    With ``devices_per_host`` and ``max_hosts``, an unreachable batch also names the host counts
    (at most ``max_hosts``) that reach it.
    """
    ctx = f" ({where})" if where else ""
    if devices % devices_per_replica:
        raise _refused(f"{devices} devices cannot be split into replicas of {devices_per_replica} devices", ctx,
                       f"use a device count that is a multiple of {devices_per_replica} (--nodes) or a recipe "
                       f"with another devices_per_replica")
    replicas = devices // devices_per_replica
    if replicas % instances:
        raise _refused(f"{replicas} replicas cannot be shared evenly by {instances} instances", ctx,
                       "change --instances-per-host or --nodes so that instances divide the replicas")
    for name, v in (("--local-batch", local_batch), ("--grad-accum", grad_accum), ("--global-batch", global_batch)):
        if v is not None and v < 1:
            raise PlanError(f"{name} must be at least 1, got {v}")
    if local_batch is not None and local_batch > max_local_batch:
        raise _refused(f"local batch {local_batch} exceeds the recipe's max local batch {max_local_batch} for this "
                       "device", ctx, "lower --local-batch, or raise max_local_batch in the recipe if the device "
                       "memory allows")
    if grad_accum is not None and grad_accum < min_grad_accum:
        raise _refused(f"GA {grad_accum} is below the recipe's minimum GA {min_grad_accum} for this device", ctx,
                       f"pipelines need GA >= {min_grad_accum} to keep the bubble small; pass --grad-accum "
                       f"{min_grad_accum} or more")
    if global_batch is None:
        if local_batch is None or grad_accum is None:
            raise PlanError("no global batch: give --global-batch, or both --local-batch and --grad-accum")
        return Decomposition(replicas, local_batch, grad_accum)
    d = feasible(global_batch, replicas, max_local_batch, min_grad_accum, local_batch, grad_accum)
    if d is not None:
        return d
    below, above = _nearest(global_batch, replicas, max_local_batch, min_grad_accum, local_batch, grad_accum)
    fixed = ", ".join(f"{n} {v}" for n, v in (("local batch", local_batch), ("GA", grad_accum)) if v is not None)
    nearest = [feasible(x, replicas, max_local_batch, min_grad_accum, local_batch, grad_accum)
               for x in (below, above) if x is not None]
    options = [f"--global-batch {d.global_batch} (local batch {d.local_batch} x {replicas} replicas x GA "
               f"{d.grad_accum})" for d in nearest]
    counts = [] if devices_per_host is None else host_counts(
        global_batch, max_hosts=max_hosts, devices_per_host=devices_per_host,
        devices_per_replica=devices_per_replica, instances_per_host=instances_per_host,
        max_local_batch=max_local_batch, min_grad_accum=min_grad_accum, local_batch=local_batch,
        grad_accum=grad_accum)
    reach = ""
    if counts:
        reach = (f"; {global_batch} is reached on " + ", ".join(f"--nodes {n}" for n in counts)
                 + f" (of {max_hosts} hosts)")
    reason = (f"global batch {global_batch} cannot be reached exactly with {replicas} replicas"
              + (f" and {fixed}" if fixed else "") + f" (max local batch {max_local_batch}, min GA {min_grad_accum})")
    raise PlanError(
        f"{reason}{ctx}; "
        + ("nearest feasible: " + (f"{below} below" if below is not None else "none below")
           + ", " + (f"{above} above" if above is not None else "none above")) + reach,
        hint=("podrun never changes the global batch by itself; pass "
              + " or ".join(([f"--nodes {counts[0]}"] if counts else []) + options)) if options or counts
        else "change --nodes or the overrides",
        reason=reason,
    )


def host_counts(g: int, *, max_hosts: int, devices_per_host: int, devices_per_replica: int,
                instances_per_host: int, max_local_batch: int, min_grad_accum: int,
                local_batch: int | None, grad_accum: int | None, limit: int = 3) -> list[int]:
    """The largest host counts (at most ``limit`` of them, each <= max_hosts) on which global batch g
    can be reached exactly; found through the replica counts that divide g, not by trying every count."""
    out = []
    for replicas in reversed(divisors(g)):
        devices = replicas * devices_per_replica
        if devices % devices_per_host:
            continue
        n = devices // devices_per_host
        if n < 1 or n > max_hosts or replicas % (n * instances_per_host):
            continue
        if (devices_per_host // instances_per_host) % devices_per_replica:
            continue
        if feasible(g, replicas, max_local_batch, min_grad_accum, local_batch, grad_accum):
            out.append(n)
            if len(out) == limit:
                break
    return out
