"""One podrun per node: `srun podrun launch ...` or torchrun-style copies (--nnodes N --node-rank R --master-addr A).

When podrun finds itself one of N copies of the same command line (``detect``), copy 0 (node rank 0) becomes the
run's controller: it runs instance 0's agent on its own host and listens on the join address for the others (the
``join`` transport, podrun.launch.transports.join). Every other copy plans nothing: it joins the controller at that
address as its node rank's instance, proving the run's key (podrun.wire.join), receives the agent's arguments and
becomes that agent (``become_agent``: exec, the connection kept). The key is a secret every copy shares, which no
copy can derive from what Slurm or a launcher gives them all (job and step ids, host names are known to others): it
comes from their environment, PODRUN_JOIN_KEY, where set; else it is the user's own key, kept in a private file in
the home directory that the nodes share (podrun.wire.join.user_key: made on first use). The copies meet on the
join address: --join-address HOST:PORT, else the host of node rank 0 (the first node of the step under srun, else
--master-addr) and JOIN_PORT.
"""
from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass, replace

from podrun.errors import LaunchError
from podrun.launch.torchrun_map import RDZV_DEFAULT_PORT
from podrun.wire import join as wire_join

#: the port the copies meet on when --join-address names none: torchrun's c10d rendezvous default (--rdzv-endpoint)
JOIN_PORT = RDZV_DEFAULT_PORT
# what srun sets in each task of a step (the batch script's own step has no SLURM_STEP_NUM_TASKS)
SLURM_COPY_VARS = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST", "SLURM_STEP_ID", "SLURM_JOB_ID")


@dataclass(frozen=True)
class Copy:
    """This podrun's place among the copies: its node ``rank`` of ``count``, where they meet, the run they share."""

    rank: int
    count: int
    address: str                        # the join address, HOST:PORT
    run_id: str
    hosts: tuple[str, ...] | None       # each node rank's host when known (srun's step), else None
    source: str                         # what made the copies: "srun" or "--node-rank"


def detect(environ, node_rank: str | None, nnodes: str | None, master_addr: str | None, run_id: str | None,
           join_address: str | None) -> Copy | None:
    """This podrun's Copy when it is one of several: a task of an srun step of more than one task (SLURM_PROCID,
    SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST), or started with torchrun's --node-rank and --nnodes N (N > 1, with
    --master-addr); None for the one podrun of a run (--node-rank alone is refused as before). A LaunchError
    (exit 2) for copies that cannot meet: a key file another user could know or change, a node rank outside
    --nnodes, no --master-addr, no run id they share. Without PODRUN_JOIN_KEY in ``environ`` the user's key file's
    key is put there, as the variable would be (taken out of it before any worker starts)."""
    copy = _slurm_copy(environ, run_id, join_address)
    if copy is None and node_rank is not None and nnodes is not None and nnodes.isdigit() and int(nnodes) > 1:
        copy = _torchrun_copy(node_rank, int(nnodes), master_addr, run_id, join_address)
    if copy is None:
        return None
    if environ.get(wire_join.KEY_ENV) is None:       # the variable wins; else this user's key, kept as ssh keys are
        path = wire_join.user_key_path(environ)
        try:
            environ[wire_join.KEY_ENV] = wire_join.user_key(path)   # taken out again before any worker starts
        except ValueError as exc:
            raise LaunchError(f"copy {copy.rank} of {copy.count} ({copy.source}): {exc}") from None
    problem = wire_join.key_problem(environ.get(wire_join.KEY_ENV))
    if problem is not None:
        raise LaunchError(
            f"this podrun launch is copy {copy.rank} of {copy.count} ({copy.source}): copy 0 becomes the run's "
            f"controller and the others join it as its agents, proving a key every copy shares; {problem}",
            hint=f"unset {wire_join.KEY_ENV} to use your own key file ({wire_join.user_key_path(environ)}, made on "
                 "first use), or set it to a secret of 64 hex digits (python3 -c 'import secrets; "
                 "print(secrets.token_hex(32))')")
    return copy


def _address(join_address: str | None, host: str) -> str:
    if join_address is None:
        return wire_join.format_address(host, JOIN_PORT)
    try:
        given, port = wire_join.parse_address(join_address)
    except ValueError as exc:
        raise LaunchError(f"--join-address {exc}", hint="write HOST or HOST:PORT") from None
    return wire_join.format_address(given, port if port is not None else JOIN_PORT)


def _slurm_copy(environ, run_id: str | None, join_address: str | None) -> Copy | None:
    if not all(environ.get(v) for v in SLURM_COPY_VARS):
        return None
    try:
        rank, count = int(environ["SLURM_PROCID"]), int(environ["SLURM_STEP_NUM_TASKS"])
    except ValueError:
        return None
    if count < 2:
        return None
    from podrun.specs.allocation import expand_nodelist

    nodes = expand_nodelist(environ["SLURM_STEP_NODELIST"], "SLURM_STEP_NODELIST")
    if len(nodes) != count:
        raise LaunchError(f"srun started {count} copies of podrun launch on {len(nodes)} node(s) "
                          f"({environ['SLURM_STEP_NODELIST']}): one podrun per node runs one copy on each node",
                          hint="srun --ntasks-per-node=1 podrun launch ... (podrun starts each node's workers)")
    step = f"{environ['SLURM_JOB_ID']}.{environ['SLURM_STEP_ID']}"
    return Copy(rank, count, _address(join_address, nodes[0]), run_id or f"srun-{step}", tuple(nodes), "srun")


