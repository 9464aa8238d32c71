"""`podrun launch`'s watch options (--hang-timeout, --on-hang) and the console's progress view they come with."""
from __future__ import annotations

import math
import os
import sys
from typing import TYPE_CHECKING

import click

from podrun.cli.options import stacked
from podrun.launch.hangs import AUTO_FLOOR_S, AUTO_NO_STEPS_S, AUTO_STEPS, HANG_EXIT
from podrun.specs.limits import MAX_SECONDS, MIN_HANG_S

if TYPE_CHECKING:  # pragma: no cover
    from podrun.launch.options import HangOptions

HANG_TIMEOUT_HELP = (f"Seconds without progress from any rank (a runtime report, or any output line of a plain "
                     f"script) before the run counts as hung: podrun shows every rank's stack, then does what "
                     f"--on-hang says. auto (the default): {AUTO_STEPS} x the median step time with a floor of "
                     f"{AUTO_FLOOR_S:g} s once the runtime reports steps, {AUTO_NO_STEPS_S:g} s before; off: never. "
                     f"Not given: the recipe's hang_timeout, else the cluster spec's, else auto.")


class HangTimeout(click.ParamType):
    """auto, off, or seconds in MIN_HANG_S..MAX_SECONDS (as a spec's hang_timeout) in ASCII digits (words as given)."""

    name = "seconds|auto|off"

    def convert(self, value, param, ctx):
        from podrun.cli.types import ascii_number

        if value in ("auto", "off") or value is None:
            return value
        x = ascii_number(value)
        if x is None:
            self.fail(f"{str(value)[:40]!r} is not a number of seconds, auto or off", param, ctx)
        if not math.isfinite(x) or not MIN_HANG_S <= x <= MAX_SECONDS:
            self.fail(f"{str(value)[:40]!r}: give seconds from {MIN_HANG_S:g} to {MAX_SECONDS:g} (a week), auto or off",
                      param, ctx)
        return x


# the decorator block that adds the watch options to `podrun launch`
watch_options = stacked(
    click.option("--hang-timeout", type=HangTimeout(), default=None, metavar="SECONDS|auto|off",
                 help=HANG_TIMEOUT_HELP),
    click.option("--on-hang", type=click.Choice(["end", "dump"]), default="end", show_default=True,
                 help=f"On a hang: end (show every rank's stack, then end the run, exit {HANG_EXIT}) or dump (show "
                      "them and let the run go on; they are shown again after another silent window)."))


def watch_for(given: HangOptions, recipe=None, cluster=None):
    """The run's WatchOptions: --hang-timeout when given, else the recipe's hang_timeout, else the cluster
    spec's, else auto; the window's notices name where it came from."""
    from podrun.launch.hangs import WatchOptions

    choices = [(given.hang_timeout, "--hang-timeout")]
    if recipe is not None:
        choices.append((recipe.hang_timeout, f"hang_timeout in {os.path.join(recipe.path, 'recipe.yaml')}"))
    if cluster is not None:
        choices.append((cluster.hang_timeout, f"hang_timeout in {cluster.path}"))
    value, source = next(((v, s) for v, s in choices if v is not None), ("auto", "--hang-timeout"))
    off = value is False or value == "off"        # YAML reads a bare off as false
    return WatchOptions(hang_timeout=None if off else value, on_hang=given.on_hang, source=source)


def live_console(as_json: bool) -> bool:
    """Whether the progress view is a live line (rich on a terminal) rather than plain periodic lines."""
    stream = sys.stderr
    return (not as_json and stream.isatty() and sys.stdout.isatty() and "NO_COLOR" not in os.environ
            and not os.environ.get("CI") and os.environ.get("TERM") != "dumb")
