"""Launch benchmarks on real OpenSSH hosts: launch to first all_reduce (podrun vs torchrun-over-ssh vs
mpirun), teardown after a worker failure, and lost-host detection after a link cut."""
from __future__ import annotations

import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "tests" / "launch" / "scripts" / "torchrun_allreduce.py")
PODRUN = [sys.executable, "-m", "podrun"]


def _row(benchmark, subject, values, unit, note, peer=None, peer_values=None):
    v = statistics.median(values)
    pv = statistics.median(peer_values) if peer_values else None
    return {"benchmark": benchmark, "subject": subject, "value": round(v, 4), "peer": peer,
            "peer_value": None if pv is None else round(pv, 4),
            "ratio": None if not pv else round(v / pv, 3), "unit": unit, "note": note}


def _podrun_args(hosts, names, runs, port, *extra):
    return [*PODRUN, "launch", "--hosts", ",".join(names), "--devices-per-host", "1", "--transport", "ssh",
            "--ssh-config", hosts.ssh_config_path, "--python", hosts.python, "--runs-dir", runs,
            "--master-port", str(port), *extra]


def podrun_allreduce(hosts, names, runs, port) -> float:
    t0 = time.perf_counter()
    cp = subprocess.run([*_podrun_args(hosts, names, runs, port), "--", sys.executable, SCRIPT],
                        capture_output=True, text=True, timeout=120)
    dt = time.perf_counter() - t0
    assert cp.returncode == 0 and cp.stdout.count("ALLREDUCE") == len(names), cp.stderr[-2000:]
    return dt


def podrun_true(hosts, names, runs, port) -> float:
    """podrun's own cost: preflight + fan-out + agents + `true` + teardown, no torch import."""
    t0 = time.perf_counter()
    cp = subprocess.run([*_podrun_args(hosts, names, runs, port), "--", "true"], capture_output=True, text=True,
                        timeout=60)
    dt = time.perf_counter() - t0
    assert cp.returncode == 0, cp.stderr[-2000:]
    return dt


def ssh_true(hosts, names) -> float:
    """OpenSSH `ssh h true` to every host in parallel: the floor for any ssh fan-out."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen(hosts.ssh_argv(h, "true")) for h in names]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    return time.perf_counter() - t0


def torchrun_allreduce(hosts, names, port) -> float:
    """torchrun with c10d rendezvous, started with OpenSSH on every host in parallel (what users do)."""
    n = len(names)
    cmd = (f"cd {shlex.quote(str(ROOT))} && exec {shlex.quote(hosts.python)} -m torch.distributed.run "
           f"--nnodes {n} --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint {names[0]}:{port} "
           f"--rdzv-id bench{port} {shlex.quote(SCRIPT)}")
    t0 = time.perf_counter()
    procs = [subprocess.Popen(hosts.ssh_argv(h, cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for h in names]
    outs = [p.communicate(timeout=120) for p in procs]
    dt = time.perf_counter() - t0
    assert all(p.returncode == 0 for p in procs) and sum(o[0].count("ALLREDUCE") for o in outs) == n, outs
    return dt


def mpirun_allreduce(hosts, names, port) -> float:
    """Open MPI (PyPI wheel) mpirun over ssh; each rank maps OMPI_COMM_WORLD_* to torchrun's names."""
    n = len(names)
    wrapper = (f"RANK=$OMPI_COMM_WORLD_RANK WORLD_SIZE=$OMPI_COMM_WORLD_SIZE LOCAL_RANK=0 "
               f"MASTER_ADDR={names[0]} MASTER_PORT={port} exec {shlex.quote(hosts.python)} {shlex.quote(SCRIPT)}")
    argv = ["mpirun", "--allow-run-as-root", "-np", str(n), "--host", ",".join(f"{h}:1" for h in names),
            "--map-by", "ppr:1:node", "--bind-to", "none", "--prefix", sys.prefix,
            "--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_args", f"-F {hosts.ssh_config_path}",
            "/bin/sh", "-c", wrapper]
    t0 = time.perf_counter()
    cp = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=str(ROOT))
    dt = time.perf_counter() - t0
    assert cp.returncode == 0 and cp.stdout.count("ALLREDUCE") == n, (cp.stdout + cp.stderr)[-2000:]
    return dt


def teardown(hosts, runs, port, tmp) -> float:
    """4 hosts x 1 worker; rank 2 records its time and exits 3: seconds until podrun has ended every process."""
    stamp = Path(tmp) / f"fail-{port}"
    m = f"bench-teardown-{port}"
    body = (f"sleep 1; if [ $RANK = 2 ]; then {shlex.quote(sys.executable)} -c 'import time; "
            f"print(time.time())' > {stamp}; exit 3; fi; sleep 60 # {m}")
    cp = subprocess.run([*_podrun_args(hosts, hosts.hosts, runs, port), "--", "sh", "-c", body],
                        capture_output=True, text=True, timeout=60)
    t_end = time.time()
    assert cp.returncode == 3, cp.stderr[-2000:]
    left = {h: hosts.processes(h, m) for h in hosts.hosts if hosts.processes(h, m)}
    assert not left, left
    return t_end - float(stamp.read_text())


