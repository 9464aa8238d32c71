"""Fixtures for the model tests: one intra-op thread while they run.

On the shared 2-core CI machine, torch's default of one OpenMP thread per core makes every op
spin-wait against the other test processes (measured here: 50 s with the default, 12 s with one
thread, for the same tests); the previous setting is restored afterwards.
"""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
