"""In-place recovery against the restart it replaces, side by side: the resnet18 recipe (GroupNorm, synthetic data,
32 px) on 3 fresh namespace hosts (tests.harness.NetnsHosts) at global batch 12, `podrun launch --elastic 2
--keepalive 1`; after 3 updates h3's link is cut. ``inplace``: the recipe as it is (the survivors recover in
place); ``restart``: the same with the recipe's --no-inplace (every worker ended, the attempt restarted warm, the
state from the snapshots). Interleaved (restart, inplace, ...). Measured from the bench's own clock at the cut:
**cut to training again** = the end of the first update completed after the cut, minus that update's own
duration (its step_seconds in metrics.jsonl), as issue 56 defines it; and the run's own record (summary.json's
re-plan: detection, and in place its breakdown). ``torchft``: torchft 0.2.0 beside them on the same hosts, model,
data and cut (bench/scripts/torchft_train.py --model resnet18: the lighthouse on h1, one replica group per host,
local batch 4, its heartbeat bound KEEPALIVE as podrun's; its global batch shrinks 12 -> 8 with the quorum), measured
the same way from its steps.log (a step's own duration from its quorum to its commit); it runs from the peers' venv
(bench/install_peers.sh) and is left out, said so, without it. Full: 3 rounds; quick: 1 round.
`python -m bench.bench_inplace inplace|restart|torchft`: one run, its files kept in /tmp/binplace-*."""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_launch import ROOT, _kill, _podrun_args, _row, _sweep
from bench.rows import measured

RECIPE = str(ROOT / "recipes" / "resnet18_cifar10" / "train.py")
HOSTS, CUT, STEPS_BEFORE_CUT, STEPS = 3, "h3", 3, 10
KEEPALIVE = 1.0
MODES = ("restart", "inplace", "torchft")
TORCHFT_LOCAL_BATCH = 4            # 3 groups x 4 = the global batch 12 before the cut


def _records(rd: Path) -> list[dict]:
    try:
        return [json.loads(x) for x in (rd / "metrics.jsonl").read_text().splitlines() if x.strip()]
    except (OSError, ValueError):
        return []


def _steps(rd: Path) -> list[dict]:
    return [r for r in _records(rd) if r.get("kind") == "step"]


def cut_run(mode: str, tmp: str, port: int) -> dict:
    """One run (``mode`` "inplace", "restart" or "torchft") on 3 fresh hosts, h3 cut after 3 updates: seconds from
    the cut."""
    import subprocess

    from tests.harness import NetnsHosts

    d = Path(tmp) / f"bench-inplace-{mode}-{port}"
    d.mkdir(parents=True)
    marker = d.name
    if mode == "torchft":
        from bench.bench_elastic import peer_missing

        if (missing := peer_missing("torchft")) is not None:
            return {"mode": mode, "why": missing}
    with NetnsHosts(HOSTS) as hosts:
        if mode == "torchft":
            return _torchft_run(hosts, d, port)
        argv = _podrun_args(hosts, hosts.hosts, str(d / "runs"), port, "--run-id", "run", "--keepalive",
                            f"{KEEPALIVE:g}", "--global-batch", "12", "--elastic", "2", "--", hosts.python, RECIPE,
                            "--data", "synthetic", "--synthetic-size", "240", "--norm", "group", "--steps", str(STEPS),
                            "--eval-every", "0", "--threads", "1", "--quiet",
                            *(["--no-inplace"] if mode == "restart" else []))
        rd = d / "runs" / "run"
        log = open(d / "controller.log", "w")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        out: dict = {"mode": mode, "command": argv}
        try:
            deadline = time.time() + 300
            while len(_steps(rd)) < STEPS_BEFORE_CUT:
                if time.time() > deadline or proc.poll() is not None:
                    out["why"] = f"no {STEPS_BEFORE_CUT} steps on {HOSTS} hosts"
                    return out
                time.sleep(0.05)
            if mode == "restart":  # the zygotes the first attempt started must be up for the restart to use them
                socks = [rd / "zygote" / f"{h}.sock" for h in hosts.hosts]
                while not all(s.exists() for s in socks) and time.time() < deadline:
                    time.sleep(0.05)
            t_cut = time.time()
            hosts.isolate(CUT)
            try:
                proc.wait(timeout=240)
            except subprocess.TimeoutExpired:
                out["why"] = "the run did not end within 240 s of the cut"
                return out
            s = json.loads((rd / "summary.json").read_text())
            first = next((r for r in _steps(rd) if r["time"] > t_cut + KEEPALIVE), None)
            if s.get("exit_code") != 0 or first is None or not s.get("elastic", {}).get("replans"):
                out["why"] = f"exit {s.get('exit_code')}, no update after the cut or no re-plan"
                return out
            rp = s["elastic"]["replans"][0]
            out.update(exit_code=0, path=rp.get("path"), inplace_failed=rp.get("inplace_failed"),
                       detected_s=round(rp["lost_at"] - t_cut, 3),
                       training_again_s=round(first["time"] - first["step_seconds"] - t_cut, 3),
                       first_update_s=round(first["time"] - t_cut, 3), step_s=round(first["step_seconds"], 3),
                       run_training_after_s=rp.get("training_after_s"), breakdown=rp.get("breakdown"),
                       attempts=len(s["attempts"]))
            return out
        finally:
            _kill([proc])
            _sweep(hosts, hosts.hosts, marker)
            log.close()


