"""The transports by name: what each can do (its capabilities) and where its code is, imported only when used.

Code outside this package asks a transport's capabilities (``request.kind.remote``), never its name; a new
transport is one entry here and one module (podrun.launch.transports.base says what it implements).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

SSH_CLIENTS = ("auto", "openssh", "paramiko")     # --ssh-client


@dataclass(frozen=True)
class TransportKind:
    """One transport: its name, its implementation and the questions the launch asks of it."""

    name: str
    #: "module:attr", imported when used (ssh may pull paramiko): a Transport class, or a factory taking the request
    impl: str
    #: it reaches other hosts; False: every instance runs on this machine (rank 0's master is here, so
    #: --master-port 0 picks a port here, and this machine's checks and limits apply to every worker)
    remote: bool = True
    #: one launcher process starts every instance and carries their output as one stream (mpirun, srun, poprun)
    merged: bool = False
    #: the controller holds an ssh connection to each instance's host: it asks a host its address over it (the
    #: master's), reaches this machine the same way, and the preflight starts the agents held until all are up
    ssh_per_host: bool = False
    #: its launcher starts its own daemons on the other hosts over ssh, unless the batch scheduler starts them (Open
    #: MPI's rsh launcher, or Grid Engine's qrsh / PBS's TM where Open MPI has them)
    ssh_daemons: bool = False
    #: each agent gets the run's --env as the first message on its stdin (podrun.wire.envchannel)
    env_stdin: bool = False
    #: one agent per worker, each an MPI rank (--rank-from-env), rather than one per instance
    agent_per_worker: bool = False
    #: what it can do instead with one agent per worker, each an MPI rank (--mpi-ranks, an engine that asks for MPI
    #: ranks: horovod); None: it has no such mode (``for_request``)
    per_worker: "TransportKind | None" = None
    #: rank 0's agent may serve torch's store on the rendezvous port (--agent-store)
    agent_store: bool = True
    #: podrun starts each instance itself, on hosts it picks per attempt: warm zygotes
    per_instance: bool = True
    #: each attempt starts anew on the hosts its plan names (an agent each, or a launcher's new step whose agents
    #: join again): --elastic re-plans on the hosts left
    replans: bool = True
    #: the launcher passes the environment it runs in to every host (srun's --export=ALL)
    passes_env: bool = False
    #: chosen by its engine (--engine) or by podrun itself (copy 0 of one podrun per node), never by --transport
    engine_only: bool = False
    #: its agents join the controller over TCP with the run's key (podrun.launch.transports.join): one handle per
    #: instance, the controller's tokens over each connection
    joined: bool = False
    #: what may have ended an agent's connection before the agent reported (a lost host's root cause says it)
    lost_means: str = "host crashed, or its agent killed"

    def for_request(self, mpi_ranks: bool) -> "TransportKind":
        """What this transport does for a request: its ``per_worker`` capabilities when the request asks for one
        MPI rank per worker and it has them, else its own."""
        return self.per_worker if mpi_ranks and self.per_worker is not None else self

    def load(self):
        """What makes this transport from a request (imported now): its class, or for ssh the function that picks
        the client's class; a LaunchError naming a module it needs that is missing (paramiko for ssh)."""
        import importlib

        module_name, attr = self.impl.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            from podrun.errors import LaunchError

            raise LaunchError(f"transport {self.name!r} needs the Python module {exc.name!r}",
                              hint=f"pip install {exc.name}") from exc
        return getattr(module, attr)


# an agent per instance, which joins; with --mpi-ranks an agent per worker, each an MPI rank, on mpirun's one stream
_MPIRUN = TransportKind("mpirun", "podrun.launch.transports.mpirun:MpirunTransport", per_instance=False,
                        ssh_daemons=True, joined=True,
                        lost_means="host crashed, its Open MPI daemon (prted) or agent killed")
TRANSPORTS: dict[str, TransportKind] = {k.name: k for k in (
    TransportKind("local", "podrun.launch.transports.local:LocalTransport", remote=False,
                  lost_means="its agent killed"),
    TransportKind("ssh", "podrun.launch.transports.openssh:ssh_transport", ssh_per_host=True, env_stdin=True,
                  lost_means="host crashed, sshd or agent killed"),
    replace(_MPIRUN, per_worker=replace(_MPIRUN, merged=True, joined=False, agent_per_worker=True)),
    TransportKind("srun", "podrun.launch.transports.srun:SrunTransport", per_instance=False, passes_env=True,
                  joined=True, lost_means="node down, its srun task or agent killed"),
    TransportKind("poprun", "podrun.launch.engines.poprun:PoprunTransport", merged=True, agent_store=False,
                  per_instance=False, replans=False, engine_only=True,
                  lost_means="host crashed, poprun's connection to it or its agent killed"),
    TransportKind("join", "podrun.launch.transports.join:ListenTransport", per_instance=False, replans=False,
                  engine_only=True, joined=True),
)}


def transport_of(name: str) -> TransportKind:
    """The transport registered under ``name``; LaunchError naming the known ones for another."""
    if name not in TRANSPORTS:
        from podrun.errors import LaunchError

        raise LaunchError(f"unknown transport {name!r}", hint=f"use one of: {', '.join(TRANSPORTS)}")
    return TRANSPORTS[name]


def transport_choices() -> list[str]:
    """What --transport takes: every transport but those an engine chooses."""
    return [k.name for k in TRANSPORTS.values() if not k.engine_only]
