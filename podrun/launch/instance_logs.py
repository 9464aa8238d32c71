"""Each instance's output: runs/<id>/instance-<i>.log written as it comes (a log that cannot be written is given
up), torchrun's per-rank stream files (--redirects, --tee), and the console's sink."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from podrun import safefs
from podrun.errors import PodrunError
from podrun.rundir.layout import instance_log

# sink(instance, host, local_rank, stream, text): a worker's line, already filtered for the console
Sink = Callable[[int | None, str, int | None, str, str], None]


STREAM_BITS = {"out": 1, "err": 2}    # torchrun's Std: 1 stdout, 2 stderr, 3 both, 0 none


@dataclass(frozen=True)
class RankFiles:
    """torchrun's --tee and --redirects as given (``0``-``3``, or ``LOCAL_RANK:0-3,...``; None: not given): each
    local rank's streams written to attempt_<N>/<rank>/stdout.log and stderr.log, those of --redirects kept off the
    console."""

    tee: str | None = None
    redirects: str | None = None

    @staticmethod
    def bits(spec: str | None, local_rank: int | None) -> int:
        """The streams ``spec`` gives ``local_rank`` (one number: every rank's; per rank: 0 for a rank not named)."""
        if spec is None or local_rank is None:
            return 0
        text = spec.strip()
        if ":" not in text:
            return int(text)
        pairs = dict(p.strip().split(":") for p in text.split(","))
        return int(pairs.get(str(local_rank), 0))

    def to_file(self, local_rank: int | None, stream: str) -> bool:
        return bool((self.bits(self.tee, local_rank) | self.bits(self.redirects, local_rank)) & STREAM_BITS[stream])

    def on_console(self, local_rank: int | None, stream: str) -> bool:
        return not self.bits(self.redirects, local_rank) & STREAM_BITS[stream]


class InstanceLogs:
    """The open log of each instance, opened at its first line; one that fails (e.g. a full disk) is said once
    through ``notice`` and closed, and the run goes on with the console only. The console gets every instance's
    errors and podrun's own lines, and the output of ``only`` (None: every instance's)."""

    def __init__(self, run_dir: str, notice: Callable[[str], None], sink: Sink | None = None,
                 only: int | None = None, multi: bool = False, files: RankFiles = RankFiles(),
                 rank_path: Callable[[int, int, str], str] | None = None):
        self.run_dir = run_dir
        self.notice = notice
        self.sink = sink or (lambda *a: None)
        self.only = only
        self.multi = multi           # several workers per instance: a line shows its local rank
        self.logs = {}               # a file's name in the run dir -> it open, or None once it failed
        self.files = files           # --tee, --redirects: which streams also go to a rank's own file
        self.rank_path = rank_path   # (instance, local rank, stream) -> that file's path in the run dir

    def output(self, index: int | None, host: str, local_rank: int | None, stream: str, text: str) -> str:
        """A worker's line (or an agent's, local_rank None) to its log and the console; returns it as logged."""
        shown = f"[{local_rank}] {text}" if self.multi and local_rank is not None else text
        if index is not None:        # its instance's log, and its rank's own file under --tee / --redirects
            console = self.files.on_console(local_rank, stream)
            lines = [(instance_log(index), shown, f"instance {index}'s output")]
            if self.rank_path is not None and self.files.to_file(local_rank, stream):
                lines.append((self.rank_path(index, local_rank, stream), text, f"rank file of instance {index}"))
            for name, line, what in lines:
                self._append(name, line, what)
            if not console:
                return shown
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
        if index is not None:
            self._append(instance_log(index), text, f"instance {index}'s output")

    def _append(self, name: str, text: str, what: str) -> None:
        """``text`` as a line of the run directory's file ``name``, opened (its directories made) at its first."""
        f = self.logs.get(name, False)
        if f is None:                  # this log failed before: the console has the output
            return
        path = Path(self.run_dir) / name
        try:
            if f is False:
                for i in range(1, len(Path(name).parts)):      # attempt_<N>/<rank>/: private, as the run dir
                    safefs.make_dir(Path(self.run_dir, *Path(name).parts[:i]), "run directory")
                f = self.logs[name] = safefs.open_log(path)
            f.write(text + "\n")
        except (OSError, PodrunError) as exc:
            self.logs[name] = None
            if f:
                with contextlib.suppress(OSError):     # e.g. the last buffered line on a full disk
                    f.close()
            self.notice(f"cannot write {path}: {getattr(exc, 'strerror', None) or exc}; {what} goes on to the "
                        "console only")

    def close(self) -> None:
        for f in self.logs.values():
            if f:
                with contextlib.suppress(OSError):
                    f.close()
