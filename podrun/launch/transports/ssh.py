"""The ssh transport (paramiko, imported only here): one agent per host over an ssh channel, in parallel.

Honours an OpenSSH client config (~/.ssh/config or --ssh-config): HostName, User, Port, IdentityFile,
IdentitiesOnly, ConnectTimeout, StrictHostKeyChecking, UserKnownHostsFile, GlobalKnownHostsFile.
Host keys are checked as OpenSSH checks them: against the UserKnownHostsFile(s) (default
~/.ssh/known_hosts, ~/.ssh/known_hosts2) and the GlobalKnownHostsFile(s) (default
/etc/ssh/ssh_known_hosts, /etc/ssh/ssh_known_hosts2); an unknown host is refused unless the config says
``StrictHostKeyChecking accept-new`` (or ``no``), which accepts it and appends its key to the first
UserKnownHostsFile, so that a changed key is refused later; a changed key is always refused.
--no-host-key-check accepts unknown hosts and saves nothing. Commands are built with
shlex.quote only; the user's --env travels in the command line (``env NAME=VALUE``), not AcceptEnv.
"""
from __future__ import annotations

import getpass
import json
import os
import queue
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import paramiko

import podrun
from podrun.errors import LaunchError
from podrun.launch import protocol
from podrun.launch.request import NO_WORKDIR
from podrun.launch.transport import InstanceHandle, Problem, StreamMerger, Transport, busy_port_problem

PROBE_TIMEOUT = 30.0      # seconds for a held agent to report its preflight facts
# Threads for commands over established connections (probes, agent starts). Only the ssh
# handshakes in flight are bounded by --max-concurrency: a remote command that takes a second
# to start must not hold a handshake slot, or 2048 hosts would take 2048/K seconds.
MAX_THREADS = 2048
USER_KNOWN_HOSTS = "~/.ssh/known_hosts ~/.ssh/known_hosts2"              # OpenSSH's defaults
GLOBAL_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2"


def known_hosts_files(c: dict) -> tuple[list[str], list[str]]:
    """(user files, global files) of an ssh config lookup, OpenSSH's defaults where it names none."""
    def files(key: str, default: str) -> list[str]:
        value = c.get(key) or default
        words = value.split() if isinstance(value, str) else [w for v in value for w in v.split()]
        return [os.path.expanduser(w) for w in words]

    return files("userknownhostsfile", USER_KNOWN_HOSTS), files("globalknownhostsfile", GLOBAL_KNOWN_HOSTS)


class AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """``StrictHostKeyChecking accept-new``: a host with no key in known_hosts is accepted and its key is
    appended to ``path`` (a changed key never reaches a policy: paramiko refuses it first)."""

    _lock = threading.Lock()

    def __init__(self, path: str):
        self.path = path

    def missing_host_key(self, client, hostname, key) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        if self.path == "/dev/null":
            return
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n".encode()
        with self._lock:
            os.makedirs(os.path.dirname(self.path) or ".", mode=0o700, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line)      # one write with O_APPEND: lines of concurrent writers do not mix
            finally:
                os.close(fd)


