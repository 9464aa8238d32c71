"""The calibration worker that `podrun calibrate` launches on every device of the hosts (podrun launch's workers,
torch.distributed over gloo): the largest local batch, the rate per device, the all-reduce between hosts."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from podrun import safefs

RESULT = "calibration-result.json"     # in the run directory, written by rank 0


def say(text: str) -> None:
    print(f"calibrate: {text}", flush=True)


def plan_batch(recipe, plan: dict, largest: int, hosts: int) -> int | None:
    """The local batch a plan of the recipe's global batch picks on the first ``hosts`` of these hosts with
    ``largest`` the largest local batch (None: no feasible plan there)."""
    from podrun.plan.decompose import feasible

    kind = plan["device_kind"]
    p = recipe.lookup("devices_per_replica", kind, kind.split("-")[0]) or 1
    min_ga = recipe.lookup("min_grad_accum", kind, kind.split("-")[0]) or 1
    replicas = hosts * plan["devices_per_host"] // p
    if replicas < 1:
        return None
    d = feasible(recipe.global_batch, replicas, largest, min_ga, None, None)
    return None if d is None else d.local_batch


def candidate_batches(recipe, plan: dict, largest: int) -> list[int]:
    """The local batches a plan of the recipe's global batch picks on 1..N of these hosts (largest local batch
    ``largest``): the ones the calibrated plans run at; at least two (half of the one, else), so that the
    step time can be drawn as a line through them."""
    out = {b for n in range(1, len(plan["hosts"]) + 1) if (b := plan_batch(recipe, plan, largest, n)) is not None}
    if not out:
        out.add(min(largest, recipe.global_batch))
    if len(out) == 1:
        (b,) = out
        out.add(max(1, b // 2) if b > 1 else min(2, largest))
    return sorted(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m podrun.calibrate.worker")
    ap.add_argument("--recipe", required=True)
    given = ap.add_mutually_exclusive_group(required=True)
    given.add_argument("--budget", type=int, help="bytes one device may hold: the largest local batch searched")
    given.add_argument("--largest", type=int, help="the largest local batch, given: no search")
    ap.add_argument("--batches", default="", help="local batches to time (default: the plans' own)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--start-batch", type=int, default=1)
    ap.add_argument("--net-iters", type=int, default=3)
    ap.add_argument("--image-size", type=int, default=None, help="input side in pixels (default: the recipe's)")
    ap.add_argument("--data", default=None, help="a sample of the user's data: the input pipeline timed on it")
    ap.add_argument("--input-images", type=int, default=128, help="images timed per loader worker count")
    args = ap.parse_args(argv)

    import torch
    import torch.distributed as dist

    from podrun.calibrate import step as steps
    from podrun.calibrate.search import largest_fit
    from podrun.runtime.env import read_plan, read_worker_info
    from podrun.specs import load_recipe

    info = read_worker_info()
    plan = read_plan(info)
    recipe = load_recipe(args.recipe)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        threads = max(1, (os.cpu_count() or 1) // max(1, info.local_world_size))
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", threads)))
    else:
        torch.cuda.set_device(info.local_rank)
    # 0. the input pipeline, on each host's first rank before the group forms (the host's other ranks wait idle in
    # the rendezvous, so the decode has the host's cores as in a run's loader workers)
    mine = input_rates(recipe, args, info) if args.data is not None and info.local_rank == 0 else None
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    lws = info.local_world_size
    every_input = [None] * world
    dist.all_gather_object(every_input, mine)
    hosts = world // lws
    t_start = time.monotonic()

    # 1. the largest local batch: one device (rank 0), each probe in a forked child
    state = [None, None]                         # [largest, peak of batch 1 when it does not fit]
    probes = []
    if args.largest is not None:
        state = [args.largest, None]
    elif rank == 0:
        def shown(p):
            mb = "died" if p.peak_bytes is None else f"{p.peak_bytes / 2**20:.0f} MiB"
            say(f"memory probe {len(probes) + 1}: local batch {p.local_batch}: {mb} of "
                f"{args.budget / 2**20:.0f} MiB: {'fits' if p.fits else 'does not fit'}")
        largest, got = largest_fit(lambda b: steps.probe(recipe, b, device, image_size=args.image_size), args.budget,
                                   start=args.start_batch, on_probe=lambda p: (shown(p), probes.append(p)))
        probes = got
        state = [largest, next((p.peak_bytes for p in got if p.local_batch == 1), None)]
    box = [state]
    dist.broadcast_object_list(box, src=0)
    largest, one_sample = box[0]
    if largest is None:
        if rank == 0:
            _write(info.run_dir, {"error": "budget", "batch1_bytes": one_sample, "budget": args.budget,
                                  "probes": [p.__dict__ for p in probes]})
        dist.destroy_process_group()
        return 0

    # 2. the rate per device at the plans' local batches: every device at once (as in a run)
    batches = sorted({int(b) for b in args.batches.split(",") if b}) if args.batches else \
        candidate_batches(recipe, plan, largest)
    stepper = steps.Stepper(recipe, device, args.image_size)
    rates = []
    for b in batches:
        dist.barrier()
        times = stepper.time_steps(b, args.steps)
        t = _slowest(statistics.median(times), world)
        cpu = _slowest(statistics.median(stepper.cpu_seconds), world) if device == "cpu" else None
        rates.append({"local_batch": b, "step_seconds": t, "images_per_second": b / t, "cpu_seconds": cpu})
        if rank == 0:
            say(f"rate at local batch {b}: {b / t:.1f} img/s per device (slowest of {world})")
    # 3. the data-parallel step at the plan's local batch on all the hosts: how much of the all-reduce hides
    nbytes = recipe.model.params * recipe.gradient_bytes
    overlap = None
    if world > 1:
        at = batch_on_all(recipe, plan, largest, batches)
        step_alone = next(r["step_seconds"] for r in rates if r["local_batch"] == at)
        overlap = data_parallel_step(stepper, at, args.steps, step_alone, nbytes, args.net_iters, world)
        if rank == 0:
            say(f"data-parallel step at local batch {at} ({world} ranks): {overlap['synced_step_seconds']:.3g} s "
                f"against {step_alone:.3g} s alone and {overlap['allreduce_seconds']:.3g} s of all-reduce: "
                f"{overlap['hidden_fraction']:.0%} of the all-reduce hidden")
    del stepper

    # 4. the all-reduce at the recipe's gradient size: across hosts (one rank each), inside host 0; rank 0 is in both
    inter_ranks = [h * lws for h in range(hosts)]
    intra_ranks = list(range(lws))
    inter = dist.new_group(inter_ranks) if hosts > 1 else None
    intra = dist.new_group(intra_ranks) if lws > 1 else None
    network = {"backend": "gloo", "intra_host": None, "inter_host": None}
    for key, group, ranks in (("inter_host", inter, inter_ranks), ("intra_host", intra, intra_ranks)):
        if group is None:
            continue
        dist.barrier()
        if rank in ranks:
            link = allreduce_link(group, len(ranks), nbytes, args.net_iters)
            if rank == ranks[0]:
                say(f"all-reduce {key.replace('_', '-')} ({len(ranks)} ranks, {nbytes / 2**20:.1f} MiB): bus "
                    f"bandwidth {link['bus_bandwidth_gbps']:.3g} Gb/s, latency {link['latency_us']:.0f} us")
            network[key] = link
    if rank == 0:
        _write(info.run_dir, {"largest": largest, "probes": [p.__dict__ for p in probes], "throughput": rates,
                              "network": network, "world": world, "local_world_size": lws, "device": device,
                              "image_size": steps.input_size(recipe, args.image_size), "overlap": overlap,
                              "input": _input_of([r for r in every_input if r is not None]),
                              "seconds": time.monotonic() - t_start})
    dist.barrier()
    dist.destroy_process_group()
    return 0


def input_rates(recipe, args, info) -> dict:
    """podrun data bench on this host: the recipe's decode and augmentation over ``args.data`` at 0, 1, 2, 4 ...
    loader workers up to the host's cores, batches of 32 (fewer when the sample is small)."""
    from podrun.calibrate import step as steps
    from podrun.train.data_bench import bench, default_counts, host_cores, train_split

    size = steps.input_size(recipe, args.image_size)
    cores = host_cores(info.local_world_size)
    n = len(train_split(args.data, size))
    batch = max(1, min(32, n, args.input_images))
    say(f"input pipeline on {args.data} ({n} images, {size} px): 0..{cores} loader workers")
    record = bench(args.data, size, default_counts(cores), batch=batch, images=args.input_images)
    record["cores"] = cores
    for row in record["rows"]:
        say(f"input at {row['workers']} loader worker(s): {row['images_per_second']:.1f} img/s")
    return record


