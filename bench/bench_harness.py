"""Test-harness costs: NetnsHosts / SlurmCluster up and down, ssh round trips, a 3-node Slurm job."""
from __future__ import annotations

import subprocess
import time

from bench.rows import row


def _row(benchmark, subject, values, unit, note, peer=None, peer_values=None):
    return row(benchmark, subject, values, unit, note, peer, peer_values, digits=4)


def run(quick: bool) -> list[dict]:
    from tests.harness import NetnsHosts
    from tests.harness.slurm import SlurmCluster

    repeats = 3 if quick else 9
    rows = []
    up, down, ssh_t, pm_t = [], [], [], []
    for _ in range(repeats):
        with NetnsHosts(4) as hosts:
            up.append(hosts.up_seconds)
            for _ in range(3):  # OpenSSH client vs paramiko, interleaved: connect + `true` + close
                t0 = time.perf_counter()
                subprocess.run(hosts.ssh_argv("h1", "true"), check=True)
                ssh_t.append(time.perf_counter() - t0)
                pm_t.append(_paramiko_once(hosts))
        down.append(hosts.down_seconds)
    note = f"median of {repeats}; 4 hosts = netns + sshd + keys + known_hosts"
    rows.append(_row("harness", "NetnsHosts(4) up", up, "s (median)", note))
    rows.append(_row("harness", "NetnsHosts(4) down", down, "s (median)", note))
    rows.append(_row("harness", "paramiko connect+exec true", pm_t, "s (median)",
                     f"{len(pm_t)} interleaved runs, strict host keys", "OpenSSH ssh h1 true", ssh_t))

    sup, sdown, job_t = [], [], []
    for _ in range(max(2, repeats // 3)):
        with SlurmCluster(3) as sl:
            sup.append(sl.up_seconds)
            for _ in range(2):
                t0 = time.perf_counter()
                job = sl.sbatch(["-N3", "-o", "/dev/null", "--wrap", "srun true"])
                state = sl.wait_job(job)["JobState"]
                if state != "COMPLETED":
                    raise RuntimeError(f"3-node job ended {state}")
                job_t.append(time.perf_counter() - t0)
        sdown.append(sl.down_seconds)
    note = f"median of {len(sup)}; slurmctld + 3 slurmd in netns + munge"
    rows.append(_row("harness", "SlurmCluster(3) up (to all idle)", sup, "s (median)", note))
    rows.append(_row("harness", "SlurmCluster(3) down", sdown, "s (median)", note))
    rows.append(_row("harness", "sbatch -N3 'srun true' to COMPLETED", job_t, "s (median)",
                     f"median of {len(job_t)}; slurmctld schedules on a 1 s tick"))
    return rows


def _paramiko_once(hosts) -> float:
    import paramiko
    t0 = time.perf_counter()
    c = paramiko.SSHClient()
    c.load_host_keys(hosts.known_hosts_path)
    c.set_missing_host_key_policy(paramiko.RejectPolicy())
    c.connect(hosts.address("h1"), username="root", key_filename=hosts.key_path, look_for_keys=False,
              allow_agent=False, timeout=5)
    _, out, _ = c.exec_command("true")
    out.channel.recv_exit_status()
    c.close()
    return time.perf_counter() - t0
