"""The srun transport: inside a Slurm allocation, one srun job step whose task i is instance agent i, which joins."""
from __future__ import annotations

import os
import subprocess

from podrun.errors import HostError
from podrun.launch.transports.base import InstanceHandle, Problem
from podrun.launch.transports.join import JoiningLauncher
from podrun.launch.transports.launcher import LauncherTransport, agent_shell, hosts_and_ranks

# a job step inherits the batch step's SLURM_* (ntasks=1 ...): what would contradict this step's own is dropped
STEP_VARS = ("SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_DISTRIBUTION",
             "SLURM_NNODES", "SLURM_CPUS_PER_TASK")


def allocation_hosts(env) -> list[str] | None:
    """The allocation's hosts from SLURM_JOB_NODELIST (None outside an allocation)."""
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        return None
    from podrun.specs.allocation import expand_nodelist

    return expand_nodelist(nodelist, "SLURM_JOB_NODELIST")


def step_cpus(env, per_node: int) -> int | None:
    """The step's --cpus-per-task: the cores the job asked per node (SRUN_CPUS_PER_TASK, else SLURM_CPUS_PER_TASK:
    the batch script's --cpus-per-task, one task per node) shared by the step's ``per_node`` tasks (at least one
    each); None where the job asked for none. Slurm 22.05+ no longer gives a step the job's --cpus-per-task."""
    for name in ("SRUN_CPUS_PER_TASK", "SLURM_CPUS_PER_TASK"):
        text = env.get(name, "")
        if text.isdigit() and int(text) > 0:
            return max(1, int(text) // per_node)
    return None


def srun_command(request, *, redact: bool = False, join: str | None = None) -> list[str]:
    """`srun -N <hosts> --ntasks-per-node=<k> --kill-on-bad-exit=1 ... sh -c '<agent>'` (pure but for the job's
    variables, os.environ); ``join``: the address the agents join (--join), the run's key in the environment srun
    passes on (--export=ALL).

    ``--nodelist`` pins the plan's hosts in instance order; ``--distribution=block`` makes task i
    (SLURM_PROCID) run on host i // k, as the plan placed instance i; ``--cpus-per-task`` gives each task its
    share of the cores the job asked per node (``step_cpus``).
    """
    hosts, k = hosts_and_ranks(request)
    cpus = step_cpus(os.environ, k)
    argv = ["srun", f"--nodes={len(hosts)}", f"--ntasks={len(hosts) * k}", f"--ntasks-per-node={k}",
            *([f"--cpus-per-task={cpus}"] if cpus is not None else []),
            "--kill-on-bad-exit=1", "--distribution=block", f"--nodelist={','.join(hosts)}",
            # a restart's step shares the CPUs an earlier step still holds (one with a lost node ends only when
            # Slurm has found the node down)
            *(["--overlap"] if request.restart_count > 0 else []),
            f"--job-name=podrun-{request.run_id}", "--export=ALL", "--unbuffered",
            f"--chdir={request.workdir}"]
    return argv + agent_shell(request, redact, join=join)


class SrunTransport(JoiningLauncher, LauncherTransport):
    """Start the instance agents as the tasks of one srun step (needs SLURM_JOB_ID in the env); each joins this
    controller over TCP (podrun.launch.transports.join)."""

    name = "srun"

    def argv(self, redact: bool = False) -> list[str]:
        return srun_command(self.request, redact=redact, join=self.join_address())

    def check_allocation(self, env=os.environ) -> None:
        """HostError (exit 2) when not in an allocation or the plan needs hosts it does not have."""
        if not env.get("SLURM_JOB_ID"):
            raise HostError("--transport srun runs inside a Slurm allocation, but SLURM_JOB_ID is not set",
                            hint="run podrun launch from an sbatch script (podrun script / podrun submit) or "
                                 "inside salloc; elsewhere use --transport ssh or mpirun")
        alloc = allocation_hosts(env)
        hosts, _ = hosts_and_ranks(self.request)
        if alloc is not None:
            missing = [h for h in hosts if h not in alloc]
            if missing:
                raise HostError(f"the plan needs {len(hosts)} hosts ({', '.join(hosts)}) but the Slurm allocation "
                                f"{env.get('SLURM_JOB_ID')} has {len(alloc)} ({', '.join(alloc)}): "
                                f"{', '.join(missing)} not allocated",
                                hint="ask for more nodes (sbatch --nodes) or plan for fewer (--nodes / --hosts)")

    def preflight(self) -> list[Problem]:
        try:
            self.check_allocation()
        except HostError as exc:
            return [Problem(os.environ.get("SLURMD_NODENAME", "localhost"), exc.message, exc.hint or "")]
        return []

    def _cancel_step(self) -> None:
        """scancel the step by name: what is left on the nodes when srun itself was killed."""
        job = os.environ.get("SLURM_JOB_ID")
        if not job:
            return
        out = subprocess.run(["squeue", "-h", "-s", "-j", job, "-o", "%i %j"], capture_output=True,
                             text=True, timeout=10)
        for line in out.stdout.splitlines():
            step, _, name = line.partition(" ")
            if name.strip() == f"podrun-{self.request.run_id}":
                subprocess.run(["scancel", "--signal=KILL", step], capture_output=True, timeout=10)

    def start(self) -> list[InstanceHandle]:
        self.check_allocation()
        return self.launch_joined(lambda address: srun_command(self.request, join=address), drop=STEP_VARS,
                                  run_dir=self.request.run_dir, on_kill=self._cancel_step)