def _input_of(records: list[dict]) -> dict | None:
    """The hosts' input records as the calibration's one (each worker count's slowest host)."""
    from podrun.train.data_bench import slowest

    if not records:
        return None
    r = slowest(records)
    return {"data": r["data"], "decoder": r["decoder"], "cores": r["cores"], "image_size": r["image_size"],
            "images": r["rows"][0]["images"], "hosts": r["hosts"],
            "rates": [{"workers": x["workers"], "images_per_second": x["images_per_second"],
                       "cpu_ms_per_image": x["cpu_ms_per_image"]} for x in r["rows"]]}


def batch_on_all(recipe, plan: dict, largest: int, batches: list[int]) -> int:
    """The timed local batch a plan on all the hosts runs: the plan's own when it was timed, else the largest
    timed one below it, else the smallest timed."""
    want = plan_batch(recipe, plan, largest, len(plan["hosts"]))
    below = [b for b in batches if b <= (batches[-1] if want is None else want)]
    return below[-1] if below else batches[0]


def data_parallel_step(stepper, b: int, steps: int, step_alone: float, nbytes: int, iters: int, world: int) -> dict:
    """The stepper's model under DDP over every rank, all stepping at once at local batch ``b`` (the slowest
    device's median, as in a run), and one all-reduce of ``nbytes`` over every rank (median of ``iters``): the
    overlap file entry (podrun.specs.calibration.OverlapResult)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from podrun.specs.calibration import hidden_fraction

    allreduce = timed_allreduce(torch.zeros(max(1, nbytes // 4)), iters)
    core = stepper.model
    stepper.model = DistributedDataParallel(core)
    try:
        dist.barrier()
        synced = _slowest(statistics.median(stepper.time_steps(b, steps)), world)
    finally:
        stepper.model = core                       # DDP's reducer freed before the group is destroyed
    return {"ranks": world, "local_batch": b, "step_seconds": step_alone, "allreduce_seconds": allreduce,
            "synced_step_seconds": synced, "hidden_fraction": hidden_fraction(step_alone, allreduce, synced)}


def _slowest(mine: float, world: int) -> float:
    """The largest of every rank's figure (synchronous data parallelism waits for the slowest)."""
    import torch.distributed as dist

    every = [None] * world
    dist.all_gather_object(every, mine)
    return max(every)


