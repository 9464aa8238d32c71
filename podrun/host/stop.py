"""Why an agent ends its workers, as a value (StopKind), with the line it says about it."""
from __future__ import annotations

import enum
from dataclasses import dataclass

from podrun.wire.protocol import STOP_CONTROLLER_LOST, STOP_SIGNALLED


class StopKind(enum.Enum):
    """Why an agent ends its workers: what it decides on (whether snapshots outlive it) reads this, not the text."""

    CONTROLLER_LOST = STOP_CONTROLLER_LOST  # stdout or stdin closed, or no heartbeat on stdin: the run is over here
    CONTROLLER_ASKED = "controller-asked"   # a T on stdin
    SIGNALLED = STOP_SIGNALLED              # SIGTERM, SIGINT or SIGHUP to the agent
    WORKER_FAILED = "worker-failed"         # a worker exited non-zero
    SPAWN_FAILED = "spawn-failed"           # a worker could not start


@dataclass(frozen=True)
class Stop:
    """The first reason to end this agent's workers, and the line the agent says about it."""

    kind: StopKind
    message: str
    silent_s: float = 0.0     # CONTROLLER_LOST by silence: the seconds it heard nothing from the controller
