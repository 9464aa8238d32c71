"""Fixtures of the runtime tests: a snapshot host directory of this test's own, with its key."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest


@pytest.fixture
def host_dir(monkeypatch):
    """A host's snapshot directory under /dev/shm, this test's alone (a new snapshot key set), removed after."""
    from podrun.runtime import snapshot
    from podrun.wire.worker_env import SNAPSHOT_KEY_NAME

    monkeypatch.setenv(SNAPSHOT_KEY_NAME, uuid.uuid4().hex)
    d = Path("/dev/shm") / f"podrun-test-{uuid.uuid4().hex[:12]}" / "h1"
    yield d
    snapshot.remove(d)
