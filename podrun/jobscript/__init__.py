"""Batch-scheduler job scripts (Slurm, PBS, Grid Engine/ABCI) and host discovery inside an allocation."""
from __future__ import annotations

from podrun.jobscript.build import (
    JobOptions, allocation_plan_options, check_allocation, launch_argv, request_from_plan,
)
from podrun.specs.allocation import (
    compress_hostlist, discover, expand_nodelist, read_pbs_nodefile, read_pe_hostfile, read_sge_hostlist,
)
from podrun.jobscript.job import SCHEDULER_TABLE, SCHEDULERS, JobRequest, format_time, parse_time
from podrun.jobscript.writers import render, submit_argv

__all__ = [
    "JobOptions", "JobRequest", "SCHEDULERS", "SCHEDULER_TABLE", "allocation_plan_options", "render", "submit_argv",
    "parse_time", "format_time", "request_from_plan", "launch_argv", "check_allocation", "discover",
    "expand_nodelist", "compress_hostlist", "read_pbs_nodefile", "read_pe_hostfile", "read_sge_hostlist",
]