def _torchft_run(hosts, d: Path, port: int) -> dict:
    """torchft on ``hosts`` (bench_elastic's way of starting it), h3 cut after 3 committed steps of 3 groups."""
    import shlex
    import subprocess

    from bench.bench_elastic import TORCHFT_PG_TIMEOUT, TORCHFT_SCRIPT, peers_dir
    from bench.bench_elastic import _steps as ft_steps

    q, names, procs, logs = shlex.quote, hosts.hosts, [], []
    light = (f"exec {q(str(peers_dir() / 'bin' / 'torchft_lighthouse'))} --min_replicas 2 --quorum_tick_ms 100 "
             f"--join_timeout_ms 10000 --heartbeat_timeout_ms {KEEPALIVE * 1000:.0f} --bind 0.0.0.0:{port}")
    args = [TORCHFT_SCRIPT, "--model", "resnet18", "--dir", str(d), "--batch", str(TORCHFT_LOCAL_BATCH),
            "--grad-accum", "1", "--samples", "240", "--sleep", "0", "--steps", str(STEPS + 10), "--marker", d.name,
            "--pg-timeout", str(TORCHFT_PG_TIMEOUT), "--min-replicas", "2"]
    out: dict = {"mode": "torchft", "command": [light]}

    def start(key: str, host: str, cmd: str) -> None:
        logs.append(open(d / f"{key}.log", "w"))
        procs.append(subprocess.Popen(hosts.ssh_argv(host, cmd), stdout=logs[-1], stderr=subprocess.STDOUT))

    try:
        start("lighthouse", names[0], light)
        for i, h in enumerate(names):
            cmd = (f"cd {q(str(ROOT))} && TORCHFT_LIGHTHOUSE=http://{names[0]}:{port} REPLICA_GROUP_ID={i} "
                   f"BENCH_HOST={h} exec {q(str(peers_dir() / 'bin' / 'python'))} -m torch.distributed.run "
                   f"--nnodes 1 --nproc-per-node 1 --master-addr {h} --master-port {port + 1} "
                   + " ".join(q(w) for w in args))
            out["command"].append(cmd)
            start(h, h, cmd)
        deadline = time.time() + 300
        while sum(1 for x in ft_steps(d) if x["world"] == HOSTS) < STEPS_BEFORE_CUT:
            if time.time() > deadline or any(p.poll() is not None for p in procs[1:3]):
                out["why"] = f"no {STEPS_BEFORE_CUT} steps of {HOSTS} groups"
                return out
            time.sleep(0.05)
        t_cut = time.time()
        hosts.isolate(CUT)
        deadline = t_cut + 240
        while (first := next((x for x in ft_steps(d) if x["t"] > t_cut and x["world"] < HOSTS), None)) is None:
            if time.time() > deadline or all(p.poll() is not None for p in procs[1:3]):
                out["why"] = "no step of the 2 groups left within 240 s of the cut"
                return out
            time.sleep(0.05)
        (d / "stop").touch()
        out.update(exit_code=0, path="torchft", training_again_s=round(first["t"] - first["step_seconds"] - t_cut, 3),
                   first_update_s=round(first["t"] - t_cut, 3), step_s=round(first["step_seconds"], 3),
                   global_batch_after=first["global_batch"])
        return out
    finally:
        _kill(procs)
        for pattern in (d.name, "torchft_lighthouse"):
            _sweep(hosts, names, pattern)
        for f in logs:
            f.close()


