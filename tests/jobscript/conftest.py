"""Fixtures for the job-script tests: a clean scheduler-free environment and an in-process CLI runner."""
from __future__ import annotations

import pytest

SCHEDULER_VARS = ("SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_JOB_ID", "PBS_NODEFILE", "PE_HOSTFILE",
                  "SGE_JOB_HOSTLIST")


@pytest.fixture(autouse=True)
def no_allocation(monkeypatch):
    """Tests start outside any scheduler allocation, even when CI itself runs inside one."""
    for var in SCHEDULER_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def podrun_cli(capsys):
    """Run `podrun ARGS` in this process through the real entry point: (exit code, stdout, stderr)."""
    from podrun.cli.main import main

    def run(*argv: str):
        code = main(list(argv))
        out = capsys.readouterr()
        return code, out.out, out.err

    return run
