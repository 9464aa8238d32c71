"""The instance agent (`python -m podrun.launch.agent`): spawns an instance's workers and supervises them.

One agent runs per instance, started by a transport. It sets the env contract for each local worker,
starts each worker in its own process group with PR_SET_PDEATHSIG (nothing outlives the agent),
streams their output as protocol lines (podrun.launch.protocol) on stdout, sends a heartbeat every
second, forwards SIGINT/SIGTERM/SIGHUP, and ends every worker (the signal or SIGTERM, then SIGKILL
after --grace seconds) when one fails, when it is signalled, when the controller asks (a ``T`` on
stdin), or when it loses its controller (stdin closed, or silent for --stdin-timeout seconds).
Exit code: the first failing worker's (128+signal for a signal), 128+signal when signalled, else 0.
With --hold (the ssh transport's preflight) it first reports its host's facts and starts workers only
when the controller, having heard from every host, writes ``G``; it exits 0 with nothing started if
told to stop instead. With --store-relay, the agent of global rank 0 holds --master-port from its start
and serves the run's TCPStore on it (podrun.launch.agent_store).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from podrun.launch import protocol

INDEX_ENV = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")
PR_SET_PDEATHSIG = 1
FIRST_HEARTBEAT_S = 60.0   # the first controller heartbeat may wait for the fan-out to every other host


def compute_worker_envs(plan, index: int, *, run_id: str, run_dir: str, plan_path: str,
                        master_addr: str, master_port: int, restart_count: int = 0,
                        store_relay: bool = False) -> list[dict[str, str]]:
    """The variables set for each worker of instance ``index`` (the env contract, DESIGN.md section 5).

    ``store_relay``: the agent of global rank 0 hosts the store on ``master_port`` (podrun.launch.agent_store),
    so every worker, rank 0 included, is a client of it (TORCHELASTIC_USE_AGENT_STORE=True, as under torchrun).
    """
    from podrun.plan.env import worker_env, workers_per_instance

    envs = []
    for local_rank in range(workers_per_instance(plan)):
        env = dict(worker_env(plan, index, local_rank, run_id=run_id, run_dir=run_dir, plan_path=plan_path,
                              master_addr=master_addr, master_port=master_port))
        if store_relay:
            env["TORCHELASTIC_USE_AGENT_STORE"] = "True"    # podrun.launch.agent_store.ENV
        env["PODRUN_RESTART_COUNT"] = str(restart_count)
        env.setdefault("PYTHONUNBUFFERED", "1")   # so output streams live, line by line
        envs.append({k: str(v) for k, v in env.items()})
    return envs


def _pdeathsig() -> None:
    """In the child before exec: die with SIGKILL when the agent dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:  # noqa: BLE001 - not Linux: the process group teardown still applies
        pass


