"""Metrics: JSON lines per step and per epoch in the run directory, a short live console line, and the one reader
of them (torch-free: the launcher's step log, its last line and podrun report read through it)."""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from podrun import safefs
from podrun.human import human_number, human_seconds, human_value
from podrun.rundir.layout import METRICS


class MetricsWriter:
    """Appends one JSON object per line (``kind``: step | epoch | eval | checkpoint | run), each in one write. A
    line torn by a failed write (a full disk) or by a writer killed mid-line is ended before the next record, so
    the next one starts on a fresh line; a record that cannot be written is counted (``lost``) and said once on stderr,
    and training goes on."""

    def __init__(self, run_dir: str | os.PathLike | None, enabled: bool = True, console: bool = True,
                 log_every: int = 10, stream=None):
        self.enabled = enabled and run_dir is not None
        self.console = console and enabled
        self.log_every = max(1, log_every)
        self.stream = stream or sys.stdout
        self.path = Path(run_dir) / METRICS if run_dir is not None else None
        self._fd: int | None = None
        self.lost = 0                   # records not written (the disk refused them)
        self.error: str | None = None   # why the first of them was not
        self._check_end = True          # the file may end in a torn line: look before the next write
        if self.enabled:      # the directory this user's, no one else may write it; the file 0600, never a link
            safefs.own_dir(self.path.parent, "run directory")
            try:
                self._fd = safefs.open_private(self.path, read=True)
            except OSError as exc:
                raise safefs.UnsafePath(f"cannot append to {self.path}: {exc.strerror or exc}") from None

    def _torn(self) -> bool:
        """Whether the file ends inside a line."""
        size = os.fstat(self._fd).st_size
        return size > 0 and os.pread(self._fd, 1, size - 1) != b"\n"

    def write(self, record: dict[str, Any]) -> None:
        record = {"time": round(time.time(), 3), **record}
        if self._fd is not None:
            line = (json.dumps(record, default=float) + "\n").encode()
            try:
                if self._check_end and self._torn():
                    line = b"\n" + line
                self._check_end = False
                done = 0
                while done < len(line):
                    done += os.write(self._fd, line[done:])
            except OSError as exc:
                self._check_end = True
                self.lost += 1
                if self.error is None:
                    self.error = exc.strerror or str(exc)
                    print(f"podrun: cannot append to {self.path}: {self.error}; training goes on, the records "
                          "that cannot be written are counted and lost", file=sys.stderr, flush=True)
        if self.console:
            line = format_line(record, self.log_every)
            if line:
                print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            if self.lost:
                print(f"podrun: {self.lost} metrics record(s) not written to {self.path} ({self.error})",
                      file=sys.stderr, flush=True)


def format_line(r: dict[str, Any], log_every: int = 1) -> str | None:
    kind = r.get("kind")
    if kind == "step":
        if r["step"] % log_every and r["step"] != 1:
            return None
        return (f"step {r['step']:>6}  epoch {r['epoch']:>3}  loss {r['loss']:.4f}  acc {r['accuracy']:.3f}  "
                f"lr {r['lr']:.4g}  {human_number(r['images_per_sec'])} img/s")
    if kind == "eval":
        return (f"eval  step {r['step']:>6}  epoch {r['epoch']:>3}  val_loss {r['val_loss']:.4f}  "
                f"val_acc {r['val_accuracy']:.4f}")
    if kind == "epoch":
        return (f"epoch {r['epoch']:>3} done  loss {r['loss']:.4f}  acc {r['accuracy']:.3f}  "
                f"{human_number(r['images_per_sec'])} img/s  {human_seconds(r['seconds'])}")
    if kind == "run" and r.get("event") in ("start", "resume") and all(k in r for k in _START_FIELDS):
        return _start_sentence(r)
    if kind == "run":
        return f"run {r.get('event')}: " + ", ".join(f"{k}={human_value(k, v)}" for k, v in r.items()
                                                      if k not in ("kind", "event", "time"))
    return None


_START_FIELDS = ("step", "world_size", "instances", "local_batch", "grad_accum", "global_batch", "total_steps")


