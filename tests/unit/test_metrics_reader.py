"""One torch-free reader of metrics.jsonl: the launcher's elastic scan (podrun.launch.elastic) and podrun report
(podrun.train.report) see the same training steps in the same file, and the scan imports no torch."""
from __future__ import annotations

import json
import subprocess
import sys

from podrun.launch.elastic import first_step_after, last_step
from podrun.train.metrics import end_record, read_metrics_counted, step_times
from podrun.train.report import read_run, summarize


def _step(n: int, t: float, **bad) -> str:
    return json.dumps({"kind": "step", "step": n, "time": t, "epoch": 0, "loss": 1.0 / n, "accuracy": 0.5,
                       "images_per_sec": 100.0, **bad})


LINES = [json.dumps({"kind": "run", "event": "start", "time": 1.0, "step": 0}),
         _step(1, 2.0), _step(2, 3.0), _step(3, 4.0),
         _step(4, 5.0, loss="nan"),              # a number written as a string: not a readable step
         _step(5, 6.0, time="late"),             # a time that is not a number
         json.dumps({"kind": "run", "event": "end", "time": 7.0, "step": 3, "checkpoints": ["ckpt-000000003.pt"],
                     "checkpoint_dir": "c"}),
         '{"kind": "step", "step": 6, "ti']     # torn last line


def test_elastic_scan_and_report_agree_on_the_last_step(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("\n".join(LINES) + "\n")
    records, skipped = read_metrics_counted(tmp_path)
    assert skipped == 3
    assert summarize(read_run(tmp_path).records)["steps"] == 3
    assert last_step(tmp_path) == (3, 4.0)              # the scan skips what the report skips
    assert first_step_after(tmp_path, 3.5) == (3, 4.0)
    assert first_step_after(tmp_path, 4.0) == (None, None)
    assert list(step_times(tmp_path)) == [(r["step"], r["time"]) for r in records if r["kind"] == "step"]
    assert end_record(tmp_path)["checkpoints"] == ["ckpt-000000003.pt"]
    assert end_record(tmp_path / "absent") is None and last_step(tmp_path / "absent") == (None, None)


def test_the_elastic_scan_imports_no_torch(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("\n".join(LINES) + "\n")
    code = ("import sys; from podrun.launch.elastic import last_step; from podrun.train.report import pointers; "
            f"print(last_step({str(tmp_path)!r}), pointers({str(tmp_path)!r})); "
            "print([m for m in ('torch', 'numpy', 'matplotlib') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["(3, 4.0) 1 checkpoint(s) in c: ckpt-000000003.pt; "
                                       f"report: podrun report {tmp_path}", "[]"]
