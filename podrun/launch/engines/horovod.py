"""The horovod engine's check: is horovod importable here.

Horovod is never a dependency: horovod 0.28.1 (its last release) does not build against torch 2.13
as published (its CMake asks for C++14, torch needs C++17). When it is importable, ``--engine
horovod`` runs over the mpirun transport (podrun.launch.engines.ENGINES): one MPI rank per worker, each
a podrun agent (--rank-from-env) whose one worker inherits the rank's Open MPI variables, for Horovod's
MPI controller, and gets the env contract, under the Supervisor as every run.
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
        raise LaunchError("--engine horovod: the horovod package is not importable in this Python",
                          hint="install horovod with torch support (HOROVOD_WITH_PYTORCH=1 pip install horovod; "
                               "0.28.1 needs its CMake C++ standard raised to 17 for torch 2.x), or use --engine torch",
                          exit_code=2)