class SSHHandle(InstanceHandle):
    def __init__(self, index: int, host: str, client: paramiko.SSHClient, chan: paramiko.Channel):
        self.label = host
        self.instances = (index,)
        self.client = client
        self.chan = chan
        self._merger = StreamMerger(chan.makefile("rb"), chan.makefile_stderr("rb"))
        self._early: list[tuple[str, str]] = []     # lines read while waiting for the probe
        self._out: queue.Queue = queue.Queue()
        self._dead = False
        threading.Thread(target=self._writer, daemon=True).start()

    def wait_probe(self, timeout: float) -> dict | None:
        """A held agent's preflight facts; None if it ended first. queue.Empty after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            item = self._merger.next(timeout=max(0.0, deadline - time.monotonic()))
            if item is None:
                return None
            self._early.append(item)
            ev = protocol.parse(item[1], item[0])
            if ev.kind == "probe" and ev.instance in self.instances:
                return json.loads(ev.text)

    def early_errors(self) -> str:
        return "\n".join(line for stream, line in self._early if stream == "err")

    def go(self) -> None:
        self._out.put(b"G")

    def _writer(self) -> None:
        # writes happen here so a stalled link never blocks the supervisor
        while True:
            data = self._out.get()
            if data is None:
                return
            try:
                self.chan.sendall(data)
            except (OSError, EOFError, paramiko.SSHException):
                return

    def lines(self):
        early, self._early = self._early, []
        yield from early
        yield from self._merger

    def poll(self):
        if self.chan.exit_status_ready():
            rc = self.chan.recv_exit_status()
            return 255 if rc == -1 else rc      # -1: the connection ended without an exit status
        if self._dead or self.chan.closed or not self.client.get_transport() or \
                not self.client.get_transport().is_active():
            return 255
        return None

    def heartbeat(self) -> None:
        self._out.put(b".")

    def request_stacks(self) -> None:
        self._out.put(b"S")

    def terminate(self) -> None:
        self._out.put(b"T")

    def kill(self) -> None:
        """Drop the connection: the agent sees EOF (or, if the link is cut, silence) and ends its workers."""
        self._dead = True
        self._out.put(None)
        try:
            self.chan.close()
        except Exception:  # noqa: BLE001
            pass
        try:
            self.client.close()
        except Exception:  # noqa: BLE001
            pass

    def close(self) -> None:
        self._out.put(None)
        try:
            self.chan.close()
        except Exception:  # noqa: BLE001
            pass


class SSHTransport(Transport):
    name = "ssh"

    def __init__(self, request):
        super().__init__(request)
        self.opts = request.ssh
        path = self.opts.config_path or os.path.expanduser("~/.ssh/config")
        self.config = paramiko.SSHConfig()
        if self.opts.config_path and not os.path.exists(path):
            raise LaunchError(f"--ssh-config {path}: no such file")
        if os.path.exists(path):
            try:
                self.config = paramiko.SSHConfig.from_path(path)
            except Exception as exc:  # noqa: BLE001
                raise LaunchError(f"ssh config {path}: cannot parse it ({exc})") from None
        self.clients: dict[str, paramiko.SSHClient] = {}
        self.host_locks: dict[str, threading.Lock] = {}
        self.lock = threading.Lock()
        self.handshakes = threading.BoundedSemaphore(max(1, self.opts.max_concurrency))
        self._held: list[SSHHandle] | None = None

    def _pool(self, n: int) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max_workers=max(1, min(MAX_THREADS, n)))

    # -- connections -------------------------------------------------------------------
    def _connect(self, host: str) -> paramiko.SSHClient:
        with self.lock:
            host_lock = self.host_locks.setdefault(host, threading.Lock())
        with host_lock:            # one connection per host, shared by its instances
            with self.lock:
                if host in self.clients:
                    return self.clients[host]
            return self._open(host)

    def _open(self, host: str) -> paramiko.SSHClient:
        c = self.config.lookup(host)
        hostname, port = c.get("hostname", host), int(c.get("port", 22))
        user = c.get("user") or getpass.getuser()
        client = paramiko.SSHClient()
        user_files, global_files = known_hosts_files(c)
        for f in global_files:
            if f != "/dev/null" and os.path.isfile(f):
                client.load_system_host_keys(f)
        for f in user_files:
            if f != "/dev/null" and os.path.isfile(f):
                client.get_host_keys().load(f)
        strict = str(c.get("stricthostkeychecking", "yes")).lower()
        if not self.opts.host_key_check:
            policy: paramiko.MissingHostKeyPolicy = paramiko.AutoAddPolicy()   # accepted, not saved
        elif strict in ("no", "off", "accept-new"):
            policy = AcceptNewPolicy(user_files[0] if user_files else "/dev/null")
        else:
            policy = paramiko.RejectPolicy()
        client.set_missing_host_key_policy(policy)
        keys = [os.path.expanduser(k) for k in c.get("identityfile", [])]
        only = str(c.get("identitiesonly", "no")).lower() == "yes"
        timeout = float(c.get("connecttimeout", self.opts.connect_timeout))
        try:
            with self.handshakes:
                client.connect(hostname, port=port, username=user, key_filename=keys or None, timeout=timeout,
                               banner_timeout=timeout, auth_timeout=timeout, look_for_keys=not only,
                               allow_agent=not only)
        except BaseException:
            client.close()
            raise
        t = client.get_transport()
        t.set_keepalive(max(1, int(self.request.keepalive // 2)))
        with self.lock:
            self.clients[host] = client
        return client

    def _problem(self, host: str, exc: BaseException) -> Problem:
        c = self.config.lookup(host)
        where = f"{c.get('user') or getpass.getuser()}@{c.get('hostname', host)}:{c.get('port', 22)}"
        if isinstance(exc, socket.gaierror):
            return Problem(host, f"unknown host: {c.get('hostname', host)!r} does not resolve",
                           "check the host name, or add HostName to the ssh config")
        if isinstance(exc, paramiko.BadHostKeyException):
            return Problem(host, f"host key mismatch for {where}: the key does not match known_hosts",
                           "if the host was reinstalled, update known_hosts (ssh-keygen -R HOST)")
        if isinstance(exc, paramiko.AuthenticationException):
            return Problem(host, f"authentication failed for {where}",
                           "check IdentityFile in the ssh config and the host's authorized_keys")
        if isinstance(exc, paramiko.SSHException) and "known_hosts" in str(exc):
            return Problem(host, f"unknown host key for {where} (not in known_hosts)",
                           f"add it: ssh-keyscan -p {c.get('port', 22)} {c.get('hostname', host)} >> "
                           "~/.ssh/known_hosts, or pass --no-host-key-check")
        if isinstance(exc, (socket.timeout, TimeoutError)):
            return Problem(host, f"unreachable: connecting to {where} timed out", "is the host up and on the network?")
        if isinstance(exc, (OSError, paramiko.ssh_exception.NoValidConnectionsError)):
            return Problem(host, f"unreachable: cannot connect to {where} ({exc})",
                           "is the host up and sshd running? check HostName/Port in the ssh config")
        return Problem(host, f"ssh to {where} failed: {exc}")

    # -- preflight ---------------------------------------------------------------------
    # The agents are the probes: each starts held (--hold), reports its host's facts and waits; only when
    # every host has passed does start() tell them to go. A failure anywhere closes every held agent
    # before any worker exists. This spares a second remote python start and round trip per host.
    def holds(self) -> bool:
        return self.request.checks_hosts()

    def _check_exit(self, host: str, rc: int | None, err: str) -> Problem:
        """Why an agent ended before reporting its facts."""
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

    def _check_facts(self, host: str, facts: dict) -> list[Problem]:
        import platform

        problems = []
        if facts["podrun"] != podrun.__version__:
            problems.append(Problem(host, f"podrun {facts['podrun']} there, {podrun.__version__} here",
                                    f"install podrun=={podrun.__version__} on the host"))
        if facts["python"].rsplit(".", 1)[0] != platform.python_version().rsplit(".", 1)[0]:
            problems.append(Problem(host, f"python {facts['python']} there, {platform.python_version()} here",
                                    "use the same Python version (--python)"))
        for port in facts.get("ports_busy", []):
            problems.append(busy_port_problem(host, self.request, port))
        if facts.get("missing"):
            from podrun.launch.probe import missing_text

            problems.append(Problem(host, *missing_text(self.request.python, facts["missing"], "the recipe")))
        return problems

    def _preflight_instance(self, inst) -> tuple["SSHHandle | None", list[Problem]]:
        try:
            handle = self._start_one(inst, hold=True)
        except BaseException as exc:  # noqa: BLE001
            return None, [self._problem(inst.host, exc)]
        try:
            facts = handle.wait_probe(PROBE_TIMEOUT)
        except queue.Empty:
            return handle, [Problem(inst.host, f"the instance agent did not report in {PROBE_TIMEOUT:g} s",
                                    "is the host overloaded, or does a login script (~/.bashrc) hang?")]
        if facts is None:
            return handle, [self._check_exit(inst.host, handle.wait(2.0), handle.early_errors())]
        return handle, self._check_facts(inst.host, facts)

    def preflight(self) -> list[Problem]:
        insts = list(self.request.instances)
        with self._pool(len(insts)) as ex:
            results = list(ex.map(self._preflight_instance, insts))
        problems = list(dict.fromkeys(p for _, r in results for p in r))   # once per host, not per instance
        handles = [h for h, _ in results if h is not None]
        if problems:
            _dismiss(handles)
            return problems
        self._held = handles
        return []

    # -- start -------------------------------------------------------------------------
    def _start_one(self, inst, hold: bool = False) -> SSHHandle:
        client = self._connect(inst.host)
        chan = client.get_transport().open_session(timeout=self.opts.connect_timeout)
        chan.exec_command(self.request.shell_command(inst.index, hold=hold))
        return SSHHandle(inst.index, inst.host, client, chan)

    def start(self) -> list[InstanceHandle]:
        if self._held is not None:     # preflight passed: its agents are waiting for the go
            held, self._held = self._held, None
            for h in held:
                h.go()
            return held
        insts = list(self.request.instances)
        handles: list[SSHHandle | None] = [None] * len(insts)
        errors: list[Problem] = []

        def one(k: int) -> None:
            try:
                handles[k] = self._start_one(insts[k])
            except BaseException as exc:  # noqa: BLE001
                errors.append(self._problem(insts[k].host, exc))

        with self._pool(len(insts)) as ex:
            list(ex.map(one, range(len(insts))))
        if errors:
            for h in handles:
                if h is not None:
                    h.kill()
            raise LaunchError("could not start the instance agents:\n" + "\n".join(f"  - {p}" for p in errors),
                              hint="the agents that had started were ended")
        return handles  # type: ignore[return-value]

    def close(self) -> None:
        held, self._held = self._held or [], None
        _dismiss(held)
        with self.lock:
            clients, self.clients = list(self.clients.values()), {}
        for c in clients:
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass


def _dismiss(handles: list[SSHHandle], timeout: float = 3.0) -> None:
    """Tell held agents to stop (they have started nothing) and wait, bounded, until they are gone."""
    for h in handles:
        h.terminate()
    deadline = time.monotonic() + timeout
    for h in handles:
        h.wait(max(0.0, deadline - time.monotonic()))
        h.kill()
