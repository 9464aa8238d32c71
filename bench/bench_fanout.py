"""Fan-out at scale, simulated: the real ssh transport's preflight + start on 256-2048 modelled hosts.

The model (stated in RESULTS.md): an ssh handshake takes HANDSHAKE s and holds one of podrun's
--max-concurrency slots; opening a channel on an established connection takes RTT s; a remote
process (the instance agent) takes START s to start; with preflight the agents start held, report,
and spawn their workers one RTT after the controller's go. Only the network and the
remote hosts are modelled: the thread pools, the handshake semaphore and the per-host connection
reuse are podrun's own code (SSHTransport). Peers are computed from the same model:
a sequential ssh loop, a pdsh-style window of 32 that holds its slot for the whole command, and an
mpirun-style launch tree of fan-out 32 (one level = handshake + process start).

With a scale run kept (bench/results/scale-*.json, `python -m bench --keep scale`), the constants are that run's
measured figures instead (``measured()``): the controller's CPU per host at launch (a least-squares line over
the run's sizes) is spent on one controller core, host after host; the rest of the launch (CLI, plan, the
remote Python start) is paid once, the hosts starting in parallel; podrun's own thread pools at the size are
run for real (the modelled transport with no sleep). The heartbeat cost per host per second gives where one
controller core saturates in the steady state. Launches through Open MPI's tree inside a Grid Engine job (podrun
--transport mpirun and mpirun itself, daemons started by qrsh) are projected with ``tree_model``: the root's CPU
per host for the first level, then the measured remote start once per level. Where agents join (one a node,
started by srun's step or Open MPI's tree), ``joined_model`` projects a launch from its named, measured parts: podrun's
own start, the engine's launch of one agent a node (the engine's own fit), an agent's start, the controller's serial
CPU per joined host and a worker's start.
"""
from __future__ import annotations

import json
import math
import tempfile
import threading
import time
from pathlib import Path

from bench.rows import row

HANDSHAKE, RTT, START = 0.050, 0.001, 1.0
RESULTS = Path(__file__).resolve().parent / "results"
PROJECT = ((512, 4), (2048, 1))   # (hosts, workers per host) the measured model projects: ABCI's 512 x 4
TREE_RADIX = 64            # Open MPI's daemons: each level of its launch tree starts up to this many


def _request(hosts: int, tmp: str):
    from podrun.launch.request import InstanceLaunch, LaunchRequest, SSHOptions
    from podrun.plan import make_plan
    from podrun.specs import load_cluster

    names = tuple(f"n{i:04d}" for i in range(hosts))
    plan = make_plan(load_cluster("local").with_hosts(names, 1), None)
    cfg = f"{tmp}/ssh_config"
    open(cfg, "w").close()
    return LaunchRequest(run_id="sim", run_dir=tmp, plan=plan, plan_path=f"{tmp}/plan.json", command=("true",),
                         python="python3", workdir=tmp, master_addr=names[0], master_port=29500, transport="ssh",
                         instances=tuple(InstanceLaunch(i, h) for i, h in enumerate(names)),
                         ssh=SSHOptions(config_path=cfg))