class Agent:
    def __init__(self, index: int, command: list[str], envs: list[dict[str, str]], *, grace: float,
                 stdin_watch: bool, stdin_timeout: float, out=None, probe: dict | None = None):
        self.index = index
        self.command = command
        self.envs = envs
        self.grace = grace
        self.stdin_watch = stdin_watch
        self.stdin_timeout = stdin_timeout
        self.out = out if out is not None else sys.stdout.buffer
        self.lock = threading.Lock()
        self.stop_reason: str | None = None
        self.stop_signal = signal.SIGTERM
        self.signalled: int | None = None
        self.controller_lost = False
        self.last_stdin = time.monotonic()
        self.got_stdin = False       # before the first heartbeat: the controller may still be starting others
        self.procs: list[subprocess.Popen | None] = []
        self.readers: list[list[threading.Thread]] = []
        self.teardown_started = False
        self.probe = probe           # --hold: facts to report, then wait for the controller's go
        self.go = threading.Event()

    # -- output ---------------------------------------------------------------------------
    def emit(self, local_rank: int | None, kind: str, text: str = "") -> None:
        line = (protocol.encode(self.index, local_rank, kind, text) + "\n").encode("utf-8", "replace")
        with self.lock:
            if self.controller_lost:
                return
            try:
                self.out.write(line)
                self.out.flush()
            except (BrokenPipeError, OSError, ValueError):
                self.controller_lost = True
                self.request_stop("lost the controller (stdout closed)")

    def request_stop(self, reason: str, sig: int = signal.SIGTERM) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
            self.stop_signal = sig

    # -- threads --------------------------------------------------------------------------
    def _pump(self, local_rank: int, kind: str, f) -> None:
        try:
            for raw in iter(f.readline, b""):
                self.emit(local_rank, kind, raw.decode("utf-8", "replace").rstrip("\r\n"))
        except (OSError, ValueError):
            pass

    def _heartbeat(self) -> None:
        while True:
            self.emit(None, "hb", f"{time.time():.3f}")
            time.sleep(1.0)

    def _watch_stdin(self) -> None:
        while True:
            try:
                data = os.read(0, 256)
            except OSError:
                data = b""
            if not data:
                self.request_stop("lost the controller (stdin closed)")
                return
            self.last_stdin = time.monotonic()
            self.got_stdin = True
            if b"G" in data:
                self.go.set()
            if b"T" in data:
                self.request_stop("the controller asked to stop")

    def _on_signal(self, signum, frame) -> None:  # noqa: ARG002
        self.signalled = signum
        self.request_stop(f"received {signal.Signals(signum).name}", signum)

    # -- lifecycle ------------------------------------------------------------------------
    def spawn(self) -> None:
        base = dict(os.environ)
        for local_rank, wenv in enumerate(self.envs):
            try:
                p = subprocess.Popen(self.command, env={**base, **wenv}, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True, preexec_fn=_pdeathsig)
            except OSError as exc:
                self.emit(local_rank, "err", f"podrun agent: cannot start {self.command[0]!r}: {exc.strerror}")
                self.procs.append(None)
                self.readers.append([])
                self.emit(local_rank, "exit", f"{127 if isinstance(exc, FileNotFoundError) else 126} {time.time():.3f}")
                self.request_stop(f"local rank {local_rank} could not start")
                continue
            self.procs.append(p)
            threads = [threading.Thread(target=self._pump, args=(local_rank, k, f), daemon=True)
                       for k, f in (("out", p.stdout), ("err", p.stderr))]
            for t in threads:
                t.start()
            self.readers.append(threads)
            self.emit(local_rank, "start", str(p.pid))

    def _held_until_go(self) -> bool:
        """Report the preflight facts and wait for ``G`` on stdin; False when told to stop (``T``, stdin
        closed: another host failed its preflight), when signalled, or with no go within FIRST_HEARTBEAT_S."""
        self.emit(None, "probe", json.dumps(self.probe, separators=(",", ":")))
        deadline = time.monotonic() + FIRST_HEARTBEAT_S
        while not self.go.wait(0.005):
            if self.stop_reason is not None or time.monotonic() > deadline:
                return False
        return True

    def _signal_all(self, sig: int) -> None:
        for p in self.procs:
            if p is not None:
                try:
                    os.killpg(p.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    def run(self) -> int:
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, self._on_signal)
        self.emit(None, "ready", f"{socket.gethostname()} {os.getpid()} {len(self.envs)}")
        threading.Thread(target=self._heartbeat, daemon=True).start()
        if self.stdin_watch:
            threading.Thread(target=self._watch_stdin, daemon=True).start()
        if self.probe is not None and not self._held_until_go():
            self.emit(None, "done", "0")
            return 0
        self.spawn()
        first_failure: int | None = None
        reaped = [p is None for p in self.procs]
        kill_at: float | None = None
        while not all(reaped):
            for lr, p in enumerate(self.procs):
                if reaped[lr] or p is None:
                    continue
                rc = p.poll()
                if rc is None:
                    continue
                reaped[lr] = True
                for t in self.readers[lr]:
                    t.join(timeout=1.0)
                tag = " teardown" if self.teardown_started else ""
                self.emit(lr, "exit", f"{rc} {time.time():.3f}{tag}")
                if rc != 0 and first_failure is None and not self.teardown_started:
                    first_failure = rc
                    self.request_stop(f"local rank {lr} exited with {protocol.exit_code_from_returncode(rc)}")
            limit = self.stdin_timeout if self.got_stdin else max(self.stdin_timeout, FIRST_HEARTBEAT_S)
            if self.stdin_watch and self.stdin_timeout > 0 and time.monotonic() - self.last_stdin > limit:
                self.request_stop(f"lost the controller (no heartbeat on stdin for {limit:g} s)")
            if self.stop_reason is not None and not self.teardown_started:
                self.teardown_started = True
                if not all(reaped):
                    self.emit(None, "note", f"ending workers: {self.stop_reason}")
                self._signal_all(self.stop_signal)
                kill_at = time.monotonic() + self.grace
            if kill_at is not None and time.monotonic() >= kill_at:
                self._signal_all(signal.SIGKILL)
                kill_at = time.monotonic() + 1.0
            time.sleep(0.02)
        self._signal_all(signal.SIGKILL)   # leftovers in the workers' process groups
        if first_failure is not None:
            code = protocol.exit_code_from_returncode(first_failure)
        elif self.signalled is not None:
            code = 128 + self.signalled
        elif any(p is None for p in self.procs):
            code = 127
        elif any(p is not None and p.returncode != 0 for p in self.procs):
            code = 128 + int(self.stop_signal)   # workers ended by the teardown the controller asked for
        else:
            code = 0
        self.emit(None, "done", str(code))
        return code


