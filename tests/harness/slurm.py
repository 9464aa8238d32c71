"""SlurmCluster: a real, throwaway Slurm (slurmctld + one slurmd per network namespace, own munge) for tests.

    with SlurmCluster(nodes=3) as sl:
        job = sl.sbatch(["-N3", "--wrap", "srun hostname"])
        sl.wait_job(job)                      # -> {"JobState": "COMPLETED", "ExitCode": "0:0", ...}

Layout (slot s, 0..63, also used by nothing else): bridge psb<s> 10.201.<s>.1 in the root
namespace, where slurmctld runs (port 17000+2s; slurmd port 17001+2s); node<i> is netns
prs<s>-node<i> at 10.201.<s>.<i+1> with its own hostname and /etc/hosts (node1..nodeN,
controller), slurmd -N node<i> entered with nsenter (not `ip netns exec`, which remounts /sys).
munged has its own socket and 0600 key under the run directory.

ALWAYS pass SLURM_CONF to Slurm commands (``env`` or ``run``): without it Slurm looks its
controller up in DNS and sends a query off the machine. Jobs inherit the submitter's
environment (sbatch --export=ALL), and the filesystem is shared, so `python -m podrun` works on
every node with sys.executable. Nodes reach each other (gloo: MASTER_ADDR = a node address).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Sequence

from .common import (await_daemonised, BASE, BASE_TOOLS, Fabric, FabricAccess, HarnessError, check_prerequisites,
                     kill_pids, pid_from_file, port_free, run, subnet_in_use, wait_for)

KIND = "slurm"
PORT_BASE = 17000
SLURM_TOOLS = (("slurmctld", "slurmctld"), ("slurmd", "slurmd"), ("sbatch", "slurm-client"),
               ("srun", "slurm-client"), ("squeue", "slurm-client"), ("scontrol", "slurm-client"),
               ("sinfo", "slurm-client"), ("scancel", "slurm-client"), ("munged", "munge"),
               ("mungekey", "munge"))
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE"}


def _names(slot: int) -> dict:
    return dict(netns_prefix=f"prs{slot}-", veth_prefix=f"psv{slot}-", bridge=f"psb{slot}",
                net=f"10.201.{slot}")


def _kill_daemons(run_dir: Path) -> None:
    """kill -9 the slurmctld / slurmd / munged recorded in run_dir's pidfiles (cmdline checked)."""
    files = [run_dir / "slurmctld.pid", run_dir / "munge" / "pid"] + sorted(run_dir.glob("slurmd-*.pid"))
    pids = [p for p in (pid_from_file(f, r"slurmctld|slurmd|munged") for f in files) if p]
    kill_pids(pids)


def _cleanup_slot(slot: int) -> None:
    run_dir = BASE / f"{KIND}-{slot}"
    _kill_daemons(run_dir)
    n = _names(slot)
    Fabric.teardown_leftovers(n["netns_prefix"], n["veth_prefix"], n["bridge"])
    shutil.rmtree(run_dir, ignore_errors=True)


def _usable(slot: int) -> bool:
    return (not subnet_in_use(f"10.201.{slot}") and port_free(PORT_BASE + 2 * slot)
            and port_free(PORT_BASE + 2 * slot + 1))


