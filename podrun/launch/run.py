"""One launch end to end: build the request, preflight, run under the supervisor, restart, write the run dir."""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import socket
import stat
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from podrun.errors import LaunchError, PodrunError, PreflightError
from podrun.wire.liveness import Liveness
from podrun.launch.options import LaunchOptions
from podrun.launch.request import LaunchRequest, instances_of
from podrun.launch.records import write_launch_files
from podrun.rundir import layout
from podrun.rundir.layout import check_run_id, create_run_dir, new_run_id, snapshot_dir, write_plan
from podrun.rundir.summary import Attempt, RunStatus, Summary, save as save_summary
from podrun.launch.outcome import describe_code
from podrun.launch.supervisor import Supervisor
from podrun.launch.transports import transport_of
from podrun.launch.transports.base import TransportFactory, busy_port_problem
from podrun.wire.worker_env import SNAPSHOT_KEY_NAME, data_interface_env
from podrun.redaction import redact

if TYPE_CHECKING:  # pragma: no cover
    from podrun.elastic.replan import ElasticRecord
    from podrun.rundir.account import Account

MULTI_HOST_PORT = 29500   # the default --master-port when the master host is elsewhere (0, "pick", on this machine)
LOCAL_NAMES = {"localhost", "127.0.0.1", "::1", "ip6-localhost"}


def is_local_host(host: str) -> bool:
    return host in LOCAL_NAMES or host.startswith("127.") or host == socket.gethostname()


def default_transport(plan, cluster=None, scheduler: str = "none") -> str:
    """local when every host is this machine; srun inside a Slurm allocation; else the spec's (one that reaches
    other hosts), or ssh."""
    if all(is_local_host(h) for h in plan.hosts):
        return "local"
    if scheduler == "slurm":
        return "srun"
    spec = getattr(cluster, "transport", None)
    return spec if spec and transport_of(spec).remote else "ssh"


def snapshot_key_env(max_restarts: int) -> tuple[tuple[str, str], ...]:
    """The run's secret snapshot key as an --env pair, made once per run (restarts and re-plans keep the request's
    env); () for a run that cannot restart, which keeps no snapshot."""
    import secrets

    return ((SNAPSHOT_KEY_NAME, secrets.token_hex(32)),) if max_restarts > 0 else ()


def build_request(plan, command, *, transport: str, options: LaunchOptions = LaunchOptions(),
                  liveness: Liveness = Liveness(), run_id: str | None = None, runs_dir: str = "runs", env=(),
                  max_restarts: int = 0, data_interface: str | None = None, **decided) -> LaunchRequest:
    """The LaunchRequest of ``plan`` running ``command``: ``options`` (podrun launch's, whole) gives what is taken
    as it was given (--python, --workdir, the ssh options, --no-agent-store, --no-preflight, --straggler-timeout);
    the keywords are what was decided from the options (reconciled with torchrun's, the cluster spec's, the
    engine's); ``decided``, the request's fields so decided (grace, mpi_args, warm, cpu_bind...), master_addr
    (None or left out: the host of instance 0) and master_port (None or left out: rendezvous_port's default)."""
    net, rs = options.transports, options.restarts
    master_addr, master_port = decided.pop("master_addr", None), decided.pop("master_port", None)
    run_id = new_run_id() if run_id is None else check_run_id(run_id)
    if master_addr is not None:
        from podrun.specs.hosts import check_name

        check_name(master_addr, "--master-addr")      # the one host-name rule: no brackets, no port
    master_port = rendezvous_port(master_port, transport)
    workdir = os.path.abspath(net.workdir or os.getcwd())
    run_dir = os.path.join(os.path.abspath(runs_dir), run_id)
    return LaunchRequest(
        run_id=run_id, run_dir=run_dir, plan=plan, plan_path=os.path.join(run_dir, layout.PLAN),
        command=tuple(command), python=net.host_python, workdir=workdir,
        master_addr=master_addr or plan.placement[0].host, master_port=master_port, transport=transport,
        heartbeat=liveness.period, keepalive=liveness.bound, agent_keepalive=liveness.agent_bound,
        max_restarts=max_restarts,
        # the run's snapshot key (podrun.runtime.snapshot) where a restart may read snapshots; --env wins (later)
        env=data_interface_env(data_interface) + snapshot_key_env(max_restarts) + tuple(env),
        instances=instances_of(plan), ssh=net.ssh,
        agent_store=net.agent_store and _serves_store(transport, net.host_python), preflight=net.preflight,
        straggler_timeout=rs.straggler_timeout, data_interface=data_interface, **decided)


