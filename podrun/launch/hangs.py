"""The hang window: --hang-timeout and --on-hang, and the window they give from the step times the runtime reports."""
from __future__ import annotations

from dataclasses import dataclass

HANG_EXIT = 125                # the run was ended because no rank made progress for --hang-timeout seconds
AUTO_FLOOR_S = 120.0           # --hang-timeout auto: never less than this
AUTO_STEPS = 20                # ... and this many times the median of the last AUTO_WINDOW step times
AUTO_WINDOW = 20
AUTO_NO_STEPS_S = 600.0        # --hang-timeout auto before any step was reported (plain scripts, start-up)
STARTUP_S = 60.0               # until the first progress of an attempt the window is at least this (imports)


@dataclass(frozen=True)
class WatchOptions:
    """How the controller watches a run: --hang-timeout (None: off, "auto", or seconds) and --on-hang."""

    hang_timeout: float | str | None = "auto"
    on_hang: str = "end"              # "end": dump the stacks, then end the run; "dump": dump and go on
    progress: bool = True             # forward the workers' progress reports to the console
    source: str = "--hang-timeout"    # where hang_timeout came from (the option, a recipe's or cluster's field)

    def window(self, step_times: list[float], started: bool = True) -> float | None:
        """The hang window in seconds now, given the recent step times (seconds) reported by the runtime;
        before the first progress (``started`` False: imports, rendezvous) at least STARTUP_S."""
        if self.hang_timeout is None:
            return None
        if self.hang_timeout != "auto":
            return float(self.hang_timeout) if started else max(float(self.hang_timeout), STARTUP_S)
        if not step_times:
            return AUTO_NO_STEPS_S
        recent = sorted(step_times[-AUTO_WINDOW:])
        return max(AUTO_FLOOR_S, AUTO_STEPS * recent[len(recent) // 2])
