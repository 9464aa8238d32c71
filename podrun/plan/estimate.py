"""The estimate: throughput from per-device rates and a ring all-reduce cost model, and time to train."""
from __future__ import annotations

from typing import TYPE_CHECKING

from podrun.plan.model import Estimate

if TYPE_CHECKING:  # pragma: no cover - the agent imports the planner's model without the specs
    from podrun.plan.decompose import Decomposition
    from podrun.specs.cluster import InterconnectSpec
    from podrun.specs.recipe import RecipeSpec


def allreduce_seconds(grad_bytes: float, replicas: int, replicas_per_host: int, hosts: int,
                      net: InterconnectSpec) -> float:
    """Hierarchical ring all-reduce: reduce-scatter/all-gather inside a host, ring across hosts.

    inside:  2(d-1)/d x B / bw_intra + 2(d-1) x latency_intra   (d = replicas on a host)
    across:  2(H-1)/H x B / bw_inter + 2(H-1) x latency_inter   (H hosts; all of a host's shards
             share its inter-host bandwidth, so the bytes per host are 2(H-1)/H x B)
    """
    if replicas <= 1:
        return 0.0
    t = 0.0
    for n, link in ((replicas_per_host, net.intra_host), (hosts, net.inter_host)):
        if n > 1:
            t += 2 * (n - 1) / n * grad_bytes * 8 / (link.bandwidth_gbps * 1e9)
            t += 2 * (n - 1) * link.latency_us * 1e-6
    return t


def _link(link) -> str:
    """A link's figures, and where they come from when they were measured (a published source is the spec's)."""
    text = f"{link.bandwidth_gbps:g} Gb/s"
    if link.source.startswith("measured"):
        text = f"{link.bandwidth_gbps:.3g} Gb/s and {link.latency_us:.3g} us ({link.source})"
    return text


def estimate(d: Decomposition, recipe: RecipeSpec, net: InterconnectSpec, *, per_device_rate: float,
             rate_source: str, devices_per_replica: int, hosts: int, bubble: float, hidden_fraction: float = 0.0,
             hidden_source: str = "") -> Estimate:
    """The estimate of ``recipe`` decomposed as ``d`` (replicas x local batch x GA) on ``hosts`` hosts.
    ``hidden_fraction``: the part of the all-reduce that overlaps the backward pass (a calibration's measured
    figure, with ``hidden_source`` saying where it was measured, which the assumptions keep even when the measured
    part is 0); without a source: none, the step is compute + all-reduce."""
    replicas, local_batch, grad_accum = d.replicas, d.local_batch, d.grad_accum
    params, gradient_bytes = recipe.model.params, recipe.gradient_bytes
    replica_rate = per_device_rate * devices_per_replica * (1.0 - bubble)
    compute = grad_accum * local_batch / replica_rate
    comm = allreduce_seconds(params * gradient_bytes, replicas, replicas // hosts, hosts, net)
    step = compute + comm * (1.0 - hidden_fraction)
    overlap = "no overlap of communication with compute" if hidden_source == "" else \
        f"{hidden_fraction:.0%} of the all-reduce hidden behind the backward pass ({hidden_source})"
    efficiency = compute / step
    images_per_second = replicas * local_batch * grad_accum / step
    hours = recipe.epochs * recipe.dataset.train_size / images_per_second / 3600
    return Estimate(
        images_per_second=round(images_per_second, 1),
        scaling_efficiency=round(efficiency, 4),
        time_to_train_hours=round(hours, 3),
        step_seconds=round(step, 6),
        allreduce_seconds=round(comm, 6),
        per_replica_images_per_second=round(replica_rate, 2),
        allreduce_hidden_fraction=round(hidden_fraction, 4),
        assumptions=(
            f"per-device rate {per_device_rate:g} img/s ({rate_source})",
            f"a replica of {devices_per_replica} device(s) runs at {devices_per_replica} x that rate x (1 - bubble)",
            f"one all-reduce of {params:,} gradients x {gradient_bytes} bytes per weight update, hierarchical ring, "
            f"intra-host {_link(net.intra_host)}, inter-host {_link(net.inter_host)}",
            f"{overlap}; the input pipeline is not yet measured (podrun data bench times it on a host); optimiser step and evaluation are free",
        ),
    )
