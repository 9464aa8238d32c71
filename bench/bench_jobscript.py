"""Benchmarks for podrun.jobscript: Slurm nodelist expansion/compression against python-hostlist and
scontrol, and job-script rendering. `run(quick)` returns rows for bench/run.py."""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
import time

from bench.rows import row


def _median_us(fn, repeats: int, inner: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner * 1e6)
    return statistics.median(times)


def _abci_like_nodelist() -> tuple[str, list[str]]:
    """1,088 ABCI node names with every 7th node missing (a fragmented allocation of 932 nodes)."""
    from podrun.jobscript import compress_hostlist

    names = [f"g{i:04d}" for i in range(1, 1089) if i % 7]
    return compress_hostlist(names), names


def _row(benchmark, subject, value, peer, peer_value, unit, note):
    return row(benchmark, subject, value, unit, note, peer, peer_value)


def run(quick: bool = True) -> list[dict]:
    from podrun.jobscript import JobRequest, compress_hostlist, expand_nodelist, render

    repeats, inner = (5, 20) if quick else (15, 100)
    text, names = _abci_like_nodelist()
    assert expand_nodelist(text) == names
    rows = []

    try:
        import hostlist  # python-hostlist, the usual pure-Python peer (optional)
    except ImportError:
        hostlist = None
    ours = _median_us(lambda: expand_nodelist(text), repeats, inner)
    peer = _median_us(lambda: hostlist.expand_hostlist(text), repeats, inner) if hostlist else None
    if hostlist:
        assert hostlist.expand_hostlist(text) == names
    rows.append(_row("nodelist expand (932 of 1,088 ABCI nodes, 156 ranges)", "podrun expand_nodelist", ours,
                     "python-hostlist expand_hostlist" if hostlist else None, peer, "us",
                     f"median of {repeats} x {inner}; same output checked" + ("" if hostlist else
                                                                               "; pip install python-hostlist for the peer")))
    ours = _median_us(lambda: compress_hostlist(names), repeats, inner)
    peer = _median_us(lambda: hostlist.collect_hostlist(names), repeats, inner) if hostlist else None
    rows.append(_row("nodelist compress (932 names)", "podrun compress_hostlist", ours,
                     "python-hostlist collect_hostlist" if hostlist else None, peer, "us",
                     f"median of {repeats} x {inner}; collect_hostlist sorts, podrun keeps order"))

    exe = shutil.which("scontrol")
    if exe:
        with tempfile.TemporaryDirectory() as d:
            conf = os.path.join(d, "slurm.conf")
            with open(conf, "w") as f:
                f.write("ClusterName=bench\nSlurmctldHost=localhost(127.0.0.1)\nNodeName=n1 CPUs=1\n"
                        "PartitionName=p Nodes=n1\n")
            env = {**os.environ, "SLURM_CONF": conf}

            def sc():
                subprocess.run([exe, "show", "hostnames", text], env=env, capture_output=True, check=True)

            peer = _median_us(sc, repeats, 5 if quick else 20)
            ours = _median_us(lambda: expand_nodelist(text), repeats, inner)
            rows.append(_row("nodelist expand (932 of 1,088 ABCI nodes, 156 ranges)", "podrun expand_nodelist", ours,
                             "scontrol show hostnames (process)", peer, "us",
                             "scontrol includes starting a process: what a shell script pays per call"))

    req = JobRequest(scheduler="uge", job_name="bench", nodes=512, devices_per_node=4, device_kind="gpu",
                     command=("podrun", "launch", "--nodes", "512", "resnet50", "--", "it's $(x)"),
                     time_limit="1h", modules=("cuda/12.2",), env=(("NCCL_DEBUG", "WARN"),))
    ours = _median_us(lambda: render(req), repeats, inner)
    rows.append(_row("render a job script (uge, 512 nodes)", "podrun render", ours, None, None, "us",
                     f"median of {repeats} x {inner}; validation included"))
    return rows


if __name__ == "__main__":
    import sys

    from bench.rows import run_alone

    run_alone(run, quick="--full" not in sys.argv)