class SlurmCluster(FabricAccess):
    """slurmctld + slurmd node1..nodeN in network namespaces; a context manager (``close()`` is idempotent)."""

    def __init__(self, nodes: int = 3, *, cpus_per_node: int | None = None, start: bool = True):
        if nodes < 1 or nodes > 200:
            raise HarnessError(f"podrun test harness: SlurmCluster(nodes={nodes}): nodes must be 1..200")
        self.num_nodes = nodes
        self.cpus_per_node = cpus_per_node or os.cpu_count() or 1
        self._init_life()
        if start:
            self.start()

    # ------------------------------------------------------------------ life cycle
    def start(self) -> "SlurmCluster":
        t0 = time.monotonic()
        check_prerequisites(BASE_TOOLS + SLURM_TOOLS)
        self.slot = self._take_slot(KIND, _cleanup_slot, _usable)
        return self._bring_up(self._start_cluster, since=t0)

    def _start_cluster(self) -> None:
        """munged, slurm.conf, the fabric, slurmctld and every slurmd, waited for until idle."""
        self.port = PORT_BASE + 2 * self.slot
        self.run_dir = d = BASE / f"{KIND}-{self.slot}"
        for sub in ("munge", "state", "log", "jobs"):
            (d / sub).mkdir(parents=True)
        os.chmod(d, 0o755)
        os.chmod(d / "munge", 0o755)  # munged: the socket dir must be searchable by all
        os.chmod(d / "jobs", 0o777)
        self.slurm_conf = str(d / "slurm.conf")
        self.fabric = Fabric(**_names(self.slot), names=[f"node{i}" for i in range(1, self.num_nodes + 1)],
                             run_dir=d)
        run(["mungekey", "-c", "-k", str(d / "munge" / "key")])
        os.chmod(d / "munge" / "key", 0o600)
        run([shutil.which("munged") or "/usr/sbin/munged", "-S", str(d / "munge" / "sock"),
             f"--key-file={d}/munge/key", f"--pid-file={d}/munge/pid", f"--log-file={d}/munge/log",
             f"--seed-file={d}/munge/seed"])
        self._write_conf()
        self.fabric.up()
        run(["slurmctld"], env=self.env)
        starts = {node: self.popen(node, ["slurmd", "-N", node], env=self.env, cwd="/", stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                  for node in self.nodes}       # all at once: one after the other is seconds per 10 nodes
        for node, p in starts.items():
            self._started_slurmd(node, p)
        # registering takes slurmctld about 0.5 s per 10 nodes on a loaded machine
        wait_for(self._all_idle, 30 + self.num_nodes, f"Slurm nodes {', '.join(self.nodes)} to be idle "
                                                      f"(logs: {d}/log)", interval=0.05)

    def _teardown(self) -> None:
        """Cancel every job, shut Slurm down, kill leftovers, delete namespaces and bridge (``close()`` releases the slot)."""
        d = getattr(self, "run_dir", None)
        if d is not None and (d / "slurm.conf").exists() and self._ctld_pid():
            jobs = self.run(["squeue", "-h", "-o", "%i"], check=False).stdout.split()
            if jobs:  # slurmstepd outlives slurmd otherwise
                self.run(["scancel", "--full", *jobs], check=False)
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline and self.run(["squeue", "-h"], check=False).stdout.strip():
                    time.sleep(0.1)
            self.run(["scontrol", "shutdown"], check=False)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and self._daemon_pids():
                time.sleep(0.05)
        if d is not None:
            _kill_daemons(d)
        if self.fabric is not None:
            self.fabric.close()  # leftover slurmstepd and tasks die with their namespace
        if d is not None:
            shutil.rmtree(d, ignore_errors=True)

    # ------------------------------------------------------------------ properties
    @property
    def env(self) -> dict[str, str]:
        """A copy of os.environ with SLURM_CONF set: pass it to every Slurm command."""
        return {**os.environ, "SLURM_CONF": self.slurm_conf}

    @property
    def nodes(self) -> list[str]:
        return list(self.fabric.nodes)

    @property
    def jobs_dir(self) -> Path:
        """A world-writable directory for job output files (removed at close)."""
        return self.run_dir / "jobs"

    # ------------------------------------------------------------------ commands
    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float = 60,
            **kw) -> subprocess.CompletedProcess:
        """Run a Slurm client command (root namespace) with SLURM_CONF; check=True raises HarnessError."""
        env = {**self.env, **kw.pop("env", {})}
        cp = subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=timeout, **kw)
        if check and cp.returncode != 0:
            raise HarnessError(f"podrun test harness: `{' '.join(argv)}` failed with exit code "
                               f"{cp.returncode}: {(cp.stderr or cp.stdout).strip()[-2000:]}")
        return cp

    def sbatch(self, args: Sequence[str], **kw) -> str:
        """Submit (sbatch --parsable ARGS) and return the job id."""
        out = self.run(["sbatch", "--parsable", *args], **kw).stdout.strip()
        return out.split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job -o` as a dict (JobState, ExitCode, NodeList, StdOut, ...); {} when unknown."""
        cp = self.run(["scontrol", "show", "job", "-o", str(job_id)], check=False)
        if cp.returncode != 0:
            return {}
        return dict(re.findall(r"(\w+)=(\S*)", cp.stdout))

    def wait_job(self, job_id: str, timeout: float = 60) -> dict[str, str]:
        """Wait until the job reaches a terminal state; return its `scontrol show job` fields."""
        def done():
            info = self.job(job_id)
            return info if info.get("JobState") in TERMINAL else None
        return wait_for(done, timeout, f"Slurm job {job_id} to finish", interval=0.1)

    def set_node_state(self, node: str, state: str, reason: str = "podrun test") -> None:
        """scontrol update nodename=NODE state=STATE (down is instant; Slurm itself takes 15-20 s)."""
        self.run(["scontrol", "update", f"nodename={node}", f"state={state}", f"reason={reason}"])

    # ------------------------------------------------------------------ faults (the rest: FabricAccess)

    def revive(self, node: str) -> None:
        """Link up, restart slurmd if it is gone, and resume the node; waits until it is idle."""
        self.fabric.link(node, True)
        if pid_from_file(self.run_dir / f"slurmd-{node}.pid", "slurmd") is None:
            self._start_slurmd(node)
        self.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
        wait_for(self._all_idle, 30, f"Slurm node {node} to be idle again", interval=0.1)

    # ------------------------------------------------------------------ internals
    def _write_conf(self) -> None:
        d = self.run_dir
        lines = f"""\
ClusterName=podrun{self.slot}
SlurmctldHost=localhost({self.controller_address})
SlurmctldPort={self.port}
SlurmdPort={self.port + 1}
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge/sock
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ProctrackType=proctrack/linuxproc
TaskPlugin={self._task_plugin()}
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
JobRequeue=0
SlurmdTimeout=10
MessageTimeout=5
KillWait=2
MinJobAge=600
SchedulerParameters=batch_sched_delay=0
""".splitlines()
        if self.cpus_per_node != (os.cpu_count() or 1):   # more CPUs than the machine's: slurmd reports the conf's
            lines.append("SlurmdParameters=config_overrides")
        for name, n in self.fabric.nodes.items():
            lines.append(f"NodeName={name} NodeAddr={n.address} CPUs={self.cpus_per_node} RealMemory=1000")
            (d / "spool" / name).mkdir(parents=True, exist_ok=True)
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        Path(self.slurm_conf).write_text("\n".join(lines) + "\n")

    def _task_plugin(self) -> str:
        """task/affinity binds a job to the cores it was given, but where the nodes declare more CPUs than this
        machine has, it cannot lay out more tasks a node than real cores ("Unable to layout tasks on given cpus")
        and binds a job of one task a node to core 0 on every node, so that the nodes, which share this machine's
        cores, would all run on one: such nodes run their tasks unbound (task/none)."""
        return "task/none" if self.cpus_per_node > (os.cpu_count() or 1) else "task/affinity"

    def _start_slurmd(self, node: str) -> None:
        self._started_slurmd(node, self.popen(node, ["slurmd", "-N", node], env=self.env, cwd="/",
                                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.PIPE, text=True))

    def _started_slurmd(self, node: str, p: subprocess.Popen) -> None:
        """Wait for slurmd to daemonise (its first process exits); HarnessError when it failed."""
        await_daemonised(p, f"slurmd on {node}", f"log: {self.run_dir}/log/slurmd-{node}.log")

    def _ctld_pid(self) -> int | None:
        return pid_from_file(self.run_dir / "slurmctld.pid", "slurmctld")

    def _daemon_pids(self) -> list[int]:
        files = [self.run_dir / "slurmctld.pid"] + sorted(self.run_dir.glob("slurmd-*.pid"))
        return [p for p in (pid_from_file(f, "slurmctld|slurmd") for f in files) if p]

    def _all_idle(self) -> bool:
        cp = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False, timeout=10)
        states = dict(line.split() for line in cp.stdout.splitlines() if len(line.split()) == 2)
        return cp.returncode == 0 and all(states.get(n) == "idle" for n in self.nodes)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"slot {getattr(self, 'slot', '?')}"
        return f"SlurmCluster(nodes={self.num_nodes}, {state})"