def lost_host(make_hosts, runs, port) -> float:
    """3 fresh hosts; cut h2's link mid-run: seconds until podrun has ended the run (default --keepalive 5)."""
    with make_hosts(3) as hosts:
        p = subprocess.Popen([*_podrun_args(hosts, hosts.hosts, runs, port), "--", "sh", "-c", "echo up; sleep 60"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen = 0
        while seen < 3:
            line = p.stdout.readline()
            assert line, p.stderr.read()
            seen += "up" in line
        t0 = time.perf_counter()
        hosts.isolate("h2")
        p.wait(timeout=60)
        dt = time.perf_counter() - t0
        err = p.stderr.read()
        assert p.returncode == 255 and "h2" in err, err
        return dt


def run(quick: bool) -> list[dict]:
    from tests.harness import NetnsHosts

    repeats = 3 if quick else 7
    rows = []
    port = 29900 + (os.getpid() % 50) * 2
    with tempfile.TemporaryDirectory() as tmp, NetnsHosts(4) as hosts:
        runs = os.path.join(tmp, "runs")
        times: dict[tuple[str, int], list[float]] = {}
        failures: dict[str, list] = {}
        for _ in range(repeats):
            for n in (1, 2, 4):
                names = hosts.hosts[:n]
                for name, f in (("podrun", lambda: podrun_allreduce(hosts, names, runs, port)),
                                ("torchrun", lambda: torchrun_allreduce(hosts, names, port)),
                                ("mpirun", lambda: mpirun_allreduce(hosts, names, port))):
                    port += 1
                    try:
                        times.setdefault((name, n), []).append(f())
                    except AssertionError as exc:   # a peer that fails here is reported, not fatal
                        failures.setdefault(name, []).append(str(exc).strip().splitlines()[:3])
                        times.setdefault((name, n), [])
        note = (f"median of {repeats}, interleaved; wall time from the command to every worker past "
                "init_process_group(gloo) + all_reduce + exit; script tests/launch/scripts/torchrun_allreduce.py")
        for n in (1, 2, 4):
            for peer, label in (("torchrun", "torchrun c10d over ssh"), ("mpirun", "mpirun (Open MPI wheel)")):
                extra = ""
                if len(times[(peer, n)]) < repeats:
                    extra = f"; {peer} failed {repeats - len(times[(peer, n)])} of {repeats} runs: {failures.get(peer)}"
                rows.append(_row("launch_to_allreduce", f"podrun ssh, {n} host(s)", times[("podrun", n)], "s",
                                 note + extra, f"{label}, {n} host(s)", times[(peer, n)] or None))
        rows.append(_row("launch_scaling", "podrun ssh all_reduce, 4 hosts", times[("podrun", 4)], "s",
                         "target: within 1.3x of 1 host; the 4 'hosts' share this machine's cores, so 4 torch "
                         "imports compete for them", "podrun ssh all_reduce, 1 host", times[("podrun", 1)]))
        fan = {}
        for _ in range(repeats):
            for n in (1, 4):
                port += 1
                fan.setdefault(("podrun", n), []).append(podrun_true(hosts, hosts.hosts[:n], runs, port))
                fan.setdefault(("ssh", n), []).append(ssh_true(hosts, hosts.hosts[:n]))
        rows.append(_row("launch_fanout", "podrun ssh `true`, 4 hosts", fan[("podrun", 4)], "s",
                         "podrun's own cost (CLI start, preflight, fan-out, agents, teardown), no torch",
                         "podrun ssh `true`, 1 host", fan[("podrun", 1)]))
        rows.append(_row("launch_fanout", "podrun ssh `true`, 4 hosts", fan[("podrun", 4)], "s",
                         "vs OpenSSH `ssh h true` to the 4 hosts in parallel (no preflight, no agent)",
                         "OpenSSH ssh x4 parallel", fan[("ssh", 4)]))
        td = []
        for _ in range(repeats):
            port += 1
            td.append(teardown(hosts, runs, port, tmp))
        rows.append(_row("teardown", "worker exit 3 -> every process gone, 4 hosts", td, "s",
                         f"median of {repeats}; failing worker's clock to podrun's exit (podrun exits after every "
                         "agent reported its workers reaped; checked on the hosts); target < 2 s"))
        lost = []

        def make(n):
            return NetnsHosts(n, "h")

        for _ in range(max(2, repeats // 2)):
            port += 1
            lost.append(lost_host(make, runs, port))
        rows.append(_row("lost_host", "link cut -> run ended (keepalive 5 s)", lost, "s",
                         f"median of {len(lost)}; isolate = veth down; target < 10 s"))
    return rows


if __name__ == "__main__":
    for r in run(quick="--quick" in sys.argv):
        print(r)
