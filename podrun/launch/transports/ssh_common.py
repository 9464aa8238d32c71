"""What the two ssh transports share (OpenSSH client, paramiko): held-agent preflight, start, cross-host checks.

The agents are the probes: each starts held (--hold), reports its host's facts and waits; only when every
host has passed does start() tell them to go. A failure anywhere closes every held agent before any worker
exists. This spares a second remote python start and round trip per host. A subclass provides
``_start_one(inst, hold)`` (a handle with ``wait_probe``/``early_errors``/``go``) and ``_problem(host, exc)``.
"""
from __future__ import annotations

import math
import queue
import shlex
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import podrun
from podrun import pystart
from podrun.errors import LaunchError, PreflightError
from podrun.wire import protocol
from podrun.wire.probe import Facts, is_loopback
from podrun.launch.request import NO_WORKDIR
from podrun.launch.transports.base import InstanceHandle, Problem, StreamMerger, Transport, busy_port_problem

PROBE_TIMEOUT = 30.0      # seconds for a held agent to report its preflight facts
# Threads for commands over established connections (probes, agent starts). Only the ssh
# handshakes in flight are bounded by --max-concurrency: a remote command that takes a second
# to start must not hold a handshake slot, or 2048 hosts would take 2048/K seconds.
MAX_THREADS = 2048
# An ssh config larger than this is not one (a cluster's, with a Host block per node, is some MiB at most).
MAX_SSH_CONFIG_BYTES = 16 * 1024 * 1024
ALIVE_COUNT_MAX = 3       # ssh's ServerAliveCountMax: unanswered keepalives before OpenSSH ends the client


def alive_interval(bound: float) -> int:
    """ssh's ServerAliveInterval for a liveness bound: whole seconds, half the bound rounded up. OpenSSH ends a
    silent connection after ALIVE_COUNT_MAX + 1 intervals, at least twice the bound, so a host that goes quiet
    is declared lost by podrun's own heartbeat (which names the silence) before ssh's backstop ends the client."""
    return max(1, math.ceil(bound / 2))


# The ssh failures both clients name, by kind: (message, hint). {where} is user@hostname:port.
SSH_FAILURES = {
    "resolve": ("unknown host: {hostname!r} does not resolve",
                "check the host name, or add HostName to the ssh config"),
    "mismatch": ("host key mismatch for {where}: the key does not match known_hosts",
                 "if the host was reinstalled, update known_hosts (ssh-keygen -R HOST)"),
    "unknown-key": ("unknown host key for {where} (not in known_hosts)",
                    "add it: ssh-keyscan -p {port} {hostname} >> ~/.ssh/known_hosts, or pass --no-host-key-check"),
    "auth": ("authentication failed for {where}",
             "check IdentityFile in the ssh config and the host's authorized_keys"),
    "timeout": ("unreachable: connecting to {where} timed out", "is the host up and on the network?"),
    "connect": ("unreachable: cannot connect to {where}",
                "is the host up and sshd running? check HostName/Port in the ssh config"),
    "other": ("ssh to {where} failed", ""),
}


def ssh_failure(kind: str, host: str, user: str, hostname: str, port, via: str = "none", detail: str | None = None,
                hint: str | None = None) -> Problem:
    """The Problem for an ssh failure of ``kind`` (SSH_FAILURES) reaching ``host`` as user@hostname:port (through
    the ProxyJump ``via``): ``detail`` (the client's own words) after the message, ``hint`` in place of the kind's."""
    where = f"{user}@{hostname}:{port}" + ("" if via == "none" else f" via {via}")
    message, default = SSH_FAILURES[kind]
    message = message.format(where=where, hostname=hostname)
    if detail is not None:
        message += f": {detail}" if kind == "other" else f" ({detail})"
    return Problem(host, message, default.format(port=port, hostname=hostname) if hint is None else hint)


def read_ssh_config(path: str, what: str) -> bytes:
    """The bytes of the ssh config ``path`` (``what``: how the user named it): a regular file of at most
    MAX_SSH_CONFIG_BYTES, else LaunchError (exit 2) at once; ``ssh -G`` would wait on a FIFO and read
    /dev/zero without end."""
    from podrun.safefs import read_user_file

    return read_user_file(path, what, limit=MAX_SSH_CONFIG_BYTES, error=LaunchError)