def instance_index_from_env(environ=os.environ) -> int:
    for name in INDEX_ENV:
        if environ.get(name, "").isdigit():
            return int(environ[name])
    raise SystemExit(f"podrun agent: --index-from-env but none of {', '.join(INDEX_ENV)} is set")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m podrun.launch.agent", description=__doc__.splitlines()[0])
    ap.add_argument("--plan", required=True)
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--master-addr", required=True)
    ap.add_argument("--master-port", type=int, required=True)
    ap.add_argument("--grace", type=float, default=5.0)
    ap.add_argument("--restart-count", type=int, default=0)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--instance", type=int)
    g.add_argument("--index-from-env", action="store_true")
    ap.add_argument("--stdin-timeout", type=float, default=5.0)
    ap.add_argument("--no-stdin-watch", action="store_true")
    ap.add_argument("--store-relay", action="store_true",
                    help="if this instance runs global rank 0: hold --master-port from the start and serve the "
                         "run's TCPStore on it (podrun.launch.agent_store)")
    ap.add_argument("--listen-fd", type=int,
                    help="with --store-relay: the listening socket on --master-port, inherited from the controller")
    ap.add_argument("--hold", action="store_true",
                    help="report preflight facts (a probe line) and start workers only on a G on stdin")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command given after --")
    index = instance_index_from_env() if args.index_from_env else args.instance
    from podrun.plan.model import Plan

    with open(args.plan) as f:
        plan = Plan.from_dict(json.load(f))
    envs = compute_worker_envs(plan, index, run_id=args.run_id, run_dir=args.run_dir, plan_path=args.plan,
                               master_addr=args.master_addr, master_port=args.master_port,
                               restart_count=args.restart_count, store_relay=args.store_relay)
    rank0 = any(e["RANK"] == "0" for e in envs)
    store = None
    if args.store_relay and rank0:
        from podrun.launch.agent_store import AgentStore

        store = AgentStore.open(args.master_port, args.listen_fd)    # reserve the port now, before any report
    probe = None
    if args.hold:
        from podrun.launch.probe import facts

        ports = [args.master_port] if rank0 else []
        # the agent store's port is busy when it could not be bound; else (no agent store) facts() tries it
        probe = facts(ports, None if store is None else ports if store.error is not None else [])
    agent = Agent(index, command, envs, grace=args.grace, stdin_watch=not args.no_stdin_watch,
                  stdin_timeout=args.stdin_timeout, probe=probe)
    if store is not None and not (probe and probe["ports_busy"]):    # busy: the controller will not say go
        store.start(agent.envs, lambda text: agent.emit(None, "note", text))
    try:
        return agent.run()
    finally:
        if store is not None:
            store.close()


if __name__ == "__main__":
    sys.exit(main())
