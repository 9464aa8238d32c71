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
the run's sizes) is spent on one controller core per handshake (a lock: the core is the bound, not the slots),
START is the line's fixed part (CLI, plan, the remote Python start), and the heartbeat cost per host per
second gives where one controller core saturates in the steady state. The model's sleeps run TIME_SCALE times
faster than the figures they stand for, and the results are scaled back.
"""
from __future__ import annotations

import json
import math
import tempfile
import threading
import time
from pathlib import Path

HANDSHAKE, RTT, START = 0.050, 0.001, 1.0
RESULTS = Path(__file__).resolve().parent / "results"
TIME_SCALE = 10.0          # the measured model's sleeps run this much faster; its results are scaled back
PROJECT = ((512, 4), (2048, 1))   # (hosts, workers per host) the measured model projects: ABCI's 512 x 4


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


def latest_scale(path: str | None = None) -> Path | None:
    """The scale run the model takes its figures from: ``path``, or the newest kept bench/results/scale-*.json."""
    if path is not None:
        return Path(path)
    found = sorted(RESULTS.glob("scale-*.json"))
    return found[-1] if found else None


def measured(path: Path, subject: str = "podrun ssh (OpenSSH)", per_host: int = 4) -> dict | None:
    """Per-host costs of ``subject`` at ``per_host`` workers a host, fitted over the scale run's sizes:
    cpu_s/host and cpu_fixed_s (controller CPU at every rank running), up_s/host and up_fixed_s (launch to
    every rank running), heartbeat CPU s per host per s (the idle window); None when the run has no such runs."""
    record = json.loads(path.read_text())
    raw = next((r["raw"] for r in record["rows"] if r.get("benchmark") == "scale raw"), [])
    runs = [(e["hosts"], f) for e in raw if e["subject"] == subject and e["per_host"] == per_host for f in e["runs"]]
    if len({n for n, _ in runs}) < 2:
        return None
    cpu0, cpu = _fit([(n, f["cpu_up_s"]) for n, f in runs])
    up0, up = _fit([(n, f["up_s"]) for n, f in runs])
    _, idle = _fit([(n, f["idle_cpu_frac"]) for n, f in runs])
    return {"subject": subject, "per_host": per_host, "sizes": sorted({n for n, _ in runs}), "cpu_per_host_s": cpu,
            "cpu_fixed_s": cpu0, "up_per_host_s": up, "up_fixed_s": up0, "heartbeat_cpu_per_host": idle,
            "file": path.name}


def _model_transport(request, cost: dict | None = None):
    import platform

    import podrun
    from podrun.launch.transports.ssh import SSHTransport

    facts = {"podrun": podrun.__version__, "python": platform.python_version(), "ports": [], "ports_busy": []}

    class Client:            # what the rest of the transport needs of a connected client
        def close(self):
            pass

    handshake = HANDSHAKE if cost is None else cost["cpu"] / TIME_SCALE
    start = START if cost is None else cost["start"] / TIME_SCALE
    rtt = RTT if cost is None else RTT / TIME_SCALE
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
    the measured model, its sleeps TIME_SCALE times faster, the result scaled back."""
    with tempfile.TemporaryDirectory() as tmp:
        t = _model_transport(_request(hosts, tmp), cost)
        t0 = time.perf_counter()
        if preflight:
            problems = t.preflight()
            assert not problems, problems[:3]
        t.start()
        return (max(t.started) - t0) * (1.0 if cost is None else TIME_SCALE)


def projected(fit: dict, mpirun: dict | None) -> list[dict]:
    """The measured model at PROJECT's sizes, beside mpirun's own line at the same size, and where one core
    saturates."""
    rows = []
    note = (f"fitted from bench/results/{fit['file']} ({fit['subject']}, {fit['per_host']} per host, sizes "
            f"{'/'.join(map(str, fit['sizes']))}): controller CPU {fit['cpu_per_host_s'] * 1000:.1f} ms/host on "
            f"one core, fixed part {fit['up_fixed_s']:.2f} s")
    for hosts, k in PROJECT:
        sim = simulate(hosts, preflight=True, cost={"cpu": fit["cpu_per_host_s"], "start": fit["up_fixed_s"]})
        peer = None if mpirun is None else mpirun["up_fixed_s"] + mpirun["up_per_host_s"] * hosts
        rows.append({"benchmark": "projected launch from measured costs", "subject":
                     f"podrun ssh preflight + start, {hosts} hosts x {k}", "value": round(sim, 3),
                     "peer": None if peer is None else f"mpirun tree, line fitted at {hosts} hosts",
                     "peer_value": None if peer is None else round(peer, 3),
                     "ratio": None if peer is None else round(sim / peer, 3), "unit": "s", "note": note})
    hb = fit["heartbeat_cpu_per_host"]
    rows.append({"benchmark": "projected controller saturation", "subject": "hosts at which heartbeats fill one core",
                 "value": round(1.0 / hb) if hb > 0 else None, "peer": None, "peer_value": None, "ratio": None,
                 "unit": "hosts", "note": f"heartbeat CPU {hb * 100 * 100:.3f} % of a core per 100 hosts "
                 f"({hb * 1e6:.0f} us per host per s), fitted from bench/results/{fit['file']}"})
    rows.append({"benchmark": "projected controller saturation", "subject": "hosts per second one core can launch",
                 "value": round(1.0 / fit["cpu_per_host_s"], 1) if fit["cpu_per_host_s"] > 0 else None,
                 "peer": None, "peer_value": None, "ratio": None, "unit": "hosts/s",
                 "note": f"1 / controller CPU per host at launch ({fit['cpu_per_host_s'] * 1000:.1f} ms); at 512 "
                 f"hosts {fit['cpu_fixed_s'] + fit['cpu_per_host_s'] * 512:.1f} s of one core"})
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
    path = latest_scale()
    if path is not None:
        for subject in ("podrun ssh (OpenSSH)", "podrun ssh (paramiko)"):
            fit = measured(path, subject)
            if fit is not None:
                rows += projected(fit, measured(path, "mpirun (Open MPI) tree"))
    return rows
