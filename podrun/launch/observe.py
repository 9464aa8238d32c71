"""The controller's observers: what a live view of a run (the metrics server, TensorBoard files) is told as it goes.

podrun.launch.run calls one RunObserver (Observers fans out to several): ``started`` once the run directory is held
(its line joins the start line), ``attempt`` as each attempt's Supervisor starts (the live state is read from it on
demand), ``progress`` with every worker's progress report, ``recorded`` with each summary.json written, ``close``
at the end. An observer that raises is said in one notice, closed and dropped; the run goes on.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # pragma: no cover
    from podrun.rundir.summary import Attempt, Summary


class RunObserver:
    """Told of the run as it goes; each method does nothing unless a live view overrides it."""

    what = "a live view"          # how a notice names it

    def started(self, request) -> str | None:
        """The run directory is made and held; what the start line adds (None: nothing)."""
        return None

    def attempt(self, supervisor, attempts: tuple[Attempt, ...], launch_no: int) -> None:
        """An attempt's Supervisor is about to run, after the earlier ``attempts`` of this run."""

    def progress(self, rank: int, host: str, record: dict) -> None:
        """A worker's progress report (podrun.runtime.progress)."""

    def recorded(self, summary: Summary) -> None:
        """summary.json was written with ``summary``."""

    def close(self) -> None:
        """The launch ends."""


class Observers(RunObserver):
    """Several observers as one: each call goes to each, in order; one that raises is said once and dropped."""

    def __init__(self, observers, notice: Callable[[str], None] | None = None):
        self.items = list(observers)
        self.notice = notice or (lambda t: None)

    def _each(self, name: str, *args) -> list:
        out = []
        for o in list(self.items):
            try:
                out.append(getattr(o, name)(*args))
            except Exception as exc:  # noqa: BLE001 - a live view must never stop the run
                self.items.remove(o)
                self.notice(f"{o.what} stopped: {exc}")
                if name != "close":
                    with contextlib.suppress(Exception):
                        o.close()
        return out

    def started(self, request) -> str | None:
        said = [s for s in self._each("started", request) if s]
        return "; ".join(said) if said else None

    def attempt(self, supervisor, attempts: tuple[Attempt, ...], launch_no: int) -> None:
        self._each("attempt", supervisor, attempts, launch_no)

    def progress(self, rank: int, host: str, record: dict) -> None:
        self._each("progress", rank, host, record)

    def recorded(self, summary: Summary) -> None:
        self._each("recorded", summary)

    def close(self) -> None:
        self._each("close")
