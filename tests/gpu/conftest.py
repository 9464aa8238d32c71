"""The CUDA-path tests' report: with PODRUN_GPU_TESTS_REPORT=FILE each test's outcome is appended to FILE as one JSON
line the moment it is known, so that bench/gpu_check.py keeps the results of a run it had to stop."""
from __future__ import annotations

import json
import os

REPORT_ENV = "PODRUN_GPU_TESTS_REPORT"


def _append(record: dict) -> None:
    path = os.environ.get(REPORT_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and not report.passed):
        message = None
        if report.failed:
            message = getattr(report.longrepr, "reprcrash", None)
            message = message.message if message is not None else str(report.longrepr)
            message = " | ".join(message.strip().splitlines()[:4])[:600]
        outcome = report.outcome if report.when == "call" else "skipped" if report.skipped else "error"
        _append({"test": report.nodeid, "outcome": outcome,
                 "seconds": round(report.duration, 2), "message": message})


def pytest_deselected(items):
    for item in items:
        _append({"test": item.nodeid, "outcome": "deselected", "seconds": 0.0, "message": None})
