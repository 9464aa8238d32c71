"""`podrun launch`'s options as one frozen object, grouped by concern: the CLI builds it once and passes it whole."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

from podrun.launch.request import SSHOptions
from podrun.launch.torchrun_cli import TorchrunOptions
from podrun.launch.torchrun_map import OwnOptions
from podrun.plan.inputs import PlanOptions


@dataclass(frozen=True)
class TargetOptions:
    """What the workers run: the arguments after the options, and how to read them."""

    args: tuple[str, ...] = ()
    dashdash: bool = False                      # the user wrote ``-- TARGET``: a command, never a recipe
    module: bool = False                        # -m: the target is a Python module
    no_python: bool = False                     # --no-python: the target is a command
    run_path: bool = False                      # --run-path: the target is a Python file, whatever it is named
    option_names: frozenset[str] = frozenset()  # podrun launch's own spellings (a recipe's arguments must not be one)
    needs: tuple[str, ...] = ()                 # modules every worker imports, checked before the start (preflight)


@dataclass(frozen=True)
class TransportOptions:
    """How podrun reaches the hosts and what it sets up there."""

    transport: str | None = None                # None: local here, srun in Slurm, else ssh
    ssh: SSHOptions = field(default_factory=SSHOptions)
    python: str | None = None                   # None: the controller's sys.executable
    workdir: str | None = None                  # None: the current directory
    master_addr: str | None = None
    master_port: int | None = None
    agent_store: bool = True
    data_interface: str | None = None           # None: the cluster spec's
    preflight: bool = True
    grace: float | None = None                  # None: the defaults (5 s, 30 s after SIGINT), or --shutdown-timeout
    heartbeat: float | None = None              # None: the cluster spec's (podrun.wire.liveness.settings)
    heartbeat_misses: int | None = None
    keepalive: float | None = None
    env_items: tuple[str, ...] = ()             # --env NAME=VALUE, as typed
    cpu_bind: str | None = None                 # --cpu-bind auto|none|LIST as typed (None: none)
    join_address: str | None = None             # --join-address HOST[:PORT]: where agents that join reach this one
    join_window: float | None = None            # --join-window: seconds each has to join (None: the first bound)
    mpi_ranks: bool = False                     # --mpi-ranks: under mpirun, one MPI rank (and agent) per worker

    @property
    def host_python(self) -> str:
        """The python the hosts run: --python, else the controller's own interpreter."""
        return self.python or sys.executable


@dataclass(frozen=True)
class RestartOptions:
    """What happens after a failure: restarts, the elastic re-plan, warm workers, stragglers; a resume by name."""

    resume_run: str | None = None               # --resume RUN: RUN's recorded arguments again (handled by the CLI)
    max_restarts: int | None = None             # None: 0, or one per host an --elastic run can lose
    elastic_min: int | None = None
    spare_hosts: str | None = None
    warm: bool = True
    straggler_timeout: float | None = None


@dataclass(frozen=True)
class OutputOptions:
    """What podrun shows and where it keeps the run."""

    only_output_from_instance: int | None = None
    dry_run: bool = False
    dry_run_shows: str = "auto"         # what --dry-run prints in full: "auto" (a summary at scale), "all", or a host
    as_json: bool = False
    run_id: str | None = None
    runs_dir: str | None = None
    prefix: bool = True                 # each worker line's [instance host] on the console (--no-prefix: none)


@dataclass(frozen=True)
class PoprunOptions:
    """The poprun flags a plan does not decide: V-IPU, MPI pass-through, output (podrun.launch.engines.poprun)."""

    vipu_server_host: str | None = None
    vipu_partition: str | None = None
    vipu_cluster: str | None = None
    num_ilds: int | None = None            # default: IPUs / 64, when more than one POD64
    numa_aware: bool = True
    mpi_global_args: str | None = None
    mpi_local_args: str | None = None
    only_output_from_instance: int | None = None
    print_topology: bool = False
    offline_mode: bool = False
    export_env: tuple[str, ...] = ()       # names passed to every instance (-x NAME)
    executable: str = "poprun"


@dataclass(frozen=True)
class EngineOptions:
    """Who starts the workers and how (podrun.cli.engine_options; podrun.launch.engines.resolve_engine reads it)."""

    engine: str | None = None                   # None: the cluster spec's, else torch
    mpi_args: str | None = None                 # extra mpirun arguments, quoted as one string
    poprun: PoprunOptions = PoprunOptions()     # --vipu-*, --num-ilds... as given


@dataclass(frozen=True)
class HangOptions:
    """--hang-timeout and --on-hang as given (podrun.cli.watch_options.watch_for makes the run's WatchOptions)."""

    hang_timeout: float | str | None = None     # seconds, auto or off; None: the recipe's, the cluster spec's, auto
    on_hang: str = "end"                        # end | dump


@dataclass(frozen=True)
class LiveOptions:
    """The run's live views besides podrun top's: the metrics endpoint, TensorBoard files (podrun.live)."""

    metrics_port: int | None = None             # None: no endpoint; 0: a free port
    metrics_address: str = "127.0.0.1"
    metrics_sd_dir: str | None = None           # also write the Prometheus file_sd target file there
    tensorboard: bool = False


@dataclass(frozen=True)
class LaunchOptions:
    """Everything `podrun launch` was told, by concern."""

    target: TargetOptions = field(default_factory=TargetOptions)
    torchrun: TorchrunOptions = field(default_factory=TorchrunOptions)
    pet_own: OwnOptions = field(default_factory=OwnOptions)   # podrun's own options that torchrun reads from PET_
    plan: PlanOptions = field(default_factory=PlanOptions)
    engine: EngineOptions = field(default_factory=EngineOptions)
    hangs: HangOptions = field(default_factory=HangOptions)
    transports: TransportOptions = field(default_factory=TransportOptions)
    restarts: RestartOptions = field(default_factory=RestartOptions)
    output: OutputOptions = field(default_factory=OutputOptions)
    calibration: str | None = None              # --calibration FILE|NAME: the plan's measured inputs (podrun.calibrate)
    live: LiveOptions = field(default_factory=LiveOptions)
