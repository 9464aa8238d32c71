"""Batch-scheduler job scripts (Slurm, PBS, Grid Engine/ABCI) and host discovery inside an allocation."""
from __future__ import annotations

from podrun.jobscript.build import (
    DEFAULT_TRANSPORT, JobOptions, allocation_plan_options, check_allocation, default_job_name, device_kind_of,
    launch_argv, launch_cluster, plan_comments, plan_hosts, request_from_plan,
)
from podrun.specs.allocation import (
    Discovered, HostEntry, compress_hostlist, discover, expand_nodelist, read_pbs_nodefile,
    read_pe_hostfile, read_sge_hostlist,
)
from podrun.jobscript.job import (
    SCHEDULER_TABLE, SCHEDULERS, JobRequest, JobScriptError, Scheduler, check_scheduler, format_time, parse_time,
    validate,
)
from podrun.jobscript.writers import render, render_pbs, render_slurm, render_uge, submit_argv

__all__ = [
    "JobOptions", "JobRequest", "JobScriptError", "SCHEDULERS", "SCHEDULER_TABLE", "Scheduler", "check_scheduler",
    "allocation_plan_options", "launch_cluster", "render", "render_slurm", "render_pbs", "render_uge",
    "submit_argv", "parse_time", "format_time", "validate", "request_from_plan", "launch_argv",
    "plan_comments", "plan_hosts", "device_kind_of", "default_job_name", "check_allocation",
    "DEFAULT_TRANSPORT", "Discovered", "HostEntry", "discover", "expand_nodelist", "compress_hostlist",
    "read_pbs_nodefile", "read_pe_hostfile", "read_sge_hostlist",
]
