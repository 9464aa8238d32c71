"""Fan-out to 4 and 16 namespace hosts, flat and through a bastion (ProxyJump): podrun's two ssh clients
against pdsh, ClusterShell's clush and OpenSSH in parallel, interleaved; wall time and the controller's own
CPU time per host.

Each round runs, one after the other in a fixed order:
- ``hostname`` on every host (each tool's output must name every host, or the round fails): pdsh (-R ssh, its default fanout 32), clush (its default fanout 64), OpenSSH in
  parallel (one ``ssh -F CFG HOST true`` per host, started at once, all waited for), paramiko in one Python
  process (connect + exec ``true`` per host in threads: what podrun's paramiko client does per host);
- ``podrun launch -- hostname`` with ``--ssh-client openssh`` and ``--ssh-client paramiko`` (the whole launch:
  CLI start, plan, held-agent preflight = one remote Python start per host, go, workers, summary).
CPU: user + system time of the measured process and every descendant it waited for (RUSAGE_CHILDREN
around each run, the same accounting for every tool), divided by the number of hosts. The paramiko
client cannot follow ProxyJump, so it has no bastion rows; through the bastion podrun also runs with a config
that multiplexes every hop over one connection to the bastion (ControlMaster auto, ControlPersist).
"""
from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from bench.rows import row

PARAMIKO_TRUE = r"""
import sys, threading, paramiko
cfg = paramiko.SSHConfig.from_path(sys.argv[1])
def one(h):
    c = cfg.lookup(h)
    cl = paramiko.SSHClient()
    cl.load_host_keys(c["userknownhostsfile"])
    cl.set_missing_host_key_policy(paramiko.RejectPolicy())
    cl.connect(c["hostname"], username=c["user"], key_filename=c["identityfile"], look_for_keys=False,
               allow_agent=False, timeout=10)
    _, out, _ = cl.exec_command("hostname")
    print(out.read().decode().strip(), flush=True)
    cl.close()
ts = [threading.Thread(target=one, args=(h,)) for h in sys.argv[2:]]
[t.start() for t in ts]
[t.join() for t in ts]
"""


def _timed(argv, env=None, names=()) -> tuple[float, float]:
    """(wall s, CPU s of the process and its waited-for descendants); raises on a non-zero exit, or when a
    host's name is missing from the output (every tool runs ``hostname``: a host that failed is caught even
    where a tool exits 0)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    cp = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=300)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if cp.returncode != 0:
        raise RuntimeError(f"{argv[:3]} exited {cp.returncode}: {(cp.stderr or cp.stdout)[-800:]}")
    said = set(cp.stdout.split())
    missing = [h for h in names if h not in said]
    if missing:
        raise RuntimeError(f"{argv[:3]}: no answer from {missing}: {(cp.stderr or cp.stdout)[-800:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _tools(hosts, tmp: str) -> dict[str, list[str] | tuple]:
    # the harness's config with ConnectTimeout 30: on a loaded 2-core machine 16 handshakes at once can take
    # longer than its 5 s, and a run that fails measures nothing
    cfg, names = f"{tmp}/ssh_config", hosts.hosts
    with open(hosts.ssh_config_path) as f, open(cfg, "w") as out:
        out.write(f.read().replace("ConnectTimeout 5", "ConnectTimeout 30"))
    clush = os.path.join(os.path.dirname(sys.executable), "clush")
    loop = " ".join(f"ssh -F {cfg} {h} hostname &" for h in names) + " wait"
    podrun = [sys.executable, "-m", "podrun", "launch", "--hosts", ",".join(names), "--devices-per-host", "1",
              "--transport", "ssh", "--ssh-config", cfg, "--python", hosts.python, "--runs-dir", f"{tmp}/runs",
              "--master-port", "29650"]
    tools = {
        "pdsh": (["pdsh", "-R", "ssh", "-w", ",".join(names), "hostname"],
                 {"PDSH_SSH_ARGS": f"-F {cfg} %h", "PDSH_SSH_ARGS_APPEND": ""}),
        "clush": ([clush, "-w", ",".join(names), "-o", f"-F {cfg}", "hostname"], None),
        "OpenSSH parallel": (["sh", "-c", loop], None),
        "paramiko threads": ([sys.executable, "-c", PARAMIKO_TRUE, cfg, *names], None),
        "podrun launch (openssh)": ([*podrun, "--ssh-client", "openssh", "--", "hostname"], None),
        "podrun launch (paramiko)": ([*podrun, "--ssh-client", "paramiko", "--", "hostname"], None),
    }
    if hosts.bastion:
        del tools["paramiko threads"], tools["podrun launch (paramiko)"]
        # one multiplexed connection to the bastion (ControlMaster), kept between runs (ControlPersist)
        mux = f"{tmp}/ssh_config_mux"
        with open(cfg) as f, open(mux, "w") as out:
            out.write(f"Host {hosts.bastion}\n  ControlMaster auto\n  ControlPath {tmp}/cm-%C\n"
                      f"  ControlPersist 120\n" + f.read())
        cut = podrun.index("--ssh-config") + 1
        tools["podrun launch (openssh), bastion ControlMaster"] = (
            [*podrun[:cut], mux, *podrun[cut + 1:], "--ssh-client", "openssh", "--", "hostname"], None)
    return tools


def _row(subject, n, topo, walls, cpus, peer=None, peer_walls=None, peer_cpus=None, rounds=0):
    note = f"{rounds} interleaved rounds; controller CPU {statistics.median(cpus) / n * 1000:.0f} ms/host"
    if peer_walls:
        note += f" vs {statistics.median(peer_cpus) / n * 1000:.0f} ms/host"
    return row("network", f"{subject}, {n} hosts {topo}", walls, "s wall (median)", note, peer, peer_walls or None)


def run(quick: bool) -> list[dict]:
    from tests.harness import NetnsHosts

    rounds = 3 if quick else 5
    rows = []
    for topo, bastion in (("flat", False), ("via bastion", True)):
        for n in (4, 16):
            with NetnsHosts(n, bastion=bastion) as hosts, tempfile.TemporaryDirectory() as tmp:
                tools = _tools(hosts, tmp)
                res = {k: ([], []) for k in tools}
                for k, (argv, env) in tools.items():      # warm-up: page cache, sshd's first fork
                    _timed(argv, env, hosts.hosts)
                for _ in range(rounds):
                    for k, (argv, env) in tools.items():
                        w, c = _timed(argv, env, hosts.hosts)
                        res[k][0].append(w)
                        res[k][1].append(c)
                if hosts.bastion:           # end the bastion's control master
                    mux = f"{tmp}/ssh_config_mux"
                    subprocess.run(["ssh", "-F", mux, "-O", "exit", hosts.bastion], capture_output=True, timeout=30)
                base = "OpenSSH parallel"
                for k in tools:
                    peer = None if k == base else base
                    rows.append(_row(k, n, topo, *res[k], peer=peer,
                                     peer_walls=res[base][0] if peer else None,
                                     peer_cpus=res[base][1] if peer else None, rounds=rounds))
    return rows


if __name__ == "__main__":
    from bench.rows import run_alone

    run_alone(run)
