"""The hang window (--hang-timeout, --on-hang, from the runtime's step times) and a plain script's busy-or-stuck judgement."""
from __future__ import annotations

from dataclasses import dataclass
from statistics import median_high

from podrun.human import human_seconds

HANG_EXIT = 125                # the run was ended because no rank made progress for --hang-timeout seconds
AUTO_FLOOR_S = 120.0           # --hang-timeout auto: never less than this
AUTO_STEPS = 20                # ... and this many times the median of the last AUTO_WINDOW step times
AUTO_WINDOW = 20
AUTO_NO_STEPS_S = 600.0        # --hang-timeout auto before any step was reported (plain scripts, start-up)
STARTUP_S = 60.0               # until the first progress of an attempt the window is at least this (imports)
EXIT_WINDOWS = 5               # every silent rank's program has returned: its exit may take this many windows


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
        return max(AUTO_FLOOR_S, AUTO_STEPS * median_high(step_times[-AUTO_WINDOW:]))

    def describe(self, window: float) -> str:
        """Where a ``window`` of seconds came from, as a notice says it: "auto window 10 min", "--hang-timeout 600",
        "hang_timeout 600 in <file>", or the start-up floor a shorter timeout gets before the first progress."""
        if self.hang_timeout in ("auto", None):
            where = "" if self.source == "--hang-timeout" else f", {self.source}"
            return f"auto window {human_seconds(window)}{where}"
        given = f"{float(self.hang_timeout):g}"
        named = (f"{self.source} {given}" if self.source.startswith("--")
                 else self.source.replace("hang_timeout", f"hang_timeout {given}", 1))
        if window > float(self.hang_timeout):
            return f"start-up floor {human_seconds(window)} before the first output; {named} after it"
        return named


# -- stuck or busy: a plain script (no step times from the runtime) is judged by two samples of every rank --
PROBE_GAP_S = 1.0              # the first sample is taken this long before the window ends (at most half of it)
CPU_FLOOR_S = 0.03             # CPU seconds a rank must use between the samples to count as busy ...
CPU_SHARE = 0.05               # ... and at least this share of the time between them


def probe_gap(window: float) -> float:
    """Seconds before the window ends at which a plain script's first sample is taken."""
    return min(PROBE_GAP_S, window / 2)


@dataclass(frozen=True)
class RankSample:
    """One rank seen once: its main thread's stack (None: no stack), whether that waits inside
    torch.distributed, and the CPU time of its process tree with the agent's clock when it was read."""

    stack: tuple | None
    waiting: bool
    cpu_s: float | None
    at: float | None

    def busy_since(self, before: "RankSample") -> str | None:
        """Why this rank moved since ``before`` ("its stack changed", "used 0.8 s of CPU in 1.0 s"), or None.
        A rank waiting in a collective is judged by its stack only (NCCL and some gloo paths spin the CPU)."""
        if self.stack is not None and before.stack is not None and self.stack != before.stack:
            return "its stack changed"
        if self.waiting or None in (self.cpu_s, before.cpu_s, self.at, before.at):
            return None
        used, dt = self.cpu_s - before.cpu_s, self.at - before.at
        if dt > 0 and used > max(CPU_FLOOR_S, CPU_SHARE * dt):
            return f"used {used:.2f} s of CPU in {dt:.1f} s"
        return None


def busy_ranks(before: dict, after: dict) -> dict:
    """The ranks (keys of both samples) that moved between two samples -> why; empty: every rank is still,
    the run is stuck. A rank seen only once gives no evidence either way."""
    whys = {key: a.busy_since(before[key]) for key, a in after.items() if key in before}
    return {key: why for key, why in whys.items() if why is not None}