def _serves_store(transport: str, python: str) -> bool:
    """Whether rank 0's agent can host the rendezvous store: the transport holds one, and on this machine its python
    has torch (else rank 0 binds the port itself); a host elsewhere is not asked here (its preflight is)."""
    from podrun.wire.probe import torch_available

    kind = transport_of(transport)
    return kind.agent_store and (kind.remote or torch_available(python))


def rendezvous_port(master_port: int | None, transport: str) -> int:
    """The --master-port to use: None gives 0 (podrun picks a free port at launch) with the local transport,
    else MULTI_HOST_PORT; 0 is refused where the master host is elsewhere (podrun cannot pick a port there)."""
    here = not transport_of(transport).remote
    if master_port is None:
        return 0 if here else MULTI_HOST_PORT
    if not 0 <= master_port <= 65535:
        raise LaunchError(f"--master-port {master_port} is not a TCP port",
                          hint="give 1..65535, or 0 to let podrun pick a free port (runs on this machine)")
    if master_port == 0 and not here:
        raise LaunchError(f"--master-port 0 (podrun picks a free port) needs the master host to be this machine; "
                          f"with --transport {transport} it is a host elsewhere",
                          hint=f"give a port free on the master host, e.g. --master-port {MULTI_HOST_PORT} "
                               "(the default there)")
    return master_port


def hold_port(request: LaunchRequest):
    """On this machine, take the rendezvous port now: (the request on the port taken, the held socket or None).

    With the agent store the socket is kept for the whole run and handed to rank 0's agent (reserved from
    the check on: another run cannot take it in between); port 0 is the port the kernel gave. Without it
    (--no-agent-store, or a --python without torch) rank 0 binds the port itself, so port 0 is only picked
    here, below the ephemeral range (podrun.wire.probe.pick_free_port), and let go. Elsewhere: (request, None).
    Raises OSError when the port is taken.
    """
    from podrun.wire.probe import pick_free_port, reserve

    if request.kind.remote:
        return request, None
    if request.agent_store:
        sock = reserve(request.master_port)
        return replace(request, master_port=sock.getsockname()[1], listen_fd=sock.fileno()), sock
    if request.master_port == 0:
        return replace(request, master_port=pick_free_port()), None
    return request, None


def _preflight_failed(req: LaunchRequest, problems, notice,
                      hint: str = "fix the hosts above, or pass --no-preflight to skip these checks",
                      attempts: tuple[Attempt, ...] = (), elastic: dict | None = None) -> PreflightError:
    """The error for a failed check, after writing summary.json (with the attempts before it and the elastic
    record, when a restart's check failed)."""
    _record(notice, req.run_dir, Summary(run_id=req.run_id, exit_code=2, status=RunStatus.PREFLIGHT_FAILED,
                                         transport=req.transport, problems=tuple(str(p) for p in problems),
                                         attempts=attempts, elastic=elastic))
    hosts = sorted({p.host for p in problems})
    return PreflightError(problems, hint, headline=f"preflight failed on {len(hosts)} host(s), nothing was started")


def dry_run_record(request: LaunchRequest) -> dict:
    """What --dry-run prints: per host, the exact command line (it holds no --env value), the --env every agent
    gets and how, and the variables each worker gets, with secrets redacted as in the run directory
    (podrun.redaction). ``master_port`` 0 means the port is picked on this machine when the run
    starts (``hold_port``), and every worker gets that one."""
    make = request.kind.load()
    request = choose_master(make, request, ask_hosts=False)
    transport = make(request)
    try:
        described = transport.describe(redact=True)
        route = transport.env_route()
    finally:
        transport.close()
    return {
        "run_id": request.run_id, "run_dir": request.run_dir, "transport": request.transport,
        "master_addr": request.master_addr, "master_port": request.master_port,
        "master_addr_source": master_addr_source(request),
        "heartbeat": request.liveness.to_dict(),
        "commands": [{"host": h, "command": c} for h, c in described],
        "agent_env": redact(dict(request.env)), "agent_env_route": route,
        "instances": [{"index": i.index, "host": i.host, "workers": [redact(e) for e in request.worker_envs(i.index)]}
                      for i in request.instances],
    }


