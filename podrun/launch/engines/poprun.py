"""The poprun engine: the poprun command line for an IPU-POD plan, and poprun as a transport of agents.

poprun sets the popdist names itself; their values for a plan are podrun.wire.worker_env.popdist_env.
"""
from __future__ import annotations

import math
import shutil
from dataclasses import replace
from typing import Mapping

from podrun.errors import LaunchError, PlanError
from podrun.launch.options import PoprunOptions
from podrun.launch.transports.base import InstanceHandle, Problem
from podrun.launch.transports.launcher import LauncherTransport, agent_shell

IPUS_PER_ILD = 64  # an IPU-Link domain is one POD64 (a POD256 is --num-ilds 4)
# the V-IPU controller and partition of a POD job, as Graphcore's tools and examples name them in the environment
VIPU_ENV = {"vipu_server_host": "IPUOF_VIPU_API_HOST", "vipu_partition": "IPUOF_VIPU_API_PARTITION_ID"}
VIPU_FLAGS = {"vipu_server_host": "--vipu-server-host", "vipu_partition": "--vipu-partition"}


def resolve_vipu(options: PoprunOptions, environ: Mapping[str, str], spec=None) -> tuple[PoprunOptions, dict]:
    """The V-IPU server host and partition poprun gets: each from its option, else the environment a POD job has
    (IPUOF_VIPU_API_HOST, IPUOF_VIPU_API_PARTITION_ID), else the cluster spec's ``vipu`` block. Returns the options
    filled in and where each value came from (``{field: "--option" | "$NAME" | "spec PATH"}``)."""
    vipu = getattr(spec, "vipu", None)
    found, where = {}, {}
    for name, env in VIPU_ENV.items():
        for value, src in ((getattr(options, name), VIPU_FLAGS[name]), (environ.get(env) or None, f"${env}"),
                           (getattr(vipu, name.removeprefix("vipu_"), None),
                            f"vipu in {getattr(spec, 'path', '') or 'the cluster spec'}")):
            if value:
                found[name], where[name] = value, src
                break
    return replace(options, **found), where


def missing_vipu(options: PoprunOptions) -> list[str]:
    """What a poprun line on a real POD lacks: the V-IPU server host and partition (poprun attaches to the IPUs
    through them); nothing with --offline-mode, which attaches to none."""
    if options.offline_mode:
        return []
    return [f"{VIPU_FLAGS[n]} (or ${VIPU_ENV[n]})" for n in VIPU_ENV if not getattr(options, n)]


def check_vipu(options: PoprunOptions, where: str) -> None:
    """A LaunchError (exit 2) naming what a poprun line for a POD lacks (missing_vipu), before anything starts."""
    missing = missing_vipu(options)
    if missing:
        raise LaunchError(
            f"{where}: poprun attaches to the POD's IPUs through its V-IPU controller, and no "
            f"{' or '.join(missing)} says which; poprun would fail when the job starts",
            hint="give --vipu-server-host HOST --vipu-partition NAME, set IPUOF_VIPU_API_HOST and "
                 "IPUOF_VIPU_API_PARTITION_ID, or add `vipu: {server_host: HOST, partition: NAME}` to the cluster "
                 "spec (`vipu list partitions` names yours)", exit_code=2)


def default_num_ilds(plan) -> int | None:
    """IPU-Link domains a plan spans: 1 up to a POD64 (flag left out), POD128 -> 2, POD256 -> 4."""
    if plan.devices <= IPUS_PER_ILD:
        return None
    return math.ceil(plan.devices / IPUS_PER_ILD)


def check_ipu_plan(plan) -> None:
    if not str(plan.device_kind).startswith("ipu"):
        raise PlanError(f"--engine poprun needs an IPU plan, but cluster '{plan.cluster}' has device kind "
                        f"'{plan.device_kind}'",
                        hint="use an IPU-POD cluster spec (--cluster / --pod) or --engine torch")