def _start_sentence(r: dict[str, Any]) -> str:
    """A run record that opens an attempt, as a sentence: "training 88 steps on 2 workers (1 instance): local batch
    32 x GA 1 = global batch 64; ...; from the start" (or "resumed at step 22 from ...")."""
    def plural(n, word: str) -> str:
        return f"{n:,} {word}{'' if n == 1 else 's'}"

    parts = [f"local batch {r['local_batch']} x GA {r['grad_accum']} = global batch {r['global_batch']}"]
    if isinstance(r.get("steps_per_epoch"), int):
        parts.append(f"{plural(r['steps_per_epoch'], 'step')} per epoch")
    if r.get("lr") is not None:
        warm = r.get("warmup_steps")
        parts.append(f"lr {human_value('lr', r['lr'])}" + (f" after {plural(warm, 'warm-up step')}"
                                                         if isinstance(warm, int) and warm > 0 else ""))
    if r.get("device") is not None:
        parts.append(str(r["device"]) + (f", amp {r['amp']}" if r.get("amp") is not None else ""))
    if r.get("dataset") is not None:
        size = r.get("train_size")
        parts.append(f"data {r['dataset']}" + (f" ({plural(size, 'training image')})" if isinstance(size, int) else ""))
    where = r.get("resumed_from")
    if r["event"] == "resume" or where:
        parts.append(f"resumed at step {r['step']}" + (f" from {where}" if where else ""))
    else:
        parts.append("from the start")
    return (f"training {plural(r['total_steps'], 'step')} on {plural(r['world_size'], 'worker')} "
            f"({plural(r['instances'], 'instance')}): " + "; ".join(parts))


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Every record, tolerating a torn last line (a worker killed mid-write) and any other unreadable line."""
    return read_metrics_counted(run_dir)[0]


def read_metrics_counted(run_dir: str | os.PathLike) -> tuple[list[dict[str, Any]], int]:
    """(records, lines skipped): a line that is not UTF-8, not a JSON object, or a record whose fields have the
    wrong types (see ``well_formed``) is skipped and counted, never raised."""
    records = list(iter_records(run_dir))
    out = [r for r in records if r is not None]
    return out, len(records) - len(out)


def iter_records(run_dir: str | os.PathLike) -> Iterator[dict[str, Any] | None]:
    """The run's records one at a time (``run_dir`` or the file itself), None for a line a reader must skip (not
    UTF-8, not a JSON object, or not ``well_formed``); blank lines are passed over. OSError if the file cannot be
    opened."""
    p = Path(run_dir)
    p = p if p.is_file() else p / METRICS
    with open(p, "rb") as f:
        yield from (_record(raw) for raw in f if raw.strip())


def _record(raw: bytes) -> dict[str, Any] | None:
    """One line's record; None unless it is UTF-8, a JSON object and ``well_formed``."""
    try:
        record = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) and well_formed(record) else None


@dataclass(frozen=True)
class StepLog:
    """metrics.jsonl as the elastic restarts and the launch's last line read it, once: each training step's
    (step, wall time) and each start or resume record's (wall time, where it resumed from: {"step", "source"
    ("snapshot" | "checkpoint"), "from_rank" (a snapshot's)}), in file order; and for the run's account
    (podrun.rundir.account) each step's (wall time, seconds) and each evaluation's and checkpoint save's."""

    steps: tuple[tuple[int, float], ...] = ()
    starts: tuple[tuple[float, dict[str, Any]], ...] = ()
    end: dict[str, Any] | None = None  # the last ``run``/``end`` record (where the kept checkpoints are, ...)
    step_s: tuple[tuple[float, float], ...] = ()   # (time, step_seconds) of the steps that say it
    evals: tuple[tuple[float, float], ...] = ()    # (time, seconds) of the evaluations that say it
    saves: tuple[tuple[float, float], ...] = ()    # (time, seconds): checkpoint saves the steps waited for
    stages: tuple[tuple[float, float], ...] = ()   # (time, seconds): --stage's copies to node-local disk

    @classmethod
    def read(cls, run_dir: str | os.PathLike) -> StepLog:
        """The run's readable records; empty when there is no metrics file."""
        acc = StepLogFeed()
        with contextlib.suppress(OSError):
            for r in filter(None, iter_records(run_dir)):
                acc.add(r)
        return acc.log()