def master_addr_source(request: LaunchRequest) -> str:
    """Where MASTER_ADDR comes from, in words (for --dry-run)."""
    first = request.instances[0].host if request.instances else ""
    if request.master_derived == "ssh" and request.master_addr == first:
        return (f"the host of instance 0 ({first}), an IP address; preflight checks that every other host "
                "reaches it")
    if request.master_derived == "ssh":
        return (f"the address podrun's ssh reaches {first} by (its HostName in the ssh config); preflight checks "
                "that every other host reaches it")
    if request.master_addr != first:
        return "--master-addr"
    if request.data_interface is not None and request.kind.ssh_per_host:
        return (f"{first}'s address on {request.data_interface} (--data-interface), asked from {first} when the run "
                f"starts (an --elastic re-plan that moves instance 0 asks its new host the same way); "
                f"GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME are {request.data_interface} on every host")
    hosts = {i.host for i in request.instances}
    where = (" each host resolves it (preflight checks that none but the master host finds it on loopback); on a "
             "host whose own name resolves to loopback only (Debian's 127.0.1.1), the agent sets GLOO_SOCKET_IFNAME "
             "to the interface on the route to it") if len(hosts) > 1 else ""
    return f"the host of instance 0 ({first});" + where if where else f"the host of instance 0 ({first})"


def choose_master(make: TransportFactory, request: LaunchRequest, *, ask_hosts: bool = True) -> LaunchRequest:
    """MASTER_ADDR over ssh when no --master-addr was given: with --data-interface, the master host's address on
    that interface (asked from the host; skipped when not ``ask_hosts``, as in --dry-run); else the address
    podrun's ssh reaches the master host by, when the ssh config's HostName for it is an IP address (not
    loopback); else the host's name as written, which every host resolves (preflight checks it)."""
    first = request.instances[0].host if request.instances else ""
    if not request.kind.ssh_per_host or request.master_addr != first or request.master_derived:
        return request
    if request.data_interface is not None and not ask_hosts:
        return request
    transport = make(request)
    try:
        if request.data_interface is not None:
            return replace(request, master_addr=transport.interface_address(first, request.data_interface),
                           master_derived="data-interface")
        addr = transport.reached_by(first)
    finally:
        transport.close()
    return request if addr is None else replace(request, master_addr=addr, master_derived="ssh")


def execute(request: LaunchRequest, *, sink=None, notice=None, only_output_from: int | None = None,
            elastic=None, watch=None, progress=None, resuming: bool = False,
            launch_record: dict | None = None, said=None, observer=None) -> tuple[Attempt | None, Summary]:
    """Run the request (with restarts); returns the last attempt and the summary written to summary.json.

    ``elastic`` (a podrun.elastic.replan.ElasticPolicy): each restart first drops the failed hosts,
    takes spares, and re-plans at the same global batch; no such plan ends the run. ``watch`` (a
    podrun.launch.hangs.WatchOptions) and ``progress`` go to the Supervisor. ``said(summary)`` tells the outcome
    (the CLI's root cause) while the run directory is still held; the account's idle at the end then runs on to
    that moment (``close_account``), the run's last write under its lock. ``observer`` (a
    podrun.launch.observe.RunObserver) is told of the run as it goes (live metrics, TensorBoard files).
    """
    from podrun.launch.observe import RunObserver

    from podrun.launch.control import claim, release
    from podrun.rundir.lock import hold_run

    notice = notice or (lambda t: None)
    observer = observer or RunObserver()
    create_run_dir(request.run_dir, reuse=resuming)
    held_run = hold_run(request.run_dir, request.run_id, resuming)
    try:
        _before_start(request.run_dir, claim, request.run_dir)
        live = observer.started(request)
        notice(starting_line(request) + (f"; {live}" if live else ""))
        try:
            attempt, summary = _execute(request, sink=sink, notice=notice, only_output_from=only_output_from,
                                        elastic=elastic, watch=watch, progress=progress, resuming=resuming,
                                        launch_record=launch_record, observer=observer)
            if said is not None:
                said(summary)
            summary = close_account(request.run_dir, summary)
            observer.recorded(summary)
            return attempt, summary
        finally:
            observer.close()
            release(request.run_dir)
    finally:
        held_run.release()


