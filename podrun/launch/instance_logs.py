"""Each instance's output: runs/<id>/instance-<i>.log written as it comes (a log that cannot be written is given
up), and the console's sink."""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable

from podrun import safefs
from podrun.rundir.layout import instance_log

# sink(instance, host, local_rank, stream, text): a worker's line, already filtered for the console
Sink = Callable[[int | None, str, int | None, str, str], None]


class InstanceLogs:
    """The open log of each instance, opened at its first line; one that fails (e.g. a full disk) is said once
    through ``notice`` and closed, and the run goes on with the console only. The console gets every instance's
    errors and podrun's own lines, and the output of ``only`` (None: every instance's)."""

    def __init__(self, run_dir: str, notice: Callable[[str], None], sink: Sink | None = None,
                 only: int | None = None, multi: bool = False):
        self.run_dir = run_dir
        self.notice = notice
        self.sink = sink or (lambda *a: None)
        self.only = only
        self.multi = multi           # several workers per instance: a line shows its local rank
        self.logs = {}               # instance -> its open file, or None once it failed

    def output(self, index: int | None, host: str, local_rank: int | None, stream: str, text: str) -> str:
        """A worker's line (or an agent's, local_rank None) to its log and the console; returns it as logged."""
        shown = f"[{local_rank}] {text}" if self.multi and local_rank is not None else text
        self.write(index, shown)
        if self.only is None or index == self.only or stream == "err" or index is None:
            try:
                self.sink(index, host, local_rank, stream, text)
            except Exception:  # noqa: BLE001 - a closed terminal/pipe must not stop supervision
                self.sink = lambda *a: None
        return shown

    def partial(self, index: int, host: str, local_rank: int | None, part) -> None:
        """A worker's line not ended yet (a protocol.Part) to a console that shows one (its sink's ``partial``);
        the log gets the line once it ends."""
        if self.only is None or index == self.only or part.stream == "err":
            try:
                getattr(self.sink, "partial", lambda *a: None)(index, host, local_rank, part)
            except Exception:  # noqa: BLE001 - a closed terminal/pipe must not stop supervision
                self.sink = lambda *a: None

    def interrupted(self) -> None:
        """The run is being stopped by a signal: a console that has a quieter form for it takes it."""
        with contextlib.suppress(Exception):
            getattr(self.sink, "interrupted", lambda: None)()

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
                with contextlib.suppress(OSError):     # e.g. the last buffered line on a full disk
                    f.close()
            self.notice(f"cannot write {path}: {exc.strerror or exc}; instance {index}'s output goes on "
                        "to the console only")

    def close(self) -> None:
        for f in self.logs.values():
            if f:
                with contextlib.suppress(OSError):
                    f.close()
