"""The click options of `podrun launch` that choose and tune the engine (podrun.launch.engines resolves them)."""
from __future__ import annotations

import click

from podrun.cli import types as t
from podrun.cli.options import stacked
from podrun.launch.engines import ENGINES

engine_options = stacked(
    click.option("--engine", type=click.Choice(list(ENGINES)), default=None,
                 help="Who starts the workers: torch (podrun's agents; default), poprun (IPU-PODs), "
                 "horovod (mpirun, one rank per worker). Default: the cluster spec's."),
    click.option("--mpi-args", default=None, help="Extra mpirun arguments (quoted as one string), for "
                 "--transport mpirun and --engine horovod."),
    click.option("--vipu-server-host", help="poprun: V-IPU controller host."),
    click.option("--vipu-partition", help="poprun: V-IPU partition."),
    click.option("--vipu-cluster", help="poprun: V-IPU cluster."),
    click.option("--num-ilds", type=t.NUM_ILDS, help="poprun: IPU-Link domains (default IPUs / 64 above a POD64)."),
    click.option("--mpi-global-args", help="poprun: --mpi-global-args."),
    click.option("--mpi-local-args", help="poprun: --mpi-local-args."),
    click.option("--print-topology", is_flag=True, help="poprun: --print-topology=yes."),
    click.option("--offline-mode", is_flag=True, help="poprun: --offline-mode=on (no IPUs attached)."),
)

