"""The agent's command line: its options, the --env values on its stdin, and the instance and workers they name here."""
from __future__ import annotations

import argparse
import json
import os

from podrun.errors import PodrunError
from podrun.host.workers import worker_envs
from podrun.wire.liveness import FIRST_HEARTBEAT_S, HEARTBEAT_MISSES, HEARTBEAT_S

INDEX_ENV = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")


def parser(description: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m podrun.host.agent", description=description)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--master-addr", required=True)
    ap.add_argument("--master-port", type=int, required=True)
    ap.add_argument("--grace", type=float, default=5.0)
    ap.add_argument("--restart-count", type=int, default=0)
    ap.add_argument("--max-restarts", type=int, default=0)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--instance", type=int)
    g.add_argument("--index-from-env", action="store_true", help="the launcher's rank is the instance index")
    g.add_argument("--rank-from-env", action="store_true",
                   help="the launcher's rank is a worker's global rank: run that one worker (mpirun: each "
                        "worker is an MPI rank of one world)")
    ap.add_argument("--heartbeat", type=float, default=HEARTBEAT_S,
                    help="seconds between heartbeats to the controller")
    ap.add_argument("--stdin-timeout", type=float, default=HEARTBEAT_S * HEARTBEAT_MISSES,
                    help="seconds of silence on stdin (no controller heartbeat) after which the workers are ended")
    ap.add_argument("--no-stdin-watch", action="store_true")
    ap.add_argument("--agent-store", action="store_true",
                    help="if this instance runs global rank 0: hold --master-port from the start and serve the "
                         "run's TCPStore on it (podrun.host.store)")
    ap.add_argument("--listen-fd", type=int,
                    help="with --agent-store: the listening socket on --master-port, inherited from the controller")
    ap.add_argument("--hold", action="store_true",
                    help="report preflight facts (a probe line) and start workers only on a G on stdin")
    ap.add_argument("--needs", default="", metavar="MOD,...",
                    help="with --hold: report which of these modules this python cannot import")
    ap.add_argument("--warm", action="store_true",
                    help="fork workers from this host's zygote when it runs (podrun.host.zygote); start it when "
                         "it does not and --restart-count is below --max-restarts")
    ap.add_argument("--env-stdin", action="store_true",
                    help="read the run's --env first from stdin (podrun.wire.envchannel) and set it for the workers")
    ap.add_argument("--worker-stdin-fd", type=int, metavar="FD",
                    help="an inherited descriptor that local rank 0 reads as its stdin (the local transport's copy "
                         "of podrun's stdin); every other worker reads /dev/null")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    return ap


def read_env_stdin() -> None:
    """--env-stdin: the run's --env values, first on stdin (podrun.wire.envchannel), into this environment."""
    from podrun.wire.envchannel import EnvMessageError, read as read_env

    try:
        os.environ.update(read_env(0, FIRST_HEARTBEAT_S))
    except (EnvMessageError, OSError) as exc:
        raise SystemExit(f"podrun agent: --env-stdin: {exc}") from None


def instance_workers(args) -> tuple[int, list[int] | None, int | None, list[dict[str, str]]]:
    """(the instance index, the local ranks this agent runs (None: all of them), the local rank that tags the
    agent's own lines (--rank-from-env), their env contracts) from the plan file and --instance,
    --index-from-env or --rank-from-env."""
    from podrun.wire.worker_env import worker_of_rank
    from podrun.plan.model import Plan

    from podrun import safefs

    try:
        plan = Plan.from_dict(json.loads(safefs.read_trusted(args.plan, "plan", limit=safefs.RECORD_LIMIT)))
    except (PodrunError, OSError, ValueError) as exc:
        raise SystemExit(f"podrun agent: --plan: {exc}") from None
    local_ranks = agent_rank = None
    if args.rank_from_env:
        rank = instance_index_from_env(flag="--rank-from-env")
        try:
            index, agent_rank = worker_of_rank(plan, rank)
        except ValueError as exc:
            raise SystemExit(f"podrun agent: --rank-from-env: {exc}") from None
        local_ranks = [agent_rank]
    else:
        index = instance_index_from_env() if args.index_from_env else args.instance
    envs = worker_envs(plan, index, run_id=args.run_id, run_dir=args.run_dir, plan_path=args.plan,
                       master_addr=args.master_addr, master_port=args.master_port,
                       restart_count=args.restart_count, max_restarts=args.max_restarts,
                       agent_store=args.agent_store)
    if local_ranks is not None:
        envs = [envs[lr] for lr in local_ranks]
    return index, local_ranks, agent_rank, envs


def instance_index_from_env(environ=os.environ, flag: str = "--index-from-env") -> int:
    """The launcher's rank of this process (Open MPI, PMIx, PMI, Slurm)."""
    for name in INDEX_ENV:
        if environ.get(name, "").isdigit():
            return int(environ[name])
    raise SystemExit(f"podrun agent: {flag} but none of {', '.join(INDEX_ENV)} is set")