def _fit(points):
    """Least-squares line (intercept, slope) through [(x, y), ...]."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx > 0 else 0.0
    return my - slope * mx, slope


def scale_runs() -> list[Path]:
    """The kept scale runs (bench/results/scale-*.json), newest first: each subject's figures come from the newest
    that measured it at two sizes or more."""
    return sorted(RESULTS.glob("scale-*.json"), reverse=True)


def _raw(path: Path) -> list[dict]:
    record = json.loads(path.read_text())
    return next((r["raw"] for r in record["rows"] if r.get("benchmark") == "scale raw"), [])


def measured(path: Path, subject: str = "podrun ssh (OpenSSH)", per_host: int = 4) -> dict | None:
    """Per-host costs of ``subject`` at ``per_host`` workers a host, fitted over the scale run's sizes (least
    squares): cpu_per_host_s and cpu_fixed_s (the launcher's CPU at every rank running), heartbeat_cpu_per_host
    (CPU s per host per s over the idle window), start_s (launch to every rank running at the smallest size less
    that size's per-host CPU: what the launch costs besides the controller's serial work, at least 0), and
    up_largest_s (the median at the largest size); a batch job's launch from the job's start (``job_up_s``) where the
    run has it; None when the run has fewer than two sizes of it."""
    runs = [(e["hosts"], f) for e in _raw(path) if e["subject"] == subject and e["per_host"] == per_host
            for f in e["runs"]]
    sizes = sorted({n for n, _ in runs})
    if len(sizes) < 2:
        return None
    cpu0, cpu = _fit([(n, f["cpu_up_s"]) for n, f in runs])
    _, idle = _fit([(n, f["idle_cpu_frac"]) for n, f in runs])
    up = lambda f: f["up_s"] if f.get("job_up_s") is None else f["job_up_s"]   # noqa: E731 - a job's: from its start
    first = [up(f) for n, f in runs if n == sizes[0]]
    last = [up(f) for n, f in runs if n == sizes[-1]]
    start = max(0.0, sorted(first)[len(first) // 2] - cpu * sizes[0])
    return {"subject": subject, "per_host": per_host, "sizes": sizes, "cpu_per_host_s": cpu, "cpu_fixed_s": cpu0,
            "heartbeat_cpu_per_host": idle, "start_s": start, "up_largest_s": sorted(last)[len(last) // 2],
            "file": path.name}


def _model_transport(request, cost: dict | None = None):
    import platform

    import podrun
    from podrun.launch.transports.ssh import SSHTransport

    from podrun.wire.probe import Facts

    facts = Facts(podrun=podrun.__version__, python=platform.python_version())

    class Client:            # what the rest of the transport needs of a connected client
        def close(self):
            pass

    handshake = HANDSHAKE if cost is None else cost["cpu"]
    start = START if cost is None else cost["start"]
    rtt = RTT if cost is None else 0.0
    core = threading.Lock() if cost is not None else None     # the controller core the measured CPU is spent on

    class ModelSSHTransport(SSHTransport):
        started: list[float] = []

        def _open(self, host):
            with self.handshakes:                 # the real bound on handshakes in flight
                if core is None:
                    time.sleep(handshake)
                else:
                    with core:
                        time.sleep(handshake)
            with self.lock:
                self.clients[host] = Client()
            return self.clients[host]

        def _start_one(self, inst, hold=False):
            self._connect(inst.host)
            time.sleep(rtt)                        # open a channel, exec; the agent starts remotely
            up = time.perf_counter() + start
            if not hold:                           # it spawns its workers as soon as it is up
                with self.lock:
                    self.started.append(up)
            return ModelHandle(self, up)

    class ModelHandle:       # a held agent: reports its facts once up, starts workers one RTT after the go
        def __init__(self, transport, up):
            self.transport, self.up = transport, up

        def wait_probe(self, timeout):
            time.sleep(max(0.0, self.up - time.perf_counter()))
            return facts

        def go(self):
            with self.transport.lock:
                self.transport.started.append(time.perf_counter() + rtt)

        def terminate(self):
            pass

        kill = close = terminate

    return ModelSSHTransport(request)


def simulate(hosts: int, preflight: bool, cost: dict | None = None) -> float:
    """Seconds from start to every modelled agent's workers started; ``cost`` ({"cpu": s per host, "start": s}):
    the model's constants instead of HANDSHAKE and START, the handshakes' sleeps on one lock (one core)."""
    with tempfile.TemporaryDirectory() as tmp:
        t = _model_transport(_request(hosts, tmp), cost)
        t0 = time.perf_counter()
        if preflight:
            problems = t.preflight()
            assert not problems, problems[:3]
        t.release(t.start())               # as the supervisor does: held agents go once it listens
        return max(t.started) - t0


def measured_model(hosts: int, cost: dict) -> float:
    """The measured model with preflight: podrun's own threads and pools at this size (the modelled transport
    with no sleep, run here), plus the controller's CPU for every host spent on one core, plus the rest of the
    launch (the remote start, once: the hosts start in parallel)."""
    own = simulate(hosts, preflight=True, cost={"cpu": 0.0, "start": 0.0})
    return own + cost["cpu"] * hosts + cost["start"]


def tree_levels(hosts: int, radix: int = TREE_RADIX) -> int:
    return max(1, math.ceil(math.log(hosts, radix) - 1e-9))


def _newest(paths: list[Path], subject: str, k: int) -> dict | None:
    return next((f for f in (measured(p, subject, k) for p in paths) if f is not None), None)


def projected(paths: list[Path], subject: str, peer: str = "mpirun (Open MPI) tree") -> list[dict]:
    """The measured model of ``subject`` at PROJECT's sizes (each from the fit at its workers per host), beside
    ``peer``'s tree launch scaled from its largest measured size by tree levels, and where one core saturates."""
    rows = []
    for hosts, k in PROJECT:
        fit, peer_fit = _newest(paths, subject, k), _newest(paths, peer, k)
        if fit is None:
            continue
        sim = measured_model(hosts, {"cpu": max(0.0, fit["cpu_per_host_s"]), "start": fit["start_s"]})
        peer_s = None
        if peer_fit is not None:
            peer_s = peer_fit["up_largest_s"] * tree_levels(hosts) / tree_levels(peer_fit["sizes"][-1])
        rows.append(row("projected launch from measured costs", f"{subject} preflight + start, {hosts} hosts x {k}",
                        sim, "s", f"fitted from bench/results/{fit['file']} ({k} per host, sizes "
                        f"{'/'.join(map(str, fit['sizes']))}): controller CPU {fit['cpu_per_host_s'] * 1000:.1f} "
                        f"ms/host spent on one core, the rest {fit['start_s']:.2f} s; the peer: its "
                        f"{peer_fit['sizes'][-1] if peer_fit else '-'}-host median x tree levels (radix {TREE_RADIX})",
                        None if peer_s is None else f"{peer}, {hosts} hosts x {k}", peer_s))
        if k != PROJECT[0][1]:
            continue
        hb, cpu = fit["heartbeat_cpu_per_host"], fit["cpu_per_host_s"]
        rows.append({"benchmark": "projected controller saturation",
                     "subject": f"{subject}: hosts whose heartbeats fill one core",
                     "value": round(1.0 / hb) if hb > 0 else None, "peer": None, "peer_value": None, "ratio": None,
                     "unit": "hosts", "note": f"steady state {hb * 100 * 100:.3f} % of a core per 100 hosts "
                     f"({hb * 1e6:.0f} us of CPU per host per s), fitted from bench/results/{fit['file']}"})
        rows.append({"benchmark": "projected controller saturation",
                     "subject": f"{subject}: hosts one core launches per second",
                     "value": round(1.0 / cpu, 1) if cpu > 0 else None, "peer": None, "peer_value": None,
                     "ratio": None, "unit": "hosts/s",
                     "note": f"1 / controller CPU per host at launch ({cpu * 1000:.1f} ms); 512 hosts: "
                     f"{fit['cpu_fixed_s'] + cpu * 512:.1f} s of one core"})
    return rows