class StepLogFeed:
    """A StepLog made a record at a time (StepLog.read's, and a live view's that reads metrics.jsonl as it grows:
    ``follow``)."""

    def __init__(self):
        self.steps: list = []
        self.starts: list = []
        self.end: dict[str, Any] | None = None
        self.timed: dict[str, list] = {"step": [], "eval": [], "checkpoint": [], "stage": []}
        self.offset = 0               # bytes of the file ``follow`` has taken

    def add(self, r: dict[str, Any]) -> None:
        """One well-formed record."""
        secs = r.get("step_seconds", r.get("seconds"))
        if r["kind"] in self.timed and "time" in r and is_number(secs):
            self.timed[r["kind"]].append((float(r["time"]), float(secs)))
        if r["kind"] == "step" and "time" in r:
            self.steps.append((r["step"], float(r["time"])))
        elif r["kind"] == "run" and r["event"] in ("resume", "start"):
            where = {k: r.get(k) for k in ("step", "source", "from_rank")} if r["event"] == "resume" \
                else {"step": 0, "source": None, "from_rank": None}
            self.starts.append((float(r.get("time", 0)), where))
        elif r["kind"] == "run" and r["event"] == "end":
            self.end = r

    def follow(self, run_dir: str | os.PathLike) -> StepLog:
        """The whole lines written to ``run_dir``'s metrics.jsonl since the last call taken in; the log so far."""
        records, self.offset = new_records(Path(run_dir) / METRICS, self.offset)
        for r in records:
            self.add(r)
        return self.log()

    def log(self) -> StepLog:
        return StepLog(tuple(self.steps), tuple(self.starts), self.end,
                       *(tuple(self.timed[k]) for k in ("step", "eval", "checkpoint", "stage")))


def new_records(path: str | os.PathLike, offset: int) -> tuple[list[dict[str, Any]], int]:
    """The well-formed records of the whole lines written to the metrics file ``path`` past byte ``offset`` (a file
    that is missing or a link: none), and the offset after them: a live view's way to follow metrics.jsonl."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return [], offset
    try:
        size = os.fstat(fd).st_size
        data = os.pread(fd, size - offset, offset) if size > offset else b""
    except OSError:
        return [], offset
    finally:
        os.close(fd)
    whole = data[:data.rfind(b"\n") + 1]
    return [r for r in map(_record, whole.splitlines()) if r is not None], offset + len(whole)


def is_integer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_FIELDS = {      # the numeric fields the runner writes, per kind (``step`` an integer)
    "step": ("step", "epoch", "loss", "accuracy", "images_per_sec"),
    "eval": ("step", "val_loss", "val_accuracy"),
    "epoch": ("step", "epoch"),
    "checkpoint": ("step", "seconds"),      # a save the steps waited for (rank 0's)
}
_OPTIONAL = ("images_per_sec_instance", "step_seconds", "seconds", "lr")   # numbers too, when present


def well_formed(r: dict[str, Any]) -> bool:
    """A record a reader can use: ``kind`` a string, ``time`` (when given) a number; for the known kinds
    ``step`` an integer and every numeric field that is present a number (records of other kinds are kept for
    their readers). A script's own minimal step records (``step`` and ``time``) are well formed; ``complete``
    says whether a record has every field the runner writes."""
    kind = r.get("kind")
    if "time" in r and not is_number(r["time"]):
        return False
    if kind == "run":
        return isinstance(r.get("event"), str) and ("step" not in r or is_integer(r["step"]))
    if kind not in _FIELDS:
        return isinstance(kind, str)
    return is_integer(r.get("step")) and all(is_number(r[k]) for k in (*_FIELDS[kind], *_OPTIONAL) if k in r)


def complete(r: dict[str, Any]) -> bool:
    """A well-formed record with every field the runner writes for its kind (what the report's curves need)."""
    return all(k in r for k in _FIELDS.get(r.get("kind"), ()))


def latest_by_step(records: Iterable[dict], kind: str) -> list[dict]:
    """Records of ``kind``, one per step (the last written wins: a resumed run redoes some steps)."""
    by = {r["step"]: r for r in records if r.get("kind") == kind}
    return [by[k] for k in sorted(by)]
