"""IPv6-only hosts and the data-interface question (issue 18, B5/B6): what each costs against its peer.

- ``podrun launch`` of a 2-host gloo all-reduce (tests/launch/scripts/torchrun_allreduce.py) on IPv6-only
  namespace hosts (NetnsHosts(ipv6_only=True): ssh, store and gloo over IPv6) against the same launch on IPv4
  hosts (NetnsHosts(2)), both up at once and interleaved round by round.
- The question an elastic re-plan asks a new master host with --data-interface (its address on the interface:
  ``interface_address``, one remote Python start over ssh) against a bare ``ssh HOST true`` to the same host
  with the same config, interleaved, on the two-network topology (NetnsHosts(2, data_network=True)).
Wall time, medians.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.rows import row

ALLREDUCE = str(Path(__file__).resolve().parent.parent / "tests" / "launch" / "scripts" / "torchrun_allreduce.py")


def _wall(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _launch(hosts, tmp: str, port: int):
    argv = [sys.executable, "-m", "podrun", "launch", "--hosts", ",".join(hosts.hosts), "--devices-per-host", "1",
            "--transport", "ssh", "--ssh-config", hosts.ssh_config_path, "--python", hosts.python,
            "--runs-dir", f"{tmp}/runs", "--master-port", str(port), "--", sys.executable, ALLREDUCE]

    def go():
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        if cp.returncode != 0 or cp.stdout.count("sum=3") != 2:
            raise RuntimeError(f"launch on {hosts!r} failed ({cp.returncode}): {(cp.stderr or cp.stdout)[-800:]}")
    return go


def _row(subject, walls, peer, peer_walls, rounds, unit="s wall (median)"):
    return row("addresses", subject, walls, unit, f"{rounds} interleaved rounds after one warm-up", peer, peer_walls)


def run(quick: bool) -> list[dict]:
    from podrun.launch.options import LaunchOptions, TransportOptions
    from podrun.launch.request import SSHOptions
    from podrun.launch.run import build_request
    from podrun.launch.transports.base import get_transport
    from podrun.cli.options import resolve_plan
    from tests.harness import NetnsHosts

    rounds = 3 if quick else 7
    rows = []
    with NetnsHosts(2, ipv6_only=True) as v6, NetnsHosts(2) as v4, tempfile.TemporaryDirectory() as tmp:
        subjects = {"v6": _launch(v6, tmp, 29660), "v4": _launch(v4, tmp, 29670)}
        for fn in subjects.values():
            fn()
        res = {k: [] for k in subjects}
        for _ in range(rounds):
            for k, fn in subjects.items():
                res[k].append(_wall(fn))
        rows.append(_row("podrun launch, 2-host gloo all-reduce, IPv6-only hosts", res["v6"],
                         "the same on IPv4 hosts", res["v4"], rounds))
    with NetnsHosts(2, data_network=True) as hosts:
        plan = resolve_plan(None, hosts_opt=",".join(hosts.hosts), devices_per_host=1, environ={})[0]
        ssh = SSHOptions(config_path=hosts.ssh_config_path, client="openssh")
        req = build_request(plan, ["true"], transport="ssh", data_interface="eth1",
                            runs_dir=f"{tempfile.gettempdir()}/bench-addresses-runs",
                            options=LaunchOptions(transports=TransportOptions(python=hosts.python, ssh=ssh)))
        transport = get_transport("ssh")(req)
        want = hosts.data_addresses["h2"]

        def ask():
            got = transport.interface_address("h2", "eth1")
            if got != want:
                raise RuntimeError(f"h2's eth1 address: {got}, expected {want}")

        def bare():
            subprocess.run(["ssh", "-F", hosts.ssh_config_path, "h2", "true"], check=True, capture_output=True,
                           timeout=60)
        try:
            ask(), bare()
            walls = {"ask": [], "bare": []}
            for _ in range(rounds * 2):
                walls["ask"].append(_wall(ask))
                walls["bare"].append(_wall(bare))
        finally:
            transport.close()
        rows.append(_row("the new master's address on --data-interface (re-plan or start)", walls["ask"],
                         "ssh HOST true", walls["bare"], rounds * 2))
    return rows


if __name__ == "__main__":
    from bench.rows import run_alone

    run_alone(run)
