"""The estimate: throughput from per-device rates and a ring all-reduce cost model, and time to train."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from podrun.plan.model import Estimate

if TYPE_CHECKING:  # pragma: no cover - the agent imports the planner's model without the specs
    from podrun.plan.decompose import Decomposition
    from podrun.plan.measured import InputMeasured
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
    if link.source.startswith("measured"):
        return f"{link.bandwidth_gbps:.3g} Gb/s and {link.latency_us:.3g} us ({link.source})"
    return f"{link.bandwidth_gbps:g} Gb/s"


@dataclass(frozen=True)
class InputTerm:
    """The input pipeline's part of a step on one host, the step with it, and what would change it when it bounds
    the step."""

    seconds: float          # the input alone: the host's samples at its loader workers' measured rate
    step: float             # the step with the input in it
    bound: bool
    assumption: str
    levers: tuple[str, ...]


def shared_cores_step(*, device: float, device_core_seconds: float, input_wall: float, input_core_seconds: float,
                      cores: float) -> float:
    """A CPU device's step when the loader workers and the compute share ``cores`` of a host: the compute and the
    input overlap (the workers decode the next batches while the model steps), so the step is the longest of the
    device's part alone, the input alone, and the two's core-seconds spread over the cores (neither can run
    faster than the cores left to it allow)."""
    return max(device, input_wall, (device_core_seconds + input_core_seconds) / cores)


def cores_given(host_cores: int, input_cores: float | None, compute_cores: float | None) -> float:
    """The cores a host gives a run's compute and loader workers together: the more that either kept busy when
    measured (the input pipeline at its largest count, the compute of the host's ranks), at most the host's cores;
    the host's cores unless both were measured (the input's figure alone cannot tell others' work from waits on
    the files). On a host of the job's own that is its cores; on one shared with others' work, the share the
    calibration found."""
    if input_cores is None or compute_cores is None:
        return float(host_cores)
    return min(float(host_cores), max(input_cores, compute_cores, 1e-3))


def input_term(inp: InputMeasured, *, samples_per_host: float, ranks_per_host: int, device_part: float,
               device_kind: str, compute_cores: float | None = None) -> InputTerm:
    """A host decodes ``samples_per_host`` a step with the run's loader workers (each rank's share of the measured
    host's cores, at least one: podrun.train.data_pool.default_workers): their measured rate gives the input's
    seconds. On an accelerator the workers run beside the device: the step is the longer of the two. On a CPU
    device they share the host's cores with the compute: shared_cores_step, the compute's core-seconds being
    ``device_part`` x ``compute_cores`` (the cores a rank's step kept busy in the calibration; None: the rank's share
    of the host's) x the ranks, the input's the samples x the CPU time an image measured at the run's count (else
    each worker busy for the input's seconds), the cores cores_given's. Input bounds the step when it is longer
    than the device's part, or, on a CPU device, when it lengthens the step and costs more core-seconds than the
    compute."""
    per_rank = max(1, inp.cores // ranks_per_host)
    workers = per_rank * ranks_per_host
    rate = inp.rate_at(workers)
    seconds = samples_per_host / rate
    on_cpu = device_kind == "cpu"
    if on_cpu:
        busy = compute_cores if compute_cores is not None else inp.cores / ranks_per_host
        device_cs = device_part * busy * ranks_per_host
        ms = inp.cpu_ms_at(workers)
        input_cs = samples_per_host * ms / 1e3 if ms is not None else seconds * workers
        cores = cores_given(inp.cores, inp.cores_used(),
                            None if compute_cores is None else compute_cores * ranks_per_host)
        step = shared_cores_step(device=device_part, device_core_seconds=device_cs, input_wall=seconds,
                                 input_core_seconds=input_cs, cores=cores)
        bound = seconds > device_part or (step > device_part and input_cs > device_cs)
        busy_from = "measured" if compute_cores is not None else "the rank's share, not measured"
        how = (f"on a CPU device the loader workers share the host's cores with the compute: the step is the "
               f"longest of the device's part {device_part * 1e3:.1f} ms, the input's {seconds * 1e3:.1f} ms and "
               f"their core-seconds over the cores, ({device_cs:.3g} + {input_cs:.3g}) / {cores:.3g} = "
               f"{(device_cs + input_cs) / cores * 1e3:.1f} ms (the compute {busy:.2g} core(s) a rank, "
               f"{busy_from}; the input " +
               (f"{ms:.3g} ms of CPU an image" if ms is not None else "each worker busy throughout") +
               f"; {cores:.3g} of the host's {inp.cores} cores, the most the input or the compute kept busy)")
    else:
        step = max(device_part, seconds)
        bound = seconds > device_part
        how = "the loader workers run beside the device: the step is the longer of the device's part and the input"
    assumption = (f"input {rate:.0f} img/s a host at {workers} loader worker(s) ({ranks_per_host} rank(s) x "
                  f"{per_rank}), {samples_per_host:g} samples a host a step: {seconds * 1e3:.1f} ms (measured: "
                  f"{inp.where}); {how}")
    if not bound:
        return InputTerm(seconds, step, False, assumption, ())
    levers = []
    best_w, best_r = inp.best()
    more = -(-best_w // ranks_per_host)            # a rank's share of the fastest count, rounded up
    faster = inp.rate_at(more * ranks_per_host)
    if faster > rate * 1.05:
        levers.append(f"loader workers: --loader-workers {more} ({more * ranks_per_host} on each host) at the "
                      f"{faster:.0f} img/s measured there: input {samples_per_host / faster * 1e3:.1f} ms a step")
    one = rate / workers                          # a worker's share at the run's count
    need = samples_per_host / device_part if device_part > 0 else float("inf")
    if one > 0 and need != float("inf"):
        cores = -(-need // one)
        levers.append(f"cores: to keep pace with the device's {device_part * 1e3:.1f} ms a step a host must decode "
                      f"{need:.0f} img/s, about {cores:.0f} loader workers at the {one:.1f} img/s a worker measured "
                      f"at {workers} (the host measured had {inp.cores} cores)" +
                      (", besides the cores of the compute" if on_cpu else ""))
    if device_kind.startswith("gpu"):
        levers.append("the device's decoder: nvJPEG decodes, crops and resizes on the GPU (used on CUDA where "
                      "torchvision with CUDA support imports), leaving the host only the file reads")
    if inp.decoder == "pil":
        levers.append("simplejpeg (pip install 'podrun[data]') in place of PIL: libjpeg-turbo with DCT scaling")
    levers.append("staging: on a shared file system, the data as tar shards (podrun data pack) copied to each "
                  "host's node-local disk before the start (--stage), so that reads are neither metadata "
                  "operations nor network")
    return InputTerm(seconds, step, True, assumption, tuple(levers))


@dataclass(frozen=True)
class HostInput:
    """The input pipeline as a host runs it: its measured rates, the ranks that share the host, the device kind,
    and on a CPU device the cores a rank's step keeps busy (None: not measured)."""

    measured: InputMeasured
    ranks_per_host: int = 1
    device_kind: str = ""
    compute_cores: float | None = None


def estimate(d: Decomposition, recipe: RecipeSpec, net: InterconnectSpec, *, per_device_rate: float,
             rate_source: str, devices_per_replica: int, hosts: int, bubble: float, hidden_fraction: float = 0.0,
             hidden_source: str = "", inp: HostInput | None = None) -> Estimate:
    """The estimate of ``recipe`` decomposed as ``d`` (replicas x local batch x GA) on ``hosts`` hosts.
    ``hidden_fraction``: the part of the all-reduce that overlaps the backward pass (a calibration's measured
    figure, with ``hidden_source`` saying where it was measured, which the assumptions keep even when the measured
    part is 0); without a source: none, the step is compute + all-reduce. ``inp``: the input pipeline measured
    on a host (input_term); None: not measured, and the assumptions say so."""
    replicas, local_batch, grad_accum = d.replicas, d.local_batch, d.grad_accum
    params, gradient_bytes = recipe.model.params, recipe.gradient_bytes
    replica_rate = per_device_rate * devices_per_replica * (1.0 - bubble)
    compute = grad_accum * local_batch / replica_rate
    comm = allreduce_seconds(params * gradient_bytes, replicas, replicas // hosts, hosts, net)
    device_part = compute + comm * (1.0 - hidden_fraction)
    term = None if inp is None else input_term(inp.measured, samples_per_host=d.global_batch / hosts,
                                               ranks_per_host=inp.ranks_per_host, device_part=device_part,
                                               device_kind=inp.device_kind, compute_cores=inp.compute_cores)
    step = device_part if term is None else term.step
    overlap = "no overlap of communication with compute" if hidden_source == "" else \
        f"{hidden_fraction:.0%} of the all-reduce hidden behind the backward pass ({hidden_source})"
    unmeasured = "the input pipeline is not yet measured (podrun data bench times it on a host; podrun calibrate " \
                 "--data puts it in the plan); " if term is None else ""
    efficiency = compute / device_part
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
        compute_seconds=round(compute, 6),
        input_seconds=None if term is None else round(term.seconds, 6),
        input_bound=term is not None and term.bound,
        input_levers=() if term is None else term.levers,
        assumptions=(
            f"per-device rate {per_device_rate:g} img/s ({rate_source})",
            f"a replica of {devices_per_replica} device(s) runs at {devices_per_replica} x that rate x (1 - bubble)",
            f"one all-reduce of {params:,} gradients x {gradient_bytes} bytes per weight update, hierarchical ring, "
            f"intra-host {_link(net.intra_host)}, inter-host {_link(net.inter_host)}",
            f"{overlap}; {unmeasured}optimiser step and evaluation are free",
        ) + (() if term is None else (term.assumption,)),
    )