class HeldProbe:
    """The part of a handle that reads a held agent's preflight report before the run's lines."""

    instances: tuple[int, ...] = ()
    _merger: StreamMerger

    def _init_probe(self, merger: StreamMerger) -> None:
        self._merger = merger
        self._early: list[tuple[str, str]] = []     # lines read while waiting for the probe

    def wait_probe(self, timeout: float) -> Facts | None:
        """A held agent's preflight facts; None if it ended first. queue.Empty after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            item = self._merger.next(timeout=max(0.0, deadline - time.monotonic()))
            if item is None:
                return None
            self._early.append(item)
            ev = protocol.parse(item[1], item[0])
            if ev.kind == Facts.KIND and ev.instance in self.instances:
                return Facts.decode(ev.text)

    def go(self) -> None:
        """Let the held agent start its workers."""
        self._write(protocol.Token.GO.value)

    def early_errors(self) -> str:
        return "\n".join(line for stream, line in self._early if stream == "err")

    def lines(self):
        early, self._early = self._early, []
        yield from early
        yield from self._merger

    def push(self, callback) -> bool:
        if not self._merger.push(callback, first=self._early):
            return False
        self._early = []
        return True


def network_problems(request, facts: dict[str, Facts]) -> list[Problem]:
    """The network as the hosts found it: MASTER_ADDR as every host resolves it (a host other than the master
    host that finds it on loopback, or cannot resolve it, would wait for rank 0 on itself until a timeout),
    whether it answers from every worker host, and the --data-interface on every host."""
    master_host = request.instances[0].host if request.instances else ""
    addr = request.master_addr
    seen = {h: f.master_resolves for h, f in facts.items() if f.master_resolves is not None}
    elsewhere = sorted({a for h, r in seen.items() for a in (r or []) if not is_loopback(a)})
    problems = []
    ifname = request.data_interface
    for host, f in facts.items():
        if ifname is not None and ifname not in f.interfaces:
            problems.append(Problem(host, f"no interface {ifname} with an IPv4 or global IPv6 address on {host} "
                                          f"(--data-interface); it has {', '.join(f.interfaces) or 'none'}",
                                    "name the interface of the network the hosts share (ip -br addr on the host)"))
    if problems:
        return problems
    for host, f in facts.items():
        r = f.master_reach
        if host != master_host and r is not None and not r.ok:
            over = f" over {ifname}" if ifname is not None else ""
            problems.append(Problem(host, f"{host} cannot reach rank 0 on {master_host} at {addr}:{request.master_port}"
                                          f"{over} (from interface {r.via}: {r.error})",
                                    "the workers there would wait for it until the collective timeout; check the "
                                    "network between the two hosts, --data-interface or --master-addr"))
    if problems:
        return problems
    for host, resolved in seen.items():
        if host == master_host:
            continue
        if not resolved:
            problems.append(Problem(host, f"MASTER_ADDR {addr} does not resolve on {host}; workers there cannot "
                                          f"reach rank 0 on {master_host}",
                                    "pass --master-addr with an address every host reaches (an IP), or add the "
                                    "name to that host's /etc/hosts or DNS"))
        elif all(is_loopback(a) for a in resolved):
            where = f" and to {', '.join(elsewhere)} elsewhere" if elsewhere else ""
            problems.append(Problem(host, f"MASTER_ADDR {addr} resolves to {', '.join(resolved)} (loopback) on "
                                          f"{host}{where}; workers there would wait for rank 0 on {host} itself, "
                                          f"not on {master_host}",
                                    "pass --master-addr with an address of the master host that every host "
                                    "reaches, or fix that host's /etc/hosts"))
    return problems


def thread_pool(n: int) -> ThreadPoolExecutor:
    """Threads for ``n`` hosts' commands, at most MAX_THREADS."""
    return ThreadPoolExecutor(max_workers=max(1, min(MAX_THREADS, n)))


def ip_hostname(hostname: str) -> str | None:
    """``hostname`` when it is an IP address that is not loopback (what MASTER_ADDR can be), else None."""
    import ipaddress

    try:
        ip = ipaddress.ip_address(hostname)
    except ValueError:
        return None
    return None if ip.is_loopback or ip.is_unspecified else str(ip)


