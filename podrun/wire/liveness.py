"""Liveness: the heartbeat period and detection bound of a run, both ways.

The bound is the heartbeat period x the misses tolerated (default 0.25 s x 4 = 1 s up to 16 hosts; beyond, the
default period grows with the host count, ``default_period``, so that the controller hears a flat 64 heartbeats a
second whatever the size of the run, up to 5 s at 320 hosts); ``--keepalive`` names the bound itself. ``settings``
turns the options (and a cluster spec's fields) into a Liveness. What the controller heard when is its own
(podrun.launch.listener).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from podrun.errors import LaunchError

HEARTBEAT_S = 0.25         # the default heartbeat period, both ways (controller -> agent, agent -> controller)
HEARTBEAT_MISSES = 4       # heartbeats missed in a row before a host is lost: the default bound is 1 s
# Before the first line of the other side, the allowance is at least this: an agent may wait for the controller's
# fan-out to every other host, and an agent's python may start slowly on a loaded host.
FIRST_HEARTBEAT_S = 60.0
MIN_HEARTBEAT_S = 0.01     # shorter costs CPU on every host and finds nothing sooner (the checks run every 0.1 s)
MAX_MISSES = 10 ** 6
FLAT_HOSTS = 16            # up to this many hosts the default period is HEARTBEAT_S; beyond, it grows with them ...
MAX_DEFAULT_HEARTBEAT_S = 5.0   # ... up to this (a default bound of 20 s): detection far below a collective's timeout
# An agent's default bound on the controller's silence. A controller that ends closes its agents' stdin (they end
# their workers at once); silence alone means a cut link or a stalled controller machine, and a loaded one (hundreds
# of workers' lines, a busy CI) can miss a second of heartbeats. The controller's own bound on a host stays the
# default's 1 s: it takes its own stalls out of what it heard.
AGENT_DEFAULT_BOUND_S = 5.0


def default_period(hosts: int) -> float:
    """The heartbeat period when no option or cluster spec gives one: HEARTBEAT_S up to FLAT_HOSTS hosts, then
    HEARTBEAT_S x hosts / FLAT_HOSTS (the controller hears FLAT_HOSTS / HEARTBEAT_S = 64 heartbeats a second
    whatever the size of the run), at most MAX_DEFAULT_HEARTBEAT_S. ``hosts`` counts the agents that send
    heartbeats: one a host, one a worker under the mpirun transport (an agent per MPI rank)."""
    return min(MAX_DEFAULT_HEARTBEAT_S, HEARTBEAT_S * max(1.0, hosts / FLAT_HOSTS))


@dataclass(frozen=True)
class Liveness:
    """The heartbeat period and the silence (seconds) after which a host is lost, both ways."""

    period: float = HEARTBEAT_S
    bound: float = HEARTBEAT_S * HEARTBEAT_MISSES
    agent_bound: float | None = None    # an agent's bound on the controller's silence (None: ``bound``, both ways)

    @property
    def misses(self) -> float:
        return self.bound / self.period

    @property
    def controller_silence(self) -> float:
        """Seconds of the controller's silence after which an agent ends its workers."""
        return self.bound if self.agent_bound is None else self.agent_bound

    def describe(self) -> str:
        """``1 s (4 missed heartbeats of 0.25 s)``: the bound and how it is made."""
        return f"{self.bound:g} s ({self.misses:g} missed heartbeats of {self.period:g} s)"

    def to_dict(self) -> dict:
        m = round(self.misses, 6)
        return {"period_s": self.period, "misses": int(m) if m.is_integer() else m, "bound_s": self.bound,
                **({} if self.agent_bound is None else {"agent_bound_s": self.agent_bound})}


def settings(heartbeat: float | None = None, misses: int | None = None, keepalive: float | None = None, *,
             spec_heartbeat: float | None = None, spec_misses: int | None = None,
             spec_source: str = "the cluster spec", hosts: int = 1) -> Liveness:
    """The run's Liveness from --heartbeat, --heartbeat-misses and --keepalive (None: not given), falling back
    to a cluster spec's ``heartbeat`` and ``heartbeat_misses``, then to default_period(hosts) x 4 (0.25 s x 4 up
    to 16 hosts).

    bound = period x misses: any two of the three give the third; with one, misses is 4 unless given, then
    the period is default_period(hosts) unless given. --keepalive S alone is therefore 4 misses of S/4 s. All three given
    must agree. A LaunchError (exit 2) names the options that cannot hold together."""
    return _checked(_given(heartbeat, misses, keepalive, spec_heartbeat, spec_misses, default_period(hosts)),
                    ", ".join(n for n, v in (("--heartbeat", heartbeat), ("--heartbeat-misses", misses),
                                             ("--keepalive", keepalive)) if v is not None)
                    or f"heartbeat and heartbeat_misses in {spec_source}")


def _checked(live: Liveness, where: str) -> Liveness:
    from podrun.specs.limits import MAX_SECONDS

    if not live.bound <= MAX_SECONDS:
        raise LaunchError(f"a host lost after {live.bound:g} s of silence ({where}: {live.describe()}) is more than "
                          f"a week ({MAX_SECONDS:g} s)",
                          hint="give a shorter --heartbeat, fewer --heartbeat-misses or a shorter --keepalive "
                               "(default 0.25 s x 4 = 1 s up to 16 hosts)")
    if live.period < MIN_HEARTBEAT_S:
        raise LaunchError(f"a heartbeat every {live.period:g} s ({where}) is more often than every "
                          f"{MIN_HEARTBEAT_S:g} s",
                          hint="give a longer --heartbeat or --keepalive (default 0.25 s x 4 = 1 s up to 16 hosts)")
    return live


def _given(heartbeat, misses, keepalive, spec_heartbeat, spec_misses, period_default=HEARTBEAT_S) -> Liveness:
    for name, value in (("--heartbeat", heartbeat), ("--keepalive", keepalive)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise LaunchError(f"{name} {value:g} is not a number of seconds above 0")
    if misses is not None and not 1 <= misses <= MAX_MISSES:
        raise LaunchError(f"--heartbeat-misses {misses} is outside 1..{MAX_MISSES}")
    if keepalive is not None:
        if heartbeat is not None and misses is not None:
            if not math.isclose(heartbeat * misses, keepalive, rel_tol=1e-9):
                raise LaunchError(f"--keepalive {keepalive:g} disagrees with --heartbeat {heartbeat:g} x "
                                  f"--heartbeat-misses {misses} = {heartbeat * misses:g} s",
                                  hint="give two of the three (the bound is the period x the misses)")
            return Liveness(heartbeat, keepalive)
        if heartbeat is not None:
            if keepalive < heartbeat:
                raise LaunchError(f"--keepalive {keepalive:g} is shorter than --heartbeat {heartbeat:g}: every host "
                                  "would be lost between two heartbeats",
                                  hint="give a --keepalive of at least the heartbeat period (a few periods)")
            return Liveness(heartbeat, keepalive)
        return Liveness(keepalive / (misses if misses is not None else HEARTBEAT_MISSES), keepalive)
    if heartbeat is None and misses is None:
        heartbeat, misses = spec_heartbeat, spec_misses
    period = heartbeat if heartbeat is not None else period_default
    count = misses if misses is not None else HEARTBEAT_MISSES
    if heartbeat is None and misses is None:          # nothing given: the agents' default bound on the controller
        return Liveness(period, period * count, max(period * count, AGENT_DEFAULT_BOUND_S))
    return Liveness(period, period * count)