def tree_model(hosts: int, fit: dict) -> float:
    """A launch through an engine's tree (Open MPI's daemons started by ssh or qrsh; srun's step through the nodes'
    slurmd): the root starts the first level, up to TREE_RADIX hosts, each costing the launcher's CPU per host on one
    core; each level then costs the rest of the launch at the smallest measured size (the remote start, once a
    level: a level's hosts start in parallel)."""
    return max(0.0, fit["cpu_per_host_s"]) * min(hosts, TREE_RADIX) + fit["start_s"] * tree_levels(hosts)


#: the inputs of ``joined_model`` and the scale run's figure (bench/bench_scale.py, a median at the podrun subject's
#: largest size) each is read from: podrun's own start up to its engine's launch, one agent's start (its CPU at every
#: rank running: on a node of its own it runs alone), the controller's serial CPU per joined host, one worker's start
#: (its CPU at its up stamp, before it waits for rank 0)
JOINED_INPUTS = (("podrun_start_s", "engine_start_s", 1.0), ("agent_start_s", "agent_cpu_up_s", 1.0),
                 ("join_cpu_per_host_s", "join_ms", 0.001), ("worker_start_s", "worker_start_cpu_s", 1.0))


def joined_model(hosts: int, costs: dict, engine_fit: dict) -> float:
    """Job script to every rank running with agents that join: podrun's own start; the engine (srun's step, Open
    MPI's tree) starting one agent a node, as ``tree_model`` projects the engine from its own measured launch
    (``engine_fit``); one agent's start (the nodes start theirs in parallel); the controller's serial CPU for every
    joined host; one worker's start (a node's workers start in parallel on its own cores)."""
    return (costs["podrun_start_s"] + tree_model(hosts, engine_fit) + costs["agent_start_s"]
            + costs["join_cpu_per_host_s"] * hosts + costs["worker_start_s"])