class HeldAgentTransport(Transport):
    """Preflight through held agents, then start: the logic of both ssh transports. A subclass's ``_start_one``
    starts the agent with --env-stdin (``env_stdin``) and writes ``request.env_message()`` before any other byte."""

    def __init__(self, request):
        super().__init__(request)
        self.opts = request.ssh
        self.handshakes = threading.BoundedSemaphore(max(1, self.opts.max_concurrency))   # --max-concurrency
        self._held: list | None = None       # agents the preflight started held, until ``release`` lets them go

    def _start_one(self, inst, hold: bool = False):
        raise NotImplementedError

    def _problem(self, host: str, exc: BaseException) -> Problem:
        raise NotImplementedError

    def run_command(self, host: str, command: str, timeout: float) -> tuple[int, str, str]:
        """Run one shell command on ``host``: (exit code, stdout, stderr)."""
        raise NotImplementedError

    def reached_by(self, host: str) -> str | None:
        """The IP address the ssh config sends ``host``'s connection to (its HostName), when it is one."""
        raise NotImplementedError

    def interface_address(self, host: str, ifname: str) -> str:
        """``host``'s address on interface ``ifname``, IPv4 or else global IPv6 (podrun.wire.probe.interface_address;
        one remote Python start); PreflightError when the host cannot be asked or has no such interface."""
        code = (f"from podrun.wire.probe import interface_address as i, interface_addresses as a, "
                f"interface_addresses6 as b; print(i({ifname!r}) or '', ' '.join(sorted(set(a()) | set(b()))))")
        try:
            line = shlex.join(pystart.safe(self.request.python, code=code, root=None))
            rc, out, err = self.run_command(host, line, PROBE_TIMEOUT)
        except BaseException as exc:  # noqa: BLE001
            raise PreflightError([self._problem(host, exc)]) from None
        if rc != 0:
            raise PreflightError([self._check_exit(host, rc, err)])
        words = out.split("\n")[0].split(" ", 1)
        if not words[0]:
            have = ", ".join(words[1].split()) if len(words) > 1 else ""
            raise PreflightError([f"{host}: no interface {ifname} with an IPv4 or global IPv6 address on the master "
                                  f"host {host} (--data-interface); it has {have or 'none'}"],
                                 hint="name the interface of the network the hosts share (ip -br addr on the host)")
        return words[0]

    def _check_exit(self, host: str, rc: int | None, err: str) -> Problem:
        """Why an agent ended before reporting its facts (a subclass first checks for its client's errors)."""
        req = self.request
        if rc == NO_WORKDIR:
            return Problem(host, f"working directory {req.workdir} does not exist",
                           "create it on the host (or share the filesystem), or pass --workdir")
        if rc == 127:
            return Problem(host, f"python {req.python} not found", "install it there, or pass --python PATH")
        if "No module named" in err and "podrun" in err:
            return Problem(host, f"podrun is not installed for {req.python}",
                           f"pip install podrun=={podrun.__version__} there, or pass --python with a venv that has it")
        tail = (err.strip().splitlines() or ["no output"])[-1]
        return Problem(host, f"the instance agent ended before its preflight report (exit {rc}): {tail}",
                       f"is podrun=={podrun.__version__} installed there?")

    def _check_facts(self, host: str, facts: Facts) -> list[Problem]:
        from podrun.wire.probe import missing_text, python_version

        problems = []
        if facts.podrun != podrun.__version__:
            problems.append(Problem(host, f"podrun {facts.podrun} there, {podrun.__version__} here",
                                    f"install podrun=={podrun.__version__} on the host"))
        here = python_version()
        if facts.python.rsplit(".", 1)[0] != here.rsplit(".", 1)[0]:
            problems.append(Problem(host, f"python {facts.python} there, {here} here",
                                    "use the same Python version (--python)"))
        for port in facts.ports_busy:
            problems.append(busy_port_problem(host, self.request, port))
        if facts.missing:
            problems.append(Problem(host, *missing_text(self.request.python, facts.missing, "the recipe")))
        return problems

    def _preflight_instance(self, inst) -> tuple[object, list[Problem], Facts | None]:
        try:
            handle = self._start_one(inst, hold=True)
        except BaseException as exc:  # noqa: BLE001
            return None, [self._problem(inst.host, exc)], None
        try:
            facts = handle.wait_probe(PROBE_TIMEOUT)
        except queue.Empty:
            return handle, [Problem(inst.host, f"the instance agent did not report in {PROBE_TIMEOUT:g} s",
                                    "is the host overloaded, or does a login script (~/.bashrc) hang?")], None
        finally:
            self._probed(handle)
        if facts is None:
            return handle, [self._check_exit(inst.host, handle.wait(2.0), handle.early_errors())], None
        return handle, self._check_facts(inst.host, facts), facts

    def _probed(self, handle) -> None:
        """A held agent has reported (or failed to): a subclass may free a handshake slot here."""

    def preflight(self) -> list[Problem]:
        insts = list(self.request.instances)
        with thread_pool(len(insts)) as ex:
            results = list(ex.map(self._preflight_instance, insts))
        problems = list(dict.fromkeys(p for _, r, _ in results for p in r))   # once per host, not per instance
        if not problems:
            facts = {inst.host: f for inst, (_, _, f) in zip(insts, results) if f is not None}
            problems = network_problems(self.request, facts)
        handles = [h for h, _, _ in results if h is not None]
        if problems:
            _dismiss(handles)
            return problems
        self._held = handles
        return []

    def start(self) -> list[InstanceHandle]:
        if self._held is not None:     # preflight passed: its agents wait for the go (``release``)
            return list(self._held)
        insts = list(self.request.instances)
        handles: list = [None] * len(insts)
        errors: list[Problem] = []

        def one(k: int) -> None:
            try:
                handles[k] = self._start_one(insts[k])
            except BaseException as exc:  # noqa: BLE001
                errors.append(self._problem(insts[k].host, exc))

        with thread_pool(len(insts)) as ex:
            list(ex.map(one, range(len(insts))))
        if errors:
            for h in handles:
                if h is not None:
                    h.kill()
            raise LaunchError("could not start the instance agents:\n" + "\n".join(f"  - {p}" for p in errors),
                              hint="the agents that had started were ended")
        return handles

    def release(self, handles: list) -> None:
        held, self._held = self._held or [], None
        for h in held:
            h.go()

    def close(self) -> None:
        held, self._held = self._held or [], None
        _dismiss(held)


def _dismiss(handles: list, timeout: float = 3.0) -> None:
    """Tell held agents to stop (they have started nothing) and wait, bounded, until they are gone."""
    for h in handles:
        h.terminate()
    deadline = time.monotonic() + timeout
    for h in handles:
        h.wait(max(0.0, deadline - time.monotonic()))
        h.kill()