def starting_line(request: LaunchRequest) -> str:
    """What is said once the run directory is held: "starting 2 workers on 1 host (localhost) over local: run ID in
    DIR"."""
    from podrun.wire.worker_env import workers_per_instance

    hosts = list(dict.fromkeys(i.host for i in request.instances))
    workers = len(request.instances) * workers_per_instance(request.plan)
    shown = ", ".join(hosts[:3]) + (f", ... {hosts[-1]}" if len(hosts) > 3 else "")
    return (f"starting {workers} worker{'s' if workers != 1 else ''} on {len(hosts)} "
            f"host{'s' if len(hosts) != 1 else ''} ({shown}) over {request.transport}: run {request.run_id} in "
            f"{request.run_dir}")


def _execute(request: LaunchRequest, *, sink, notice, only_output_from, elastic, watch, progress, resuming: bool,
             launch_record: dict | None, observer) -> tuple[Attempt | None, Summary]:
    """execute(), the run directory made and held."""
    earlier = _earlier_attempts(request.run_dir) if resuming else []
    _before_start(request.run_dir, layout.write_start, request.run_dir, request.plan,
                  None if resuming else launch_record, elastic is not None)
    from podrun.elastic.replan import ElasticRecord

    record = None if elastic is None else ElasticRecord.of(elastic)
    make = request.kind.load()
    request = choose_master(make, request)
    try:
        req, held = hold_port(request)
    except OSError as exc:
        host = request.instances[0].host if request.instances else "localhost"
        problem = busy_port_problem(host, request, request.master_port)
        raise _preflight_failed(request, [problem if exc.errno == errno.EADDRINUSE else
                                          replace(problem, message=f"cannot listen on rendezvous port "
                                                                   f"{request.master_port}: {exc.strerror or exc}")],
                                notice, hint="podrun holds the rendezvous port for the whole run, so it must be free")
    try:
        return _attempts(make, req, sink=sink, notice=notice, only_output_from=only_output_from, elastic=elastic,
                         record=record, watch=watch, progress=progress, earlier=earlier, observer=observer)
    finally:
        if held is not None:
            held.close()
        if request.warm:
            shutil.rmtree(os.path.join(request.run_dir, layout.ZYGOTE), ignore_errors=True)   # every zygote ends
        if not request.kind.remote:
            _drop_local_snapshots(request)


def _drop_local_snapshots(request: LaunchRequest) -> None:
    """After the last attempt of a run on this machine: its snapshots, which an agent keeps when its teardown
    may precede a restart, are read by no one now."""
    from podrun.runtime.snapshot import remove

    key = dict(request.env).get(SNAPSHOT_KEY_NAME)
    if key is None:
        return
    for host in dict.fromkeys(inst.host for inst in request.instances):
        d = snapshot_dir(request.run_id, host, key)
        with contextlib.suppress(OSError):
            if stat.S_ISDIR(os.lstat(d).st_mode):
                remove(d)


def _earlier_attempts(run_dir: str) -> list[Attempt]:
    """The attempts of a run's earlier launches (its summary.json), each with ``launch``: 0 for the first launch,
    1 for the first resume..."""
    from podrun.rundir.summary import read_summary

    earlier = read_summary(run_dir)
    return [] if earlier is None else list(earlier.attempts)


