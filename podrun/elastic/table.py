"""Elastic tables, pure: the decomposition of one fixed global batch on every host count from MAX down to MIN."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from podrun.errors import PlanError
from podrun.plan import Overrides, make_plan
from podrun.plan.model import Plan

if TYPE_CHECKING:  # pragma: no cover
    from podrun.specs.cluster import ClusterSpec
    from podrun.specs.recipe import RecipeSpec


@dataclass(frozen=True)
class ElasticRow:
    """One host count: its plan, or the reason the global batch cannot be met exactly there."""

    hosts: int
    plan: Plan | None
    reason: str | None = None

    @property
    def feasible(self) -> bool:
        return self.plan is not None

    def to_dict(self) -> dict:
        if self.plan is None:
            return {"hosts": self.hosts, "feasible": False, "reason": self.reason}
        p = self.plan
        return {"hosts": self.hosts, "feasible": True, "devices": p.devices, "replicas": p.replicas,
                "instances": p.instances, "local_batch": p.local_batch, "grad_accum": p.grad_accum,
                "global_batch": p.global_batch, "learning_rate": p.learning_rate,
                "pipeline_bubble": p.pipeline_bubble,
                "images_per_second": p.estimate.images_per_second,
                "scaling_efficiency": p.estimate.scaling_efficiency,
                "time_to_train_hours": p.estimate.time_to_train_hours}


@dataclass(frozen=True)
class ElasticTable:
    global_batch: int
    min_hosts: int
    max_hosts: int
    rows: tuple[ElasticRow, ...]     # MAX hosts first, down to MIN

    def to_dict(self) -> dict:
        return {"global_batch": self.global_batch, "min_hosts": self.min_hosts, "max_hosts": self.max_hosts,
                "elastic": [r.to_dict() for r in self.rows]}


def parse_range(text: str) -> tuple[int, int | None]:
    """'MIN' or 'MIN:MAX' (host counts) -> (MIN, MAX or None); a malformed one is a PlanError."""
    lo, sep, hi = str(text).partition(":")
    try:
        mn = int(lo)
        mx = int(hi) if sep else None
    except ValueError:
        raise PlanError(f"--elastic {text!r} is not MIN or MIN:MAX (host counts)",
                        hint="write e.g. --elastic 8 or --elastic 8:16") from None
    if mn < 1 or (mx is not None and mx < mn):
        raise PlanError(f"--elastic {text}: host counts need 1 <= MIN <= MAX",
                        hint="write e.g. --elastic 8 or --elastic 8:16")
    return mn, mx


def pinned_global_batch(cluster: ClusterSpec, recipe: RecipeSpec | None, ov: Overrides, hosts: int) -> int:
    """The global batch every row keeps: --global-batch, else the recipe's, else the one at ``hosts`` hosts."""
    if ov.global_batch is not None:
        return ov.global_batch
    if recipe is not None and not (ov.local_batch is not None and ov.grad_accum is not None):
        return recipe.global_batch
    return make_plan(cluster, recipe, replace(ov, nodes=hosts)).global_batch


def elastic_table(cluster: ClusterSpec, recipe: RecipeSpec | None, ov: Overrides, min_hosts: int,
                  max_hosts: int | None = None, global_batch: int | None = None) -> ElasticTable:
    """One row per host count from ``max_hosts`` (default: --nodes, else every host) down to ``min_hosts``.

    The global batch is ``global_batch`` when given, else pinned by ``pinned_global_batch``; every
    feasible row meets it exactly, the others carry the planner's reason.
    """
    top = max_hosts if max_hosts is not None else (ov.nodes if ov.nodes is not None else len(cluster.hosts))
    if min_hosts < 1 or top < min_hosts:
        raise PlanError(f"elastic range {min_hosts}:{top}: host counts need 1 <= MIN <= MAX",
                        hint="give MIN no larger than the plan's host count (--nodes, --hosts)")
    if top > len(cluster.hosts):
        raise PlanError(f"elastic MAX {top} is more hosts than cluster '{cluster.name}' has ({len(cluster.hosts)})",
                        hint=f"use --elastic {min_hosts}:{len(cluster.hosts)} or give more hosts with --hosts/--hostfile")
    g = global_batch if global_batch is not None else pinned_global_batch(cluster, recipe, ov, top)
    rows = []
    for n in range(top, min_hosts - 1, -1):       # the plan on the first n hosts at exactly g
        try:
            rows.append(ElasticRow(n, make_plan(cluster, recipe, replace(ov, nodes=n, global_batch=g))))
        except PlanError as exc:
            rows.append(ElasticRow(n, None, _reason(cluster, recipe, ov, g, n, exc)))
    return ElasticTable(g, min_hosts, top, tuple(rows))


def _reason(cluster: ClusterSpec, recipe: RecipeSpec | None, ov: Overrides, g: int, n: int, exc: PlanError) -> str:
    """Why ``n`` hosts cannot meet ``g``: the divisibility when that is it, else the planner's message."""
    dph = ov.devices_per_host if ov.devices_per_host is not None else cluster.devices_per_host
    dev = cluster.device
    p = recipe.lookup("devices_per_replica", dev.key, dev.kind) if recipe is not None else 1
    if p is not None and p >= 1 and (n * dph) % p == 0:
        replicas = n * dph // p
        if g % replicas:
            return f"global batch {g} is not a multiple of {replicas} replicas"
    return exc.reason
