"""Helpers for engine/transport tests: run the real `podrun` CLI, collect RESULT lines."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ALLREDUCE = str(HERE / "allreduce_check.py")


def podrun(args, *, cwd, env=None, timeout=120) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "podrun", *args], cwd=cwd, env=e, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def results(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        i = line.find("RESULT ")
        if i >= 0:
            out.append(json.loads(line[i + len("RESULT "):]))
    return out


@pytest.fixture
def allreduce_script() -> str:
    return ALLREDUCE