def _attempts(make: TransportFactory, req: LaunchRequest, *, sink, notice, only_output_from, elastic,
              record: ElasticRecord | None, watch=None, progress=None,
              earlier: list[Attempt] = (), observer=None) -> tuple[Attempt | None, Summary]:
    """The attempts of one launch; summary.json is written once an attempt (``_record``), after its restart or
    re-plan is decided."""
    from podrun.elastic.replan import failed_hosts
    from podrun.launch.observe import RunObserver
    from podrun.rundir.metrics import StepLog
    from podrun.wire.worker_env import workers_per_instance

    attempts: list[Attempt] = list(earlier)
    launch_no = 1 + max((a.launch for a in earlier), default=-1)
    base_port = req.master_port
    summary, log = Summary(), StepLog()      # summary.attempts: none until this launch's first attempt
    observer = observer or RunObserver()
    told = _told(progress, observer)
    while True:
        transport = make(req)
        try:                # the transport closed on any error before the supervisor takes it
            problems = transport.preflight() if req.checks_hosts() else ()
            if not problems:
                _before_start(req.run_dir, write_launch_files, req, transport.describe(redact=True),
                              transport.env_route())
        except BaseException:
            transport.close()
            raise
        if problems:
            transport.close()
            bad = tuple(dict.fromkeys(p.host for p in problems if p.host in req.plan.hosts))
            if not summary.attempts or not req.kind.remote or not bad:   # else re-planned
                # the first attempt, or problems of this machine's (local) rather than of a host's (elastic)
                raise _preflight_failed(req, problems, notice, attempts=tuple(attempts),
                                        elastic=None if record is None else record.to_dict())
            # a re-planned attempt: hosts that fail the check (a spare that is down) go as a lost host
            # does, and the run re-plans again without them; nothing has started
            nxt_req = _replan(elastic, record, req, req.restart_count, notice, log, bad,
                              record.replans[-1]["lost_at"], "; ".join(p.message for p in problems), problems)
            summary = _record(notice, req.run_dir, replace(summary, elastic=record.to_dict()), observer)
            if nxt_req is None:
                return attempts[-1], summary
            req = nxt_req
            continue
        sup = Supervisor(req, transport, sink=sink, notice=notice, only_output_from=only_output_from,
                         workers_per_instance=workers_per_instance(req.plan), watch=watch, progress=told)
        if elastic is not None:
            from podrun.elastic.inplace import InPlaceRecovery

            sup.inplace = InPlaceRecovery(elastic, record, req.plan, req.restart_count, notice,
                                          workers_per_instance(req.plan))
        observer.attempt(sup, tuple(attempts), launch_no)
        try:
            summary = sup.run()
        except PodrunError as exc:        # e.g. an agent that could not be started: nothing is left running
            _record(notice, req.run_dir, Summary(run_id=req.run_id, exit_code=exc.exit_code,
                                                 status=RunStatus.START_FAILED, transport=req.transport,
                                                 error=str(exc), attempts=tuple(attempts)))
            raise
        plan = None if elastic is None else layout.plan_of(req.restart_count)
        attempts.append(replace(summary.attempts[-1], launch=launch_no, plan=plan))
        log = StepLog.read(req.run_dir)           # the runner's records so far, read once an attempt
        if elastic is not None:
            record.recovered(req.restart_count, summary.started, summary.all_ready_s, log)
        summary = replace(summary, attempts=tuple(attempts))
        done = (summary.exit_code == 0 or summary.status is RunStatus.INTERRUPTED
                or req.restart_count >= req.max_restarts)
        if not done and sup.inplace is not None and sup.inplace.plan is not req.plan:   # recovered in place before
            req = replace(req, plan=sup.inplace.plan, instances=instances_of(sup.inplace.plan))
        nxt, nxt_req = req.restart_count + 1, req
        if not done and elastic is not None:
            root = sup.failures.root
            nxt_req = _replan(elastic, record, req, nxt, notice, log, failed_hosts(summary),
                              summary.ended if root is None else root.at, None if root is None else root.reason)
            if sup.inplace is not None and sup.inplace.failed_why is not None and record.replans:
                record.replans[-1]["inplace_failed"] = sup.inplace.failed_why    # why it restarts instead
        summary = _record(notice, req.run_dir, replace(
            summary, elastic=None if record is None else record.to_dict(),
            account=run_account(req.run_dir, attempts, launch_no, log)), observer)
        if done or nxt_req is None:
            return attempts[-1], summary
        # a port the controller holds serves every attempt (each gets a fresh store on it); else each attempt
        # moves one port past the last one's, whose store may not be gone yet
        port = req.master_port if req.listen_fd is not None else base_port + nxt
        cause = sup.failures.root
        notice(f"restart {nxt} of {nxt_req.max_restarts} after "
               f"{cause.reason if cause else describe_code(summary.exit_code)}; rendezvous port {port}")
        req = nxt_req.for_restart(nxt, port)


def _told(progress, observer):
    """The Supervisor's progress callback: the observer's, then the console's (``progress``) until it raises (a
    closed terminal)."""
    view = [progress]

    def both(rank: int, host: str, rec: dict) -> None:
        observer.progress(rank, host, rec)
        if view[0] is not None:
            try:
                view[0](rank, host, rec)
            except Exception:  # noqa: BLE001 - a closed terminal must not stop supervision
                view[0] = None
    return both