def _torchrun_copy(node_rank: str, count: int, master_addr: str | None, run_id: str | None,
                   join_address: str | None) -> Copy:
    if not node_rank.isdigit() or not 0 <= int(node_rank) < count:
        raise LaunchError(f"--node-rank {node_rank} with --nnodes {count}: one podrun per node takes a node rank "
                          f"from 0 to {count - 1}",
                          hint="e.g. --nnodes 2 --node-rank 0 on the first node and --node-rank 1 on the second")
    if master_addr is None and join_address is None:
        raise LaunchError(f"--node-rank {node_rank}: the copies meet at node rank 0's host, which --master-addr "
                          "names", hint="give every copy the same --master-addr (node rank 0's host)")
    if run_id is None:
        raise LaunchError(f"--node-rank {node_rank}: the copies of one run share its run id",
                          hint="give every copy the same --run-id ID (or torchrun's --rdzv-id ID)")
    return Copy(int(node_rank), count, _address(join_address, master_addr or ""), run_id, None, "--node-rank")


def unnamed_host(rank: int) -> str:
    """The plan's name for node rank ``rank``'s host until its copy joins and is ready (its agent's host name then
    names it: podrun.launch.transports.join.ListenTransport.host_named)."""
    return f"node-rank-{rank}"


def controller_options(copy: Copy, opts):
    """Copy 0's LaunchOptions: the run on ``count`` hosts (the step's nodes in node rank order, else this host and
    a name per node rank), the ``join`` transport listening on the copies' address, their run id, one attempt."""
    if opts.restarts.max_restarts not in (None, 0) or opts.restarts.elastic_min is not None:
        raise LaunchError(f"one podrun per node ({copy.source}) runs one attempt: each copy that joins becomes that "
                          "attempt's agent on its node and ends with it, and only your launcher (srun, pdsh) could "
                          "start copies again, so no restart or --elastic re-plan has agents to run on",
                          hint="for restarts or --elastic run one podrun launch for the whole job (--transport srun "
                               "in a Slurm allocation, mpirun elsewhere): each attempt is a new step on the hosts "
                               "left, whose agents join again")
    hosts = copy.hosts or (socket.gethostname(), *(unnamed_host(r) for r in range(1, copy.count)))
    return replace(
        opts, plan=replace(opts.plan, hosts_opt=",".join(hosts), nodes=copy.count),
        torchrun=replace(opts.torchrun, node_rank=None, nnodes=None),
        transports=replace(opts.transports, transport="join", join_address=copy.address),
        output=replace(opts.output, run_id=copy.run_id))


def become_agent(copy: Copy, env_items: tuple[str, ...], window: float | None) -> None:
    """A copy of node rank > 0: join the controller (trying for the join window, ``window`` or the first heartbeat's
    bound, while copy 0 starts), then exec the agent it names over the same connection; the run's --env values set
    from this copy's own environment (no value travels). Exits 2 with one line naming the address when it cannot
    join."""
    from podrun.launch.request import parse_env_options
    from podrun.wire.liveness import FIRST_HEARTBEAT_S

    env = parse_env_options(env_items)
    key = wire_join.take_key()
    bound = window if window is not None else FIRST_HEARTBEAT_S
    try:
        conn, args = wire_join.join(copy.address, key, copy.run_id, copy.rank, bound, copy=True)
    except wire_join.UnprovenListener as exc:        # one line: what to do depends on who holds the port
        raise LaunchError(f"copy {copy.rank} of {copy.count} ({copy.source}): {exc}") from None
    except wire_join.JoinError as exc:
        raise LaunchError(f"copy {copy.rank} of {copy.count} ({copy.source}): {exc}",
                          hint="start copy 0 (node rank 0) too, with the same command line and key") from None
    os.environ.update(dict(env))
    fd = conn.detach()
    os.set_inheritable(fd, True)
    try:
        os.chdir(args.workdir)
    except OSError as exc:
        raise LaunchError(f"copy {copy.rank}: the run's working directory {args.workdir} is not here: "
                          f"{exc.strerror}", hint="run the copies in a directory every node shares") from None
    from podrun import pystart
    from podrun.wire.agent_args import with_options

    argv = [sys.executable, *with_options(list(args.argv[1:]), "--join-fd", str(fd))]
    if not pystart.is_helper(argv):
        raise LaunchError(f"copy {copy.rank} of {copy.count}: what the run's controller sent is not an agent's "
                          "command line; nothing was run", hint="start the copies with the same podrun")
    sys.stdout.flush()
    sys.stderr.flush()
    pystart.execv(argv)
