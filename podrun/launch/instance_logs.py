"""runs/<id>/instance-<i>.log: each instance's output written as it comes; a log that cannot be written is given up."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from podrun import safefs
from podrun.rundir.layout import instance_log


class InstanceLogs:
    """The open log of each instance, opened at its first line; one that fails (e.g. a full disk) is said once
    through ``notice`` and closed, and the run goes on with the console only."""

    def __init__(self, run_dir: str, notice: Callable[[str], None]):
        self.run_dir = run_dir
        self.notice = notice
        self.logs = {}               # instance -> its open file, or None once it failed

    def write(self, index: int | None, text: str) -> None:
        if index is None:
            return
        f = self.logs.get(index, False)
        if f is None:                  # this log failed before: the console has the output
            return
        path = Path(self.run_dir) / instance_log(index)
        try:
            if f is False:
                f = self.logs[index] = safefs.open_log(path)
            f.write(text + "\n")
        except OSError as exc:
            self.logs[index] = None
            if f:
                _close_quietly(f)
            self.notice(f"cannot write {path}: {exc.strerror or exc}; instance {index}'s output goes on "
                        "to the console only")

    def close(self) -> None:
        for f in self.logs.values():
            if f:
                _close_quietly(f)


def _close_quietly(f) -> None:
    try:
        f.close()
    except OSError:            # e.g. the last buffered line on a full disk
        pass