def process_started() -> float:
    """When this process started, wall clock (Linux: its start in /proc against the uptime, to 10 ms); else now."""
    try:
        with open("/proc/self/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])       # field 22, starttime
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return time.time()
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def run_account(run_dir: str, attempts: Sequence[Attempt], launch_no: int, log) -> Account:
    """summary.json's ``account`` of this launch, from podrun launch's start to now: its attempts' moments, the
    runner's metrics (``log``, a podrun.rundir.metrics.StepLog), and when submitted (podrun submit's job record)
    the queue: to the job's start as Slurm gives it (SLURM_JOB_START_TIME), else to this launch's start."""
    from podrun.errors import HostError
    from podrun.rundir.job import JobRecord
    from podrun.rundir.account import Moments, account

    try:                               # a run podrun submit queued has its record; another has none
        submitted = JobRecord.load(run_dir).submitted_at
    except HostError:
        submitted = None
    started = os.environ.get("SLURM_JOB_START_TIME", "")
    mine = [a for a in attempts if a.launch == launch_no and a.started is not None and a.ended is not None]
    moments = Moments(process_started(), time.time(), submitted, float(started) if started.isdigit() else None)
    return replace(account(moments, mine, log), since=moments.start, until=moments.exit)


def close_account(run_dir: str, summary: Summary) -> Summary:
    """At podrun launch's very end (its outcome printed): the account's idle at the end runs on to now, and
    summary.json is written again with it (the record's last write); as it was when the launch has no account,
    and unwritten when the disk refuses."""
    if summary.account is None or summary.account.until is None:
        return summary
    summary = replace(summary, account=summary.account.idle_until(time.time()))
    with contextlib.suppress(OSError):
        save_summary(run_dir, summary)
    return summary


def _replan(policy, record: ElasticRecord, req: LaunchRequest, nxt: int, notice, log, failed: tuple[str, ...],
            lost_at: float, cause: str | None, problems=()) -> LaunchRequest | None:
    """The elastic restart step: decide the next plan into ``record`` without the ``failed`` hosts (lost at
    ``lost_at``, for ``cause``), write plan-<n>.json and plan.json, and return the next request (None: no plan keeps
    the global batch; the record says why).

    ``problems``: why the hosts of a re-planned attempt failed its check before it started; they are dropped
    from ``req.plan`` as a lost host is, timed from the same loss.
    """
    decision, line = record.replan(policy, req.plan, failed, nxt, log, lost_at, cause, problems)
    notice(line)
    if decision.plan is None:
        return None
    write_plan(req.run_dir, decision.plan, layout.plan_of(nxt), layout.PLAN)
    plan = decision.plan
    derived = req.master_addr == req.plan.placement[0].host or req.master_derived
    master = plan.placement[0].host if derived else req.master_addr
    new = replace(req, plan=plan, instances=instances_of(plan), master_addr=master, replanned=True,
                  master_derived="")
    if not derived:
        return new
    try:       # with --data-interface the new master host is asked for its address there, as at the start
        return choose_master(new.kind.load(), new)
    except PreflightError as exc:
        # it cannot be asked (or lacks the interface): the attempt's preflight names it and drops it as a lost host
        why = "; ".join(exc.problems)
        notice(f"elastic: cannot ask {master} for its address on {req.data_interface} ({why}); its preflight decides")
        return new


def _before_start(run_dir: str, write, *args) -> None:
    """A run-dir write before anything runs: failing, it stops the launch (exit 2, nothing started)."""
    try:
        write(*args)
    except OSError as exc:
        raise LaunchError(f"cannot write the run directory {run_dir}: "
                          f"{exc.strerror or exc}; nothing was started",
                          hint="free space there, or pass --runs-dir with a writable directory") from None


def _record(notice, run_dir, summary: Summary, observer=None) -> Summary:
    """Write summary.json, the one write of an attempt's record (and ``observer`` told of it); on a full or failing
    disk say so and go on (the outcome is on the console): the summary returned names what was not written."""
    try:
        save_summary(run_dir, summary)
        summary = replace(summary, not_written=())
    except OSError as exc:
        notice(f"cannot write {Path(run_dir) / layout.SUMMARY}: {exc.strerror or exc}; the outcome below "
               "is on the console only")
        summary = replace(summary, not_written=(f"{layout.SUMMARY} ({exc.strerror or exc})",))
    if observer is not None:
        observer.recorded(summary)
    return summary
