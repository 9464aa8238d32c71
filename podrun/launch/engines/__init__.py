"""Engine registry: who starts the workers of a plan (podrun's own agent, poprun, or horovod via mpirun)."""
from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING

from podrun import safefs
from podrun.errors import LaunchError, PlanError

if TYPE_CHECKING:  # pragma: no cover
    from podrun.launch.options import EngineOptions

# name -> what it is; "torch" is podrun's own agent (any transport), the others run one outer
# command on this host that starts every instance itself.
ENGINES: dict[str, str] = {
    "torch": "podrun's instance agent on each host (torch.distributed: gloo/NCCL); any transport",
    "poprun": "Graphcore poprun starts the instances on an IPU-POD (popdist env); needs poprun on PATH",
    "horovod": "mpirun starts one rank per worker for Horovod scripts; needs horovod importable",
}


def engine_names() -> list[str]:
    return list(ENGINES)


def check_engine(name: str) -> str:
    if name not in ENGINES:
        raise PlanError(
            f"unknown engine '{name}'",
            hint="choose one of: " + ", ".join(ENGINES),
        )
    return name


def run_outer_command(cmd: list[str], *, env: dict[str, str] | None = None,
                      log_path: str | os.PathLike | None = None, grace: float = 5.0,
                      prefix: str = "") -> int:
    """Run one launcher command (poprun, mpirun) in its own process group and supervise it.

    Output streams through (with ``prefix``) and into ``log_path``; SIGINT/SIGTERM to podrun go to
    the whole group (SIGTERM, then SIGKILL after ``grace``); returns the exit code (128+signal for a
    signal), as the launcher reports it. The launcher itself does the fail-fast across instances.
    """
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, bufsize=1, text=True, errors="replace")
    except FileNotFoundError as exc:
        raise LaunchError(f"cannot start '{cmd[0]}': {exc.strerror}", exit_code=2) from exc
    log = safefs.open_log(log_path) if log_path else None
    stopping = {"sig": None}

    def _forward(signum, _frame):
        stopping["sig"] = signum
        _kill_group(proc, grace)

    old = {s: signal.signal(s, _forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(prefix + line)
            sys.stdout.flush()
            if log:
                log.write(line)
        rc = proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        _kill_group(proc, grace)
        if log:
            log.close()
    if stopping["sig"] is not None:
        return 128 + stopping["sig"]
    return 128 - rc if rc < 0 else rc


def _kill_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM the launcher's process group, SIGKILL what is left after ``grace`` seconds."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 1.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if proc.poll() is not None and not _group_alive(pgid):
                return
            time.sleep(0.05)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def load(name: str):
    """The engine module for ``name`` (poprun, horovod), imported lazily."""
    check_engine(name)
    if name == "torch":
        return None
    return importlib.import_module(f"podrun.launch.engines.{name}")


def resolve_engine(opts: EngineOptions, cluster=None, *, only_output_from_instance: int | None = None):
    """(engine name, transport name override or None, poprun options or None, mpi_args tuple).

    The engine is --engine, else the cluster spec's (IPU-POD specs say poprun), else torch.
    poprun is a transport of its own ("poprun": podrun.launch.engines.poprun:PoprunTransport).
    """
    import shlex

    name = check_engine(opts.engine or getattr(cluster, "engine", None) or "torch")
    mpi_args = tuple(shlex.split(opts.mpi_args)) if opts.mpi_args else ()
    if name != "poprun":
        return name, None, None, mpi_args
    from podrun.launch.engines.poprun import PoprunOptions

    popts = PoprunOptions(
        vipu_server_host=opts.vipu_server_host, vipu_partition=opts.vipu_partition, vipu_cluster=opts.vipu_cluster,
        num_ilds=opts.num_ilds, mpi_global_args=opts.mpi_global_args, mpi_local_args=opts.mpi_local_args,
        only_output_from_instance=only_output_from_instance, print_topology=opts.print_topology,
        offline_mode=opts.offline_mode)
    return name, "poprun", popts, mpi_args
