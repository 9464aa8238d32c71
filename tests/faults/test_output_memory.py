"""podrun and its agent keep memory bounded whatever a worker writes: many lines, or one huge line."""
from __future__ import annotations

import pytest

from tests.faults.memory import podrun_output
from tests.ports import free_port

pytestmark = pytest.mark.timeout(300)
BOUND_MB = 100


@pytest.mark.parametrize("mode", ["lines", "oneline"])
def test_peak_memory_stays_under_100_mb_for_100_mb_of_output(tmp_path, mode):
    r = podrun_output(tmp_path, 100, mode, free_port(2))
    assert r["podrun_mb"] < BOUND_MB and r["agent_mb"] < BOUND_MB, r
    log = r["log"].read_text()
    if mode == "oneline":      # cut at 64 KiB, and said so, with the count of what was dropped
        first, second = log.splitlines()[:2]
        assert first.startswith("y" * 65536 + " [podrun: line longer than 65536 bytes cut here")
        assert second == f"[podrun: dropped {100 * 2**20 - 65536} more bytes of the line cut above]"
    else:
        assert log.count("x" * 1023 + "\n") == 100 * 1024     # every line, whole