def joined_costs(path: Path, subject: str, per_host: int) -> dict | None:
    """JOINED_INPUTS from the scale run at ``path``: ``subject``'s medians at its largest size with ``per_host``
    workers a host (and ``file``, ``hosts``); None when the run lacks any (a run before agents joined)."""
    runs = [(e["hosts"], e["runs"]) for e in _raw(path) if e["subject"] == subject and e["per_host"] == per_host]
    if not runs:
        return None
    hosts, figs = max(runs, key=lambda x: x[0])
    out = {"file": path.name, "hosts": hosts}
    for name, key, scale in JOINED_INPUTS:
        vals = sorted(f[key] for f in figs if f.get(key) is not None)
        if not vals:
            return None
        out[name] = vals[len(vals) // 2] * scale
    return out


def projected_tree(paths: list[Path], subject: str, peer: str) -> list[dict]:
    """``subject`` and ``peer``, both launching through the engine's tree, at PROJECT's sizes: the peer with
    ``tree_model`` from its own fit; the subject, where a run measured its joined agents' costs, with
    ``joined_model`` (its engine: the peer's fit), else with ``tree_model`` from its own fit (an agent per rank)."""
    rows = []
    for hosts, k in PROJECT:
        fit, peer_fit = _newest(paths, subject, k), _newest(paths, peer, k)
        costs = next((c for c in (joined_costs(p, subject, k) for p in paths) if c is not None), None)
        how = lambda f: (f"{f['cpu_per_host_s'] * 1000:.1f} ms/host x {min(hosts, TREE_RADIX)} + "  # noqa: E731
                         f"{f['start_s']:.2f} s x {tree_levels(hosts)} level(s)")
        peer_s = None if peer_fit is None else tree_model(hosts, peer_fit)
        if costs is not None and peer_fit is not None:
            value = joined_model(hosts, costs, peer_fit)
            note = (f"agents that join, from bench/results/{costs['file']} ({costs['hosts']} hosts x {k}, medians): "
                    + ", ".join(f"{name} {costs[name] * 1000:.1f} ms" + (f" x {hosts}" if "per_host" in name else "")
                                for name, _key, _scale in JOINED_INPUTS)
                    + f"; the engine's launch of one agent a node: the peer's, {how(peer_fit)}, fitted from "
                      f"bench/results/{peer_fit['file']} (sizes {'/'.join(map(str, peer_fit['sizes']))})")
        elif fit is not None:
            value = tree_model(hosts, fit)
            note = (f"fitted from bench/results/{fit['file']} ({k} per host, sizes "
                    f"{'/'.join(map(str, fit['sizes']))}): {how(fit)}" + (f"; the peer {how(peer_fit)}" if peer_fit
                                                                          else ""))
        else:
            continue
        rows.append(row("projected launch from measured costs (tree)", f"{subject}, {hosts} hosts x {k}", value, "s",
                        note + f"; launcher CPU per host at the root, a level's remote start at the smallest size "
                               f"(radix {TREE_RADIX})", None if peer_s is None else f"{peer}, {hosts} hosts x {k}",
                        peer_s))
    return rows


def run(quick: bool) -> list[dict]:
    sizes = (256, 2048) if quick else (256, 1024, 2048)
    rows = []
    for h in sizes:
        launch = simulate(h, preflight=False)
        full = simulate(h, preflight=True)
        models = {
            "sequential ssh loop": h * (HANDSHAKE + RTT + START),
            "pdsh-style window 32": math.ceil(h / 32) * (HANDSHAKE + RTT + START),
            "launch tree, fan-out 32": math.ceil(math.log(h, 32) - 1e-9) * (HANDSHAKE + START),
        }
        for peer, v in models.items():
            rows.append({"benchmark": f"simulated fan-out, {h} hosts", "subject": "podrun ssh start",
                         "value": round(launch, 3), "peer": peer, "peer_value": round(v, 3),
                         "ratio": round(launch / v, 3), "unit": "s", "note": "without preflight"})
        rows.append({"benchmark": f"simulated fan-out, {h} hosts", "subject": "podrun ssh preflight + start",
                     "value": round(full, 3), "peer": None, "peer_value": None, "ratio": None, "unit": "s",
                     "note": f"handshake {HANDSHAKE * 1000:g} ms, process start {START:g} s, threads {threading.active_count()}"})
    paths = scale_runs()
    if paths:
        for subject, peer in (("podrun ssh (OpenSSH)", "mpirun (Open MPI) tree"),
                              ("podrun ssh (paramiko)", "mpirun (Open MPI) tree"),
                              ("podrun ssh (OpenSSH), kex curve25519", "mpirun (Open MPI) tree, kex curve25519")):
            rows += projected(paths, subject, peer)
        rows += projected_tree(paths, "podrun mpirun, Grid Engine qrsh", "mpirun (Open MPI), Grid Engine qrsh")
        rows += projected_tree(paths, "podrun srun", "srun")
    return rows
