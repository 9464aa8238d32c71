"""The job options `podrun script` and `podrun submit` both take: one table, in --help's order."""
from __future__ import annotations

import click

from podrun.cli import types as t
from podrun.cli.options import stacked

# every option of a job script is here (a JobOptions field each, or the plan's or the command's own where said), so
# `submit` writes every script `script` writes
job_options = stacked(
    click.option("--time", "time_limit", help="Wall time: HH:MM:SS, D-HH:MM:SS, or 90m / 2h."),
    click.option("--partition", help="Slurm partition (PBS queue when --queue is not given)."),
    click.option("--queue", help="PBS / Grid Engine queue (Slurm partition when --partition is not given; default: "
                                 "the cluster spec's jobs.queue)."),
    click.option("--group", help="ABCI's group: Grid Engine `qsub -g GROUP`, PBS `#PBS -P GROUP`."),
    click.option("--account", help="Account to charge (sbatch --account, qsub -A)."),
    click.option("--job-name", help="Job name (default podrun-<recipe>)."),
    click.option("--module", "modules", multiple=True, help="`module load NAME` before the launch (repeatable)."),
    click.option("--env", "env", multiple=True, help="NAME=VALUE exported in the job (repeatable)."),
    click.option("--cpus-per-node", type=t.CPUS, help="CPUs per node (--cpus-per-task, ncpus=)."),
    click.option("--cpu-bind", metavar="auto|none|LIST", help="The job's podrun launch --cpu-bind: each worker bound "
                                                              "to its share of the node's cores."),
    click.option("--transport", help="How podrun launch starts instances in the job (default: srun on Slurm, mpirun "
                                     "on PBS and with a Grid Engine resource, ssh with --pe)."),
    click.option("--ssh-config", help="ssh config file podrun launch uses in the job (--transport ssh; default "
                                      "~/.ssh/config)."),
    click.option("--pe", help="Grid Engine parallel environment: `#$ -pe PE NODES` (one slot per host) instead of a "
                              "resource (default: the cluster spec's jobs.pe)."),
    click.option("--resource", help="Grid Engine: `#$ -l NAME=NODES`, whole nodes (default: the cluster spec's "
                                    "jobs.resource, ABCI's rt_F)."),
    click.option("--directive", "directives", multiple=True, help="Extra directive, e.g. '-l USE_SSH=1' or "
                                                                  "'--exclusive' (repeatable)."),
    click.option("--log-dir", help="Folder for the job's stdout/stderr; it must exist when the job starts (submit: "
                                   "default its run directory)."),
    click.option("--workdir", help="cd here in the job (default: the directory the job is submitted from)."),
    click.option("--vipu-server-host", help="IPU-PODs: the V-IPU controller the job's poprun uses (default "
                                            "$IPUOF_VIPU_API_HOST, else the cluster spec's vipu)."),
    click.option("--vipu-partition", help="IPU-PODs: the V-IPU partition the job's poprun uses (default "
                                          "$IPUOF_VIPU_API_PARTITION_ID, else the cluster spec's vipu)."),
    click.option("--job-python", "python", help="Interpreter the job runs podrun launch with (default: this one, "
                                                "sys.executable)."),
)