def poprun_command(plan, worker_command: list[str], options: PoprunOptions = PoprunOptions()) -> list[str]:
    """The exact argv that starts ``worker_command`` once per instance of ``plan`` under poprun.

    Pure: no I/O. poprun itself starts the instances on the hosts (through its own mpirun) and sets
    the POPDIST_* env; podrun adds its PODRUN_* names through --mpi-local-args (-x NAME).
    """
    check_ipu_plan(plan)
    if not worker_command:
        raise PlanError("poprun needs a command to run in each instance", hint="pass it after --")
    cmd = [options.executable, f"--num-instances={plan.instances}", f"--num-replicas={plan.replicas}",
           f"--ipus-per-replica={plan.devices_per_replica}"]
    hosts = list(dict.fromkeys(p.host for p in plan.placement))   # poprun places instances round-robin over them
    if len(hosts) > 1 or (hosts and hosts[0] not in ("localhost", "127.0.0.1")):
        cmd.append("--host=" + ",".join(hosts))
    for flag, value in (("vipu-server-host", options.vipu_server_host), ("vipu-partition", options.vipu_partition),
                        ("vipu-cluster", options.vipu_cluster)):
        if value:
            cmd.append(f"--{flag}={value}")
    ilds = options.num_ilds if options.num_ilds is not None else default_num_ilds(plan)
    if ilds is not None:
        if ilds < 1:
            raise PlanError(f"--num-ilds must be at least 1, got {ilds}")
        cmd.append(f"--num-ilds={ilds}")
    if options.numa_aware:
        cmd.append("--numa-aware=1")
    if options.mpi_global_args:
        cmd.append(f"--mpi-global-args={options.mpi_global_args}")
    local = [options.mpi_local_args] if options.mpi_local_args else []
    local += [f"-x {name}" for name in options.export_env]
    if local:
        cmd.append("--mpi-local-args=" + " ".join(local))
    if options.only_output_from_instance is not None:
        if not 0 <= options.only_output_from_instance < plan.instances:
            raise PlanError(f"--only-output-from-instance {options.only_output_from_instance} is outside the "
                            f"plan's {plan.instances} instances (0..{plan.instances - 1})")
        cmd.append(f"--only-output-from-instance={options.only_output_from_instance}")
    cmd += [flag for flag, on in (("--print-topology=yes", options.print_topology),
                                  ("--offline-mode=on", options.offline_mode)) if on]
    return cmd + list(worker_command)


def find_poprun(executable: str = "poprun") -> str:
    """The poprun on PATH, or a LaunchError that says how to get it (exit 2)."""
    path = shutil.which(executable)
    if path is None:
        raise LaunchError(f"--engine poprun: '{executable}' is not on PATH",
                          hint="source the Poplar SDK's enable.sh (it puts poprun on PATH), or use --dry-run to see "
                               "the command", exit_code=2)
    return path


# ---- as a transport: poprun starts the instance agents --------------------------------------------

class PoprunTransport(LauncherTransport):
    """``--engine poprun``: one poprun whose instances are podrun's agents (--index-from-env).

    poprun places the instances on the hosts and sets POPDIST_*; each agent reads its index from
    OMPI_COMM_WORLD_RANK (poprun runs Open MPI underneath), adds the PODRUN_* and torchrun names,
    and speaks the line protocol on the merged stdout that the supervisor parses.
    """

    name = "poprun"

    def __init__(self, request, options: PoprunOptions | None = None):
        super().__init__(request)
        self.options = options or getattr(request, "poprun", None) or PoprunOptions()

    def argv(self, redact: bool = False) -> list[str]:
        """poprun's argv; the --env values are in poprun's environment (``start``), their names exported to
        every instance with ``-x NAME`` in --mpi-local-args."""
        names = tuple(dict.fromkeys((*self.options.export_env, *self.request.env_names())))
        return poprun_command(self.request.plan, agent_shell(self.request, redact),
                              replace(self.options, export_env=names))

    def preflight(self) -> list[Problem]:
        try:
            check_ipu_plan(self.request.plan)
            find_poprun(self.options.executable)
        except (PlanError, LaunchError) as exc:
            return [Problem("localhost", exc.message, exc.hint or "")]
        return []

    def start(self) -> list[InstanceHandle]:
        argv = self.argv()
        argv[0] = find_poprun(self.options.executable)
        return self._launch(argv)
