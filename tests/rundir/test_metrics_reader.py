"""One torch-free reader of metrics.jsonl: the launcher's step log (podrun.rundir.metrics.StepLog, which the elastic
re-plan reads) and podrun report (podrun.rundir.report) see the same training steps in the same file, and the step
log imports no torch."""
from __future__ import annotations

import json
import subprocess
import sys

from podrun.elastic.replan import first_step_after, last_step
from podrun.rundir.metrics import StepLog, read_metrics_counted
from podrun.rundir.report import read_run, summarize


def _step(n: int, t: float, **bad) -> str:
    return json.dumps({"kind": "step", "step": n, "time": t, "epoch": 0, "loss": 1.0 / n, "accuracy": 0.5,
                       "images_per_sec": 100.0, **bad})


LINES = [json.dumps({"kind": "run", "event": "start", "time": 1.0, "step": 0}),
         _step(1, 2.0), _step(2, 3.0), _step(3, 4.0),
         _step(4, 5.0, loss="nan"),              # a number written as a string: no reader uses it
         _step(5, 6.0, time="late"),             # a time that is not a number
         json.dumps({"kind": "step", "step": 6, "time": 6.5}),   # a script's own minimal step record
         json.dumps({"kind": "run", "event": "end", "time": 7.0, "step": 6, "checkpoints": ["ckpt-000000003.pt"],
                     "checkpoint_dir": "c"}),
         '{"kind": "step", "step": 7, "ti']     # torn last line


def test_elastic_scan_and_report_read_the_same_records(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("\n".join(LINES) + "\n")
    records, skipped = read_metrics_counted(tmp_path)
    assert skipped == 3
    steps = [(r["step"], r["time"]) for r in records if r["kind"] == "step"]
    assert steps == [(1, 2.0), (2, 3.0), (3, 4.0), (6, 6.5)]
    log = StepLog.read(tmp_path)
    assert list(log.steps) == steps           # the step log skips what the report skips
    assert last_step(log) == (6, 6.5)
    assert first_step_after(log, 3.5) == (3, 4.0)
    assert first_step_after(log, 6.5) == (None, None)
    run = read_run(tmp_path)            # the report draws the runner's complete records only
    assert summarize(run.records)["steps"] == 3 and run.skipped == 4
    assert log.end["checkpoints"] == ["ckpt-000000003.pt"]
    assert StepLog.read(tmp_path / "absent") == StepLog()


def test_the_step_log_imports_no_torch(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("\n".join(LINES) + "\n")
    code = ("import sys; from podrun.elastic.replan import last_step; from podrun.rundir.report import pointers; "
            "from podrun.rundir.metrics import StepLog; "
            f"print(last_step(StepLog.read({str(tmp_path)!r})), pointers({str(tmp_path)!r})); "
            "print([m for m in ('torch', 'numpy', 'matplotlib') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["(6, 6.5) 1 checkpoint(s) in c: ckpt-000000003.pt; "
                                       f"report: podrun report {tmp_path}", "[]"]


def test_the_runners_console_lines_round_numbers_and_the_file_keeps_them_whole(tmp_path):
    """The runner's console: `seconds=15.3 s`, not `seconds=15.251590013504028`; metrics.jsonl keeps every digit."""
    import io

    from podrun.rundir.metrics import MetricsWriter, format_line

    out = io.StringIO()
    w = MetricsWriter(tmp_path, stream=out, log_every=1)
    w.write({"kind": "step", "step": 1, "epoch": 0, "loss": 2.3, "accuracy": 0.1, "lr": 0.1,
             "images_per_sec": 1234.5678901})
    w.write({"kind": "epoch", "step": 1, "epoch": 0, "loss": 2.3, "accuracy": 0.1, "seconds": 15.251590013504028,
             "images_per_sec": 98.7654321})
    w.write({"kind": "run", "event": "end", "step": 1, "seconds": 15.251590013504028,
             "val_accuracy": 0.123456789, "val_loss": 2.302585092994046, "checkpoints": ["ckpt-000000001.pt"]})
    w.close()
    text = out.getvalue()
    assert "1,235 img/s" in text and "98.8 img/s  15.3 s" in text, text
    assert ("run end: step=1, seconds=15.3 s, val_accuracy=0.123, val_loss=2.3, "
            "checkpoints=['ckpt-000000001.pt']") in text, text
    assert "15.251590013504028" not in text and "0.123456789" not in text
    start = {"kind": "run", "event": "start", "step": 0, "samples": 0, "world_size": 2, "instances": 1,
             "local_batch": 32, "grad_accum": 1, "global_batch": 64, "steps_per_epoch": 22, "total_steps": 88,
             "lr": 0.025, "warmup_steps": 22, "device": "cpu", "amp": "off", "dataset": "digits", "train_size": 1438,
             "resumed_from": None}
    assert format_line(start) == ("training 88 steps on 2 workers (1 instance): local batch 32 x GA 1 = global batch "
                                  "64; 22 steps per epoch; lr 0.025 after 22 warm-up steps; cpu, amp off; data digits "
                                  "(1,438 training images); from the start")
    assert format_line({**start, "event": "resume", "step": 22, "resumed_from": "ckpt-22.pt"}).endswith(
        "; resumed at step 22 from ckpt-22.pt")
    kept = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert kept[2]["seconds"] == 15.251590013504028 and kept[1]["images_per_sec"] == 98.7654321
