"""TensorBoard event files of a launch (`podrun launch --tensorboard`): the controller follows the run directory's
metrics.jsonl as the runner writes it and writes each step's scalars (loss, accuracy, learning rate, throughput, step
seconds, the step split), each evaluation's, and the account at each summary (seconds by category, goodput) into
runs/<id>/tensorboard/ through tensorboard's own event writer; `tensorboard --logdir runs/` shows them."""
from __future__ import annotations

import threading
from pathlib import Path

from podrun.launch.observe import RunObserver
from podrun.rundir.account import CATEGORIES
from podrun.rundir.layout import METRICS, SPLIT_PARTS, TENSORBOARD as SUBDIR, private_subdir
from podrun.rundir.metrics import is_number, new_records

FOLLOW_S = 1.0                 # how often metrics.jsonl is read for new records
NEEDS = "tensorboard.summary.writer.event_file_writer"     # the optional module the files are written with
MISSING = ("podrun: --tensorboard needs tensorboard (pip install 'podrun[metrics]'); the run goes on without "
           "TensorBoard files")
# a step record's fields and their tags
STEP_TAGS = {"loss": "train/loss", "accuracy": "train/accuracy", "lr": "train/lr",
             "images_per_sec": "train/samples_per_sec", "samples_per_sec": "train/samples_per_sec",
             "step_seconds": "train/step_seconds"}


def scalars(record: dict) -> dict[str, float]:
    """The tags and values one metrics.jsonl record gives (none for a kind that is not step or eval)."""
    out: dict[str, float] = {}

    def put(tag: str, v) -> None:
        if is_number(v):
            out[tag] = float(v)

    if record.get("kind") == "step":
        for k, tag in STEP_TAGS.items():
            put(tag, record.get(k))
        for part, v in (record.get("split") or {}).items() if isinstance(record.get("split"), dict) else ():
            if part in SPLIT_PARTS:
                put(f"split/{part}_seconds", v)
    elif record.get("kind") == "eval":
        for k, v in record.items():
            if k not in ("kind", "time", "step", "epoch"):
                put(f"eval/{k}", v)
    return out


class EventFiles(RunObserver):
    """Follows metrics.jsonl from the run's start to its end in a thread of its own; writes the account at each
    summary."""

    what = "the TensorBoard files"

    def __init__(self):
        self.writer = None
        self.path: Path | None = None
        self.offset = 0
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.thread: threading.Thread | None = None
        self.last_step = 0

    def started(self, request) -> str:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        where = private_subdir(request.run_dir, SUBDIR, "TensorBoard directory")
        self.writer = EventFileWriter(str(where))
        self.path = Path(request.run_dir) / METRICS
        self.thread = threading.Thread(target=self._follow, name="podrun-tensorboard", daemon=True)
        self.thread.start()
        return f"TensorBoard files in {where}"

    def _add(self, step: int, wall: float, values: dict[str, float]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        if values:
            self.writer.add_event(Event(wall_time=wall, step=step, summary=Summary(
                value=[Summary.Value(tag=t, simple_value=v) for t, v in values.items()])))

    def _follow(self) -> None:
        while not self.done.wait(FOLLOW_S):
            self.read()

    def read(self) -> None:
        """The records written since the last read (whole lines only)."""
        with self.lock:
            if self.writer is None:
                return
            records, self.offset = new_records(self.path, self.offset)
            for r in records:
                if not isinstance(r.get("step"), int):
                    continue
                self.last_step = max(self.last_step, r["step"])
                self._add(r["step"], float(r.get("time", 0.0)), scalars(r))
            self.writer.flush()

    def recorded(self, summary) -> None:
        """``summary`` (a podrun.rundir.summary.Summary): its account as scalars at the last step."""
        if summary.account is None or self.writer is None:
            return
        acc = summary.account.record()
        self.read()
        secs = acc.get("seconds") or {}
        values = {f"account/{c}_seconds": secs.get(c) for c in CATEGORIES}
        values["account/goodput"] = acc.get("goodput")
        with self.lock:
            self._add(self.last_step, float(acc.get("until") or 0.0),
                      {k: float(v) for k, v in values.items() if isinstance(v, (int, float))})
            self.writer.flush()

    def close(self) -> None:
        self.done.set()
        if self.thread is not None:
            self.thread.join(timeout=10)
        self.read()
        with self.lock:
            if self.writer is not None:
                self.writer.close()
                self.writer = None
