"""Warm restarts (podrun.host.zygote) vs cold ones, side by side: the time from a lost host declared to the
first step of the re-planned attempt, with `podrun launch --elastic` (warm by default) and the same with
`--no-warm`, interleaved (cold, warm, cold, warm, ...), each on 4 fresh namespace hosts
(tests.harness.NetnsHosts) with bench/scripts/warm_phases.py (bench/scripts/elastic_train.py with its
start phases logged) at 1 x 4 x GA 6 = 24; after 4 steps h3's link is cut. The breakdown of each restart
comes from summary.json (lost_at: the loss declared; restarted_after_s: every worker of the next attempt
started) and from the new rank 0's own clock: process created (from /proc), first line of the script, torch
imported, gloo joined, model + optimizer + checkpoint ready, first step. Also the first attempt's launch to
first step (what the zygotes' start costs it). Full: 3 pairs; quick: 1 pair.
`python -m bench.bench_warm warm|cold`: one run, its files kept in /tmp/bwarm-*."""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_elastic import GLOBAL_BATCH, HOSTS, KEEPALIVE, LOCAL_BATCH, MIN_HOSTS, PG_TIMEOUT, _steps
from bench.bench_launch import ROOT, _kill, _podrun_args, _row, _sweep
from bench.rows import measured

SCRIPT = str(ROOT / "bench" / "scripts" / "warm_phases.py")
CUT = "h3"
STEPS_BEFORE_CUT = 4
PHASES = ("agents_started", "created", "first_line", "torch", "init_done", "ready", "first_step")


def _phases(d: Path) -> list[dict]:
    try:
        return [json.loads(l) for l in (d / "phases.log").read_text().splitlines() if l.strip()]
    except (OSError, ValueError):
        return []


def restart_run(mode: str, tmp: str, port: int) -> dict:
    """One elastic run (``mode`` "warm" or "cold") on 4 fresh hosts, h3 cut after 4 steps: the restart's phases,
    in seconds from the loss declared."""
    import subprocess

    from tests.harness import NetnsHosts

    d = Path(tmp) / f"bench-warm-{mode}-{port}"
    d.mkdir(parents=True)
    marker = d.name
    with NetnsHosts(HOSTS) as hosts:
        argv = _podrun_args(hosts, hosts.hosts, str(d / "runs"), port, "--run-id", "run", "--keepalive",
                            f"{KEEPALIVE:g}", "--global-batch", str(GLOBAL_BATCH), "--local-batch", str(LOCAL_BATCH),
                            "--elastic", str(MIN_HOSTS), "--max-restarts", "2",
                            "--warm" if mode == "warm" else "--no-warm", "--", hosts.python, SCRIPT, "--dir", str(d),
                            "--batch", str(LOCAL_BATCH), "--pg-timeout", f"{PG_TIMEOUT:g}", "--marker", marker)
        log = open(d / "controller.log", "w")
        t_launch = time.time()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        out: dict = {"mode": mode, "command": argv}
        try:
            deadline = time.time() + 240
            while sum(1 for x in _steps(d) if x["world"] == HOSTS) < STEPS_BEFORE_CUT:
                if time.time() > deadline or proc.poll() is not None:
                    out["why"] = f"no {STEPS_BEFORE_CUT} steps on {HOSTS} hosts"
                    return out
                time.sleep(0.05)
            out["first_attempt_s"] = round(next(x["t"] for x in _steps(d) if x["world"] == HOSTS) - t_launch, 3)
            if mode == "warm":     # the zygotes the first attempt started must be up for the restart to use them
                socks = [d / "runs" / "run" / "zygote" / f"{h}.sock" for h in hosts.hosts]
                while not all(s.exists() for s in socks) and time.time() < deadline:
                    time.sleep(0.05)
            t_cut = time.time()
            hosts.isolate(CUT)
            deadline = time.time() + 120
            first = None
            while first is None and time.time() < deadline and proc.poll() is None:
                first = next((x for x in _steps(d) if x["world"] == HOSTS - 1), None)
                time.sleep(0.05)
            (d / "stop").touch()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
            if first is None:
                out["why"] = "no step on 3 hosts within 120 s"
                return out
            s = json.loads((d / "runs" / "run" / "summary.json").read_text())
            rp = s["elastic"]["replans"][0]
            lost = rp["lost_at"]
            ph = next((x for x in _phases(d) if x["restart"] == rp["restart"] and x["rank"] == 0), None)
            if ph is None:
                out["why"] = "the restarted rank 0 logged no phases"
                return out
            out.update(exit_code=s["exit_code"], detected_s=round(lost - t_cut, 3), warm_rank0=ph["warm"],
                       warm_workers=sum(1 for x in _phases(d) if x["restart"] == rp["restart"] and x["warm"]),
                       agents_started=rp["restarted_after_s"], created=ph["created"] - lost,
                       first_line=ph["first_line"] - lost, torch=ph["torch"] - lost,
                       init_done=first["init_done"] - lost, ready=first["ready"] - lost, first_step=first["t"] - lost,
                       training_after_s=rp["training_after_s"])
            return out
        finally:
            _kill([proc])
            _sweep(hosts, hosts.hosts, marker)
            log.close()