def timed_allreduce(t, iters: int, group=None) -> float:
    """The median time of ``iters`` all-reduces of tensor ``t`` in ``group`` (None: every rank), each started
    together (a barrier), after one untimed (connections, buffers)."""
    import torch.distributed as dist

    dist.all_reduce(t, group=group)
    out = []
    for _ in range(iters):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        dist.all_reduce(t, group=group)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def allreduce_link(group, n: int, nbytes: int, iters: int) -> dict:
    """Bus bandwidth (nccl-tests: algbw x 2(n-1)/n) and per-step latency of all-reduce in ``group``: the median
    of ``iters`` all-reduces of ``nbytes``, and of 20 of 4 bytes (a ring's 2(n-1) steps of latency)."""
    import torch

    small = timed_allreduce(torch.zeros(1), 20, group)
    big = timed_allreduce(torch.zeros(max(1, nbytes // 4)), iters, group)
    steps_ = 2 * (n - 1)
    latency = small / steps_
    moving = max(big - steps_ * latency, big * 0.5)
    busbw = nbytes / moving * steps_ / n
    return {"ranks": n, "message_bytes": nbytes, "bus_bandwidth_gbps": busbw * 8 / 1e9,
            "latency_us": latency * 1e6, "seconds": big}


def _write(run_dir: str | None, obj: dict) -> None:
    if run_dir is None:
        print(json.dumps(obj))
        return
    safefs.write_file(os.path.join(run_dir, RESULT), json.dumps(obj), "request file", durable=False)


if __name__ == "__main__":
    sys.exit(main())
