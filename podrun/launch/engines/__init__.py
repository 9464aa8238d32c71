"""The engines by name: who starts the workers of a plan (podrun's agents; poprun; horovod's MPI ranks), and how."""
from __future__ import annotations

import importlib
import shlex
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from podrun.errors import PlanError

if TYPE_CHECKING:  # pragma: no cover
    from podrun.launch.options import EngineOptions


@dataclass(frozen=True)
class EngineKind:
    """One engine: its name, what it is, the transport it always runs over and what it needs here."""

    name: str
    about: str
    #: the transport that starts its instances (podrun.launch.transports); None: any, as --transport says
    transport: str | None = None
    #: "module:function" that raises a LaunchError when the engine cannot run from here (before a real run)
    check: str | None = None
    #: its workers are the ranks of one MPI world: under mpirun one agent per worker (--mpi-ranks always)
    mpi_ranks: bool = False

    def require(self) -> None:
        """Run the engine's check (nothing for an engine without one)."""
        if self.check is not None:
            module, attr = self.check.split(":")
            getattr(importlib.import_module(module), attr)()


ENGINES: dict[str, EngineKind] = {k.name: k for k in (
    EngineKind("torch", "podrun's instance agent on each host (torch.distributed: gloo/NCCL); any transport"),
    EngineKind("poprun", "Graphcore poprun starts the instances on an IPU-POD (popdist env); needs poprun on PATH",
               transport="poprun"),
    EngineKind("horovod", "mpirun starts one rank per worker for Horovod scripts; needs horovod importable",
               transport="mpirun", check="podrun.launch.engines.horovod:require_horovod", mpi_ranks=True),
)}


def engine_of(name: str) -> EngineKind:
    """The engine registered under ``name``; PlanError (exit 2) naming the known ones for another."""
    if name not in ENGINES:
        raise PlanError(f"unknown engine '{name}'", hint="choose one of: " + ", ".join(ENGINES))
    return ENGINES[name]


def resolve_engine(opts: EngineOptions, cluster=None, *, only_output_from_instance: int | None = None):
    """(engine name, the transport it always runs over or None, poprun options or None, mpi_args tuple).

    The engine is --engine, else the cluster spec's (IPU-POD specs say poprun), else torch.
    poprun is a transport of its own ("poprun": podrun.launch.engines.poprun:PoprunTransport); horovod runs
    over the mpirun transport, one agent per rank.
    """
    kind = engine_of(opts.engine or getattr(cluster, "engine", None) or "torch")
    mpi_args = tuple(shlex.split(opts.mpi_args)) if opts.mpi_args else ()
    popts = replace(opts.poprun, only_output_from_instance=only_output_from_instance) if kind.name == "poprun" else None
    return kind.name, kind.transport, popts, mpi_args
