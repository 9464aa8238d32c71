"""The planner, pure: (cluster spec, recipe, overrides) -> Plan. No I/O, no torch."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from podrun.errors import PlanError
from podrun.plan.model import Estimate, Placement, Plan

if TYPE_CHECKING:  # pragma: no cover - importing podrun.plan.model (the agent does) must not load the specs
    from podrun.plan.measured import Measured
    from podrun.specs.cluster import ClusterSpec
    from podrun.specs.recipe import RecipeSpec

__all__ = ["Overrides", "make_plan", "Plan", "Placement", "Estimate"]


@dataclass(frozen=True)
class Overrides:
    nodes: int | None = None             # use the first N hosts of the cluster
    global_batch: int | None = None
    local_batch: int | None = None
    grad_accum: int | None = None
    instances_per_host: int | None = None
    devices_per_host: int | None = None


def make_plan(cluster: ClusterSpec, recipe: RecipeSpec | None, ov: Overrides = Overrides(),
              measured: Measured | None = None) -> Plan:
    """``measured`` (podrun.plan.measured, from a calibration): its rate, links and largest local batch replace
    the published ones where it has them."""
    # the planner's parts are imported here: importing podrun.plan.model (the agents do) loads none of them
    from podrun.plan import lr as lr_rules
    from podrun.plan.decompose import decompose, pipeline_bubble
    from podrun.plan.estimate import HostInput, estimate
    from podrun.plan.placement import place

    notes: list[str] = []
    hosts = cluster.hosts
    if ov.nodes is not None and ov.nodes > len(hosts):
        raise PlanError(
            f"--nodes {ov.nodes} asks for more hosts than cluster '{cluster.name}' has ({len(hosts)})",
            hint=f"use --nodes {len(hosts)} or fewer, or give the hosts with --hosts/--hostfile",
        )
    dph = cluster.devices_per_host if ov.devices_per_host is None else ov.devices_per_host
    iph = cluster.instances_per_host if ov.instances_per_host is None else ov.instances_per_host
    for name, v in (("--nodes", ov.nodes), ("--devices-per-host", dph), ("--instances-per-host", iph)):
        if v is not None and v < 1:
            raise PlanError(f"{name} must be at least 1, got {v}")
    hosts = hosts if ov.nodes is None else hosts[: ov.nodes]
    if dph % iph:
        raise PlanError(
            f"{dph} devices per host cannot be shared evenly by {iph} instances per host",
            hint="choose --instances-per-host that divides the devices per host",
        )
    devices = len(hosts) * dph
    instances = len(hosts) * iph
    dev = cluster.device
    where = f"cluster {cluster.name}, {len(hosts)} host(s) x {dph} {dev.key}"

    local_batch, grad_accum = ov.local_batch, ov.grad_accum
    if recipe is None:           # a bare command: local batch and GA 1 unless given, or the global batch given
        p, max_local, min_ga, target = 1, 1, 1, ov.global_batch
        if target is None:
            local_batch, grad_accum = 1 if local_batch is None else local_batch, 1 if grad_accum is None else grad_accum
    else:
        p = recipe.lookup("devices_per_replica", dev.key, dev.kind)
        max_local = recipe.lookup("max_local_batch", dev.key, dev.kind)
        min_ga = recipe.lookup("min_grad_accum", dev.key, dev.kind)
        min_ga = 1 if min_ga is None else min_ga
        if measured is not None and measured.max_local_batch is not None:
            max_local = measured.max_local_batch
        for table, value in (("devices_per_replica", p), ("max_local_batch", max_local)):
            if value is None:
                raise PlanError(
                    f"recipe '{recipe.name}' has no {table} entry for device '{dev.key}'",
                    hint=f"add '{dev.kind}' or '{dev.key}' under {table} in {recipe.path}/recipe.yaml",
                )
        explicit = ov.local_batch is not None and ov.grad_accum is not None and ov.global_batch is None
        target = None if explicit else (recipe.global_batch if ov.global_batch is None else ov.global_batch)
        if target is not None and ov.global_batch is None:
            notes.append(f"global batch {target} is the recipe's reference global batch")
    d = decompose(devices=devices, devices_per_replica=p, instances=instances, max_local_batch=max_local,
                  min_grad_accum=min_ga, global_batch=target, local_batch=local_batch,
                  grad_accum=grad_accum, where=where, devices_per_host=dph, instances_per_host=iph,
                  max_hosts=len(cluster.hosts))
    devices_per_instance = dph // iph
    if devices_per_instance % p:
        raise PlanError(
            f"a replica of {p} devices does not fit in an instance of {devices_per_instance} devices ({where})",
            hint="replicas must not span instances: use fewer --instances-per-host, or devices per host that hold whole replicas",
        )
    if recipe is not None and ov.local_batch is None:
        of_max = "" if measured is None or measured.max_local_batch is None else f" ({measured.max_local_source})"
        notes.append(f"local batch {d.local_batch}: the largest <= max {max_local}{of_max} that divides "
                     f"{d.global_batch // d.replicas} samples per replica" + (f" with GA >= {min_ga}" if min_ga > 1 else ""))
    bubble = pipeline_bubble(p, d.grad_accum)
    rpi = d.replicas // instances
    placement = place(hosts, dph, iph, rpi, p)

    shape = dict(cluster=cluster.name, device_kind=dev.key, hosts=tuple(hosts), devices_per_host=dph,
                 devices=devices, devices_per_replica=p, replicas=d.replicas, instances_per_host=iph,
                 instances=instances, replicas_per_instance=rpi, local_batch=d.local_batch, grad_accum=d.grad_accum,
                 global_batch=d.global_batch, placement=placement, notes=tuple(notes), local_disk=cluster.local_disk)
    if recipe is None:
        est = Estimate(0.0, 1.0, 0.0, 0.0, 0.0, 0.0, ("a bare command: no estimate",))
        return Plan(**shape, recipe="", model="", reference_global_batch=d.global_batch, learning_rate=0.0,
                    reference_learning_rate=0.0, lr_rule="none", warmup_epochs=0.0, epochs=0.0, pipeline_bubble=0.0,
                    estimate=est)

    lr_spec = recipe.lr
    lr = lr_rules.scale(lr_spec.base, lr_spec.rule, d.global_batch, lr_spec.reference_batch)
    warmup = lr_rules.scale(recipe.schedule.warmup_epochs, lr_spec.warmup_rule, d.global_batch, lr_spec.reference_batch)
    notes.append(lr_rules.describe(lr_spec.rule, lr_spec.base, lr_spec.reference_batch, d.global_batch, lr))
    if warmup != recipe.schedule.warmup_epochs:
        notes.append(f"warmup rescaled by the {lr_spec.warmup_rule} rule: {recipe.schedule.warmup_epochs:g} -> {warmup:.4g} epochs")
    rate = recipe.lookup("throughput", dev.key, dev.kind)
    if rate is None:
        raise PlanError(
            f"recipe '{recipe.name}' has no throughput figure for device '{dev.key}'",
            hint=f"add throughput.{dev.kind} (images_per_second, source) to {recipe.path}/recipe.yaml",
        )
    per_device_rate, rate_source, net = rate.images_per_second, rate.source, cluster.interconnect
    hidden, hidden_source = 0.0, ""
    if measured is not None:     # the measured figures in place of the published ones where there are any
        if measured.step_seconds:
            per_device_rate, rate_source = measured.rate_at(d.local_batch), measured.describe_rate(d.local_batch)
        net = replace(net, intra_host=net.intra_host if measured.intra_host is None else measured.intra_host,
                      inter_host=net.inter_host if measured.inter_host is None else measured.inter_host)
        if measured.hidden_fraction is not None:
            hidden, hidden_source = measured.hidden_fraction, measured.hidden_source
    # the ranks a host runs (one per replica on CPU/GPU, one per instance on an IPU: poptorch drives its replicas)
    ranks_per_host = iph if dev.kind == "ipu" else iph * rpi
    est = estimate(d, recipe, net, per_device_rate=per_device_rate, rate_source=rate_source, devices_per_replica=p,
                   hosts=len(hosts), bubble=bubble, hidden_fraction=hidden, hidden_source=hidden_source,
                   inp=None if measured is None or measured.input is None else
                   HostInput(measured.input, ranks_per_host, dev.kind, measured.cores_busy_at(d.local_batch)))
    return Plan(**{**shape, "notes": tuple(notes)}, recipe=recipe.name, model=recipe.model.name,
                reference_global_batch=recipe.global_batch, learning_rate=round(lr, 8),
                reference_learning_rate=lr_spec.base, lr_rule=lr_spec.rule, warmup_epochs=round(warmup, 6),
                epochs=recipe.epochs, pipeline_bubble=round(bubble, 6), estimate=est,
                lr_reference_batch=lr_spec.reference_batch)
