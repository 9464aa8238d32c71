"""The launcher-process transports' shared parts (mpirun, srun, poprun): one process starts every instance's agent."""
from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import threading
from collections import Counter

from podrun.errors import LaunchError
from podrun.launch.transports.base import InstanceHandle, StreamMerger, Transport
from podrun.wire import protocol
from podrun.proctl import signal_group, signal_led_group


def hosts_and_ranks(request) -> tuple[list[str], int]:
    """Hosts in instance order (each once) and instances per host, checked to be the same on each."""
    count = Counter(inst.host for inst in request.instances)    # in instance order
    hosts = list(count)
    per = set(count.values())
    if len(per) > 1:
        raise LaunchError(
            "mpirun/srun start the same number of instances on every host, but this plan places "
            + ", ".join(f"{h}: {n}" for h, n in count.items()),
            hint="use --transport ssh for uneven placements", exit_code=2)
    # instance i must be rank i: ranks fill a host's slots before the next host (ppr:k:node)
    k = per.pop() if per else 1
    for inst in request.instances:
        if hosts[inst.index // k] != inst.host:
            raise LaunchError(f"instance {inst.index} is placed on {inst.host}, but mpirun/srun rank "
                              f"{inst.index} would run on {hosts[inst.index // k]}", exit_code=2)
    return hosts, k


def agent_shell(request, redact: bool = False, per_worker: bool = False, join: str | None = None) -> list[str]:
    """The per-rank command: a shell that cds to the workdir and execs the agent (--index-from-env;
    with ``per_worker`` --rank-from-env: the rank is one worker); ``join``: the agent joins the controller there
    and hears it over that connection (podrun.wire.join), else it watches no stdin."""
    return ["/bin/sh", "-c", request.shell_command(None, stdin_watch=join is not None, redact=redact,
                                                   per_worker=per_worker, join=join)]


class ProcessHandle(InstanceHandle):
    """One launcher process (mpirun, srun) whose merged output carries every instance."""

    def __init__(self, argv: list[str], *, label: str, instances: tuple[int, ...], grace: float,
                 env: dict[str, str] | None = None, on_kill=None, local_ranks: tuple[int, ...] | None = None,
                 run_dir: str | None = None):
        """``local_ranks``: with one agent per worker, the local ranks each instance's agents report
        their ``done`` under (else one agent per instance, which reports it under ``-``). ``run_dir``: where
        the agents read a stop with another signal than SIGTERM (podrun.wire.protocol.write_stop)."""
        self.label = label
        self.instances = instances
        self._agents = {(i, lr) for i in instances for lr in (local_ranks if local_ranks else (None,))}
        self.grace = grace
        self.run_dir = run_dir
        self._on_kill = on_kill
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, start_new_session=True, env=env)
        except OSError as exc:
            raise LaunchError(f"cannot start {label}: {exc}", exit_code=2) from exc
        self._merger = StreamMerger(self.proc.stdout, self.proc.stderr)
        self._term_sent = False

    #: seconds the launcher may take to exit after every instance reported `done`; Open MPI 5's
    #: prterun was seen here to hang now and then at teardown after all ranks had ended
    linger = 1.0

    def lines(self):
        pending = set(self._agents)
        for stream, line in self._merger:
            if pending and (done := protocol.read_done(line)) is not None and done[:2] in pending:
                pending.discard(done[:2])
                if not pending:          # the launcher has nothing left to do: end it if it hangs
                    self._unless_ended(self.linger, self._teardown_hang)
            yield stream, line

    def _unless_ended(self, timeout: float, then) -> None:
        """``then()`` from a thread of its own when the launcher is still there ``timeout`` s from now."""
        def wait() -> None:
            try:
                self.proc.wait(timeout)
            except Exception:  # noqa: BLE001 - still there
                then()
        threading.Thread(target=wait, daemon=True).start()

    def _teardown_hang(self) -> None:
        """Every agent has ended and the launcher is still there after ``linger``: SIGTERM, then SIGKILL."""
        signal_group(self.proc.pid, signal.SIGTERM)
        self._unless_ended(2.0, lambda: signal_group(self.proc.pid, signal.SIGKILL))

    def poll(self) -> int | None:
        return self.proc.poll()

    def terminate(self, sig: int = signal.SIGTERM) -> None:
        """SIGTERM to the launcher (it forwards it to every rank); another signal (podrun's SIGINT, SIGHUP)
        as the run dir's stop request, which the agents read each heartbeat and pass on to their workers as it
        is: Open MPI's mpirun and srun end their ranks at once on a SIGINT instead of passing it on. SIGKILL
        after grace + TERM_TO_KILL_S + 3 s."""
        if self.proc.poll() is not None or self._term_sent:
            return
        self._term_sent = True
        wrote = False
        if sig != signal.SIGTERM and self.run_dir is not None:
            with contextlib.suppress(OSError):          # else SIGTERM after all
                protocol.write_stop(self.run_dir, sig)
                wrote = True
        if not wrote:
            self.proc.send_signal(signal.SIGTERM)        # nothing for a launcher gone meanwhile
        self._unless_ended(self.grace + protocol.TERM_TO_KILL_S + 3.0, self.kill)

    def kill(self) -> None:
        if self._on_kill:
            with contextlib.suppress(Exception):    # best effort cleanup on the scheduler
                self._on_kill()
        signal_led_group(self.proc, signal.SIGKILL)

    def close(self) -> None:
        self._merger.close()


class LauncherTransport(Transport):
    """One launcher process (mpirun, srun, poprun) starts every instance: the run's one command line, and one
    handle whose output carries every instance."""

    def argv(self, redact: bool = False) -> list[str]:
        raise NotImplementedError

    def describe(self, redact: bool = False) -> list[tuple[str, str]]:
        return [(self.name, shlex.join(self.argv(redact=redact)))]

    def _launch(self, argv: list[str], drop: tuple[str, ...] = (), **kw) -> list[InstanceHandle]:
        return [start_launcher(self.request, self.name, argv, drop,
                               instances=tuple(i.index for i in self.request.instances), **kw)]


def start_launcher(request, label: str, argv: list[str], drop: tuple[str, ...] = (), more_env=(),
                   **kw) -> ProcessHandle:
    """Start ``argv`` in this environment with the run's --env and ``more_env`` on top, less the names in ``drop``."""
    env = {**os.environ, **dict(request.env), **dict(more_env)}
    for name in drop:
        env.pop(name, None)
    return ProcessHandle(argv, label=label, grace=max(request.grace, request.interrupt_grace), env=env, **kw)
