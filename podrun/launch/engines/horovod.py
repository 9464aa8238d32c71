"""The horovod engine: detection, and the mpirun command that starts one Horovod rank per worker.

Horovod is never a dependency: horovod 0.28.1 (its last release) does not build against torch 2.13
as published (its CMake asks for C++14, torch needs C++17). When it is importable, ``--engine
horovod`` starts the workers as MPI ranks (Horovod's own MPI controller), one per worker.
"""
from __future__ import annotations

import importlib.util

from podrun.errors import LaunchError


def horovod_available() -> bool:
    """True when ``import horovod.torch`` would find the package (nothing is imported)."""
    try:
        return importlib.util.find_spec("horovod") is not None
    except (ImportError, ValueError):
        return False


def require_horovod() -> None:
    if not horovod_available():
        raise LaunchError(
            "--engine horovod: the horovod package is not importable in this Python",
            hint="install horovod with torch support (HOROVOD_WITH_PYTORCH=1 pip install horovod; "
            "0.28.1 needs its CMake C++ standard raised to 17 for torch 2.x), or use --engine torch",
            exit_code=2,
        )


def horovod_command(plan, worker_command: list[str], *, env_names=(), options=None,
                    check: bool = True) -> list[str]:
    """mpirun argv starting one rank per worker of ``plan`` (workers per host = local replicas)."""
    from podrun.launch.transports.mpirun import MpiOptions, mpirun_command

    if check:
        require_horovod()
    per_host = max(p.local_replicas for p in plan.placement) * plan.instances_per_host
    hosts = []
    for p in plan.placement:
        if p.host not in hosts:
            hosts.append(p.host)
    return mpirun_command(hosts, per_host, worker_command, env_names=env_names,
                          options=options or MpiOptions())


def horovod_env(request) -> dict[str, str]:
    """What every Horovod rank gets on top of mpirun's rank variables: the run-wide part of the contract
    (podrun.wire.worker_env.run_wide_env) and --env.

    Per-rank names (RANK, LOCAL_RANK, ...) come from Open MPI (OMPI_COMM_WORLD_*), which
    podrun.runtime reads; Horovod's MPI controller needs nothing else.
    """
    from podrun.wire.probe import pick_free_port
    from podrun.wire.worker_env import run_wide_env

    port = request.master_port if request.master_port != 0 else pick_free_port()   # 0: podrun picks one
    return {**run_wide_env(request.plan, run_id=request.run_id, run_dir=request.run_dir,
                           plan_path=request.plan_path, master_addr=request.master_addr,
                           master_port=port, restart_count=request.restart_count,
                           max_restarts=request.max_restarts, launch_env=dict(request.env)),
            **dict(request.env)}


def launch_horovod(request, *, dry_run: bool = False, check: bool = True) -> tuple[list[str], int | None]:
    """``--engine horovod``: (the mpirun argv, its exit code; None with dry_run).

    Runs mpirun in its own process group (podrun.launch.engines.run_outer_command): output to the
    terminal and runs/<id>/horovod.log; Ctrl-C/SIGTERM end every rank; mpirun does the fail-fast.
    """
    import os
    import shlex

    from podrun.launch.engines import run_outer_command
    from podrun.launch.transports.mpirun import MpiOptions

    env = horovod_env(request)
    mpi_args = getattr(request, "mpi_args", ()) or ()
    mpi_args = tuple(shlex.split(mpi_args)) if isinstance(mpi_args, str) else tuple(mpi_args)
    opts = MpiOptions(mpi_args=mpi_args, ssh_config=request.ssh.config_path)
    argv = horovod_command(request.plan, ["/bin/sh", "-c", f"cd {shlex.quote(request.workdir)} && exec "
                                          + shlex.join(list(request.command))],
                           env_names=sorted(env), options=opts, check=check and not dry_run)
    if dry_run:
        return argv, None
    from podrun import safefs

    safefs.make_dirs(request.run_dir, "run directory", error=LaunchError)
    full = dict(os.environ)
    full.update(env)
    return argv, run_outer_command(argv, env=full, log_path=os.path.join(request.run_dir, "horovod.log"),
                                   grace=request.grace)