def run(quick: bool) -> list[dict]:
    rounds = 1 if quick else 3
    port = 28800 + (os.getpid() % 40) * 10
    res: dict[str, list[dict]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds):
            for mode in MODES:
                port += 10
                r = cut_run(mode, tmp, port)
                res[mode].append(r)
                print(json.dumps({k: v for k, v in r.items() if k != "command"}), file=sys.stderr)
    ok, unmeasured = measured(res)
    runs = "; ".join(f"{m} {[x.get('training_again_s') for x in res[m]]}" for m in MODES)
    note = (f"resnet18 recipe (GroupNorm, 32 px synthetic) on {HOSTS} fresh namespace hosts, global batch 12, "
            f"--elastic 2 --keepalive {KEEPALIVE:g}, {CUT} cut after {STEPS_BEFORE_CUT} updates; seconds from the cut "
            f"to the first update after it completed minus its own duration; interleaved; runs: {runs}{unmeasured}")
    if not ok["inplace"] or not ok["restart"]:
        return [_row("inplace_recovery", "podrun in place: cut -> training again", None, "s", note,
                     "podrun restart (--no-inplace)")]
    rows = [_row("inplace_recovery", "podrun in place: cut -> training again",
                 [x["training_again_s"] for x in ok["inplace"]], "s", note, "podrun restart (--no-inplace)",
                 [x["training_again_s"] for x in ok["restart"]])]
    if ok["torchft"]:
        from bench.bench_elastic import TORCHFT_PG_TIMEOUT

        rows.append(_row("inplace_recovery", "podrun in place: cut -> training again",
                         [x["training_again_s"] for x in ok["inplace"]], "s",
                         note + f"; torchft: its lighthouse's heartbeat bound {KEEPALIVE:g} s, its gloo timeout "
                         f"{TORCHFT_PG_TIMEOUT:g} s, global batch 12 -> "
                         f"{ok['torchft'][0]['global_batch_after']} after the cut",
                         "torchft 0.2.0 (lighthouse + Manager, gloo)",
                         [x["training_again_s"] for x in ok["torchft"]]))
    parts = {k: statistics.median([x["breakdown"][k] for x in ok["inplace"] if x.get("breakdown")
                                   and x["breakdown"].get(k) is not None] or [float("nan")])
             for k in ("detection", "abort", "reform", "reshard", "first_step")}
    rows.append({"benchmark": "inplace_breakdown", "subject": "podrun in place (its summary.json)",
                 "value": statistics.median([x["run_training_after_s"] for x in ok["inplace"]]), "peer": None,
                 "peer_value": None, "ratio": None, "unit": "s",
                 "note": "loss declared -> first update completed, medians: " +
                         ", ".join(f"{k} {v:.2f}" for k, v in parts.items()) +
                         f"; the step itself {statistics.median([x['step_s'] for x in ok['inplace']]):.2f} s"})
    return rows


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.path.insert(0, str(ROOT))
    if len(sys.argv) > 1 and sys.argv[1] in MODES:
        print(json.dumps(cut_run(sys.argv[1], tempfile.mkdtemp(prefix="binplace-"), 28000 + os.getpid() % 400),
                         default=str, indent=1))
