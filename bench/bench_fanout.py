"""Fan-out at scale, simulated: the real ssh transport's preflight + start on 256-2048 modelled hosts.

The model (stated in RESULTS.md): an ssh handshake takes HANDSHAKE s and holds one of podrun's
--max-concurrency slots; opening a channel on an established connection takes RTT s; a remote
process (the instance agent) takes START s to start; with preflight the agents start held, report,
and spawn their workers one RTT after the controller's go. Only the network and the
remote hosts are modelled: the thread pools, the handshake semaphore and the per-host connection
reuse are podrun's own code (SSHTransport). Peers are computed from the same model:
a sequential ssh loop, a pdsh-style window of 32 that holds its slot for the whole command, and an
mpirun-style launch tree of fan-out 32 (one level = handshake + process start).
"""
from __future__ import annotations

import math
import tempfile
import threading
import time

HANDSHAKE, RTT, START = 0.050, 0.001, 1.0


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


def _model_transport(request):
    import platform

    import podrun
    from podrun.launch.transports.ssh import SSHTransport

    facts = {"podrun": podrun.__version__, "python": platform.python_version(), "ports": [], "ports_busy": []}

    class Client:            # what the rest of the transport needs of a connected client
        def close(self):
            pass

    class ModelSSHTransport(SSHTransport):
        started: list[float] = []

        def _open(self, host):
            with self.handshakes:                 # the real bound on handshakes in flight
                time.sleep(HANDSHAKE)
            with self.lock:
                self.clients[host] = Client()
            return self.clients[host]

        def _start_one(self, inst, hold=False):
            self._connect(inst.host)
            time.sleep(RTT)                        # open a channel, exec; the agent starts remotely
            up = time.perf_counter() + START
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
                self.transport.started.append(time.perf_counter() + RTT)

        def terminate(self):
            pass

        kill = close = terminate

    return ModelSSHTransport(request)


def simulate(hosts: int, preflight: bool) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        t = _model_transport(_request(hosts, tmp))
        t0 = time.perf_counter()
        if preflight:
            problems = t.preflight()
            assert not problems, problems[:3]
        t.start()
        return max(t.started) - t0


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
    return rows