def _med(xs, k):
    vs = [x[k] for x in xs if x.get(k) is not None]
    return statistics.median(vs) if vs else None


def run(quick: bool) -> list[dict]:
    pairs = 1 if quick else 3
    port = 28400 + (os.getpid() % 40) * 10
    res: dict[str, list[dict]] = {"cold": [], "warm": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(pairs):
            for mode in ("cold", "warm"):
                port += 10
                r = restart_run(mode, tmp, port)
                res[mode].append(r)
                print(json.dumps({k: v for k, v in r.items() if k != "command"}), file=sys.stderr)
    ok, unmeasured = measured(res)
    note = (f"4 fresh namespace hosts, {CUT} cut after {STEPS_BEFORE_CUT} steps at 1 x 4 x GA 6 = {GLOBAL_BATCH}, "
            f"--keepalive {KEEPALIVE:g} --elastic {MIN_HOSTS}; seconds from the loss declared (summary.json lost_at) "
            f"to the first step on 3 hosts; interleaved cold/warm, runs: cold "
            f"{[x.get('first_step') and round(x['first_step'], 2) for x in res['cold']]}, warm "
            f"{[x.get('first_step') and round(x['first_step'], 2) for x in res['warm']]}{unmeasured}")
    if not ok["warm"] or not ok["cold"]:
        return [_row("warm_restart", "podrun --warm: loss declared -> first step", None, "s", note,
                     "podrun --no-warm")]
    rows = [_row("warm_restart", "podrun --warm: loss declared -> first step", [x["first_step"] for x in ok["warm"]],
                 "s", note, "podrun --no-warm", [x["first_step"] for x in ok["cold"]])]
    first = [[x["first_attempt_s"] for x in ok[m]] for m in ("warm", "cold")]
    rows.append(_row("warm_first_attempt", "podrun --warm: launch -> first step (first attempt, zygotes starting)",
                     first[0], "s", "the zygotes import torch while the first attempt's workers start (same runs); "
                                    f"runs: warm {first[0]}, cold {first[1]}", "podrun --no-warm", first[1]))
    for m in ("cold", "warm"):
        parts = ", ".join(f"{k} {_med(ok[m], k):.2f}" for k in PHASES)
        rows.append({"benchmark": "warm_restart_phases", "subject": f"podrun {'--warm' if m == 'warm' else '--no-warm'}",
                     "value": round(_med(ok[m], "first_step"), 3), "peer": None, "peer_value": None, "ratio": None,
                     "unit": "s", "note": f"medians of {len(ok[m])}, s after the loss declared (new rank 0's clock): "
                                          f"{parts}; workers forked by a zygote: "
                                          f"{[x['warm_workers'] for x in ok[m]]}"})
    return rows


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.path.insert(0, str(ROOT))
    if len(sys.argv) > 1 and sys.argv[1] in ("warm", "cold"):
        print(json.dumps(restart_run(sys.argv[1], tempfile.mkdtemp(prefix="bwarm-"), 28000 + os.getpid() % 400),
                         default=str, indent=1))
