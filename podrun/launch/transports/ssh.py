"""The ssh transport's paramiko client (imported only here): one agent per host over an ssh channel, in parallel.

Used where there is no OpenSSH client (``ssh`` on PATH) or with --ssh-client paramiko; otherwise
podrun.launch.transports.openssh runs the system's ``ssh``. Honours an OpenSSH client config (~/.ssh/config or --ssh-config): HostName, User, Port, IdentityFile,
IdentitiesOnly, ConnectTimeout, StrictHostKeyChecking, UserKnownHostsFile, GlobalKnownHostsFile.
Host keys are checked as OpenSSH checks them: against the UserKnownHostsFile(s) (default
~/.ssh/known_hosts, ~/.ssh/known_hosts2) and the GlobalKnownHostsFile(s) (default
/etc/ssh/ssh_known_hosts, /etc/ssh/ssh_known_hosts2); an unknown host is refused unless the config says
``StrictHostKeyChecking accept-new`` (or ``no``), which accepts it and appends its key to the first
UserKnownHostsFile, so that a changed key is refused later; a changed key is always refused.
--no-host-key-check accepts unknown hosts and saves nothing. ProxyJump and ProxyCommand are refused
(per host, at preflight): they need the OpenSSH client. Commands are built with
shlex.quote only; the user's --env travels as the first message on the agent's stdin (--env-stdin,
podrun.wire.envchannel), neither in the command line nor by AcceptEnv.
"""
from __future__ import annotations

import contextlib
import functools
import getpass
import os
import queue
import socket
import threading

import paramiko

from podrun import safefs
from podrun.errors import LaunchError
from podrun.launch.transports.base import InstanceHandle, Problem, StreamMerger
from podrun.launch.transports.ssh_common import (MAX_SSH_CONFIG_BYTES, HeldAgentTransport, HeldProbe, alive_interval,
                                                 ip_hostname, read_ssh_config, ssh_failure)
USER_KNOWN_HOSTS = "~/.ssh/known_hosts ~/.ssh/known_hosts2"              # OpenSSH's defaults
GLOBAL_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2"


def known_hosts_files(c: dict) -> tuple[list[str], list[str]]:
    """(user files, global files) of an ssh config lookup, OpenSSH's defaults where it names none."""
    def files(key: str, default: str) -> list[str]:
        value = c.get(key) or default
        words = value.split() if isinstance(value, str) else [w for v in value for w in v.split()]
        return [os.path.expanduser(w) for w in words]

    return files("userknownhostsfile", USER_KNOWN_HOSTS), files("globalknownhostsfile", GLOBAL_KNOWN_HOSTS)


class ProxyUnsupported(Exception):
    """The ssh config asks for a ProxyJump/ProxyCommand (the directive's name in args[0])."""


class AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """``StrictHostKeyChecking accept-new``: a host with no key in known_hosts is accepted and its key is
    added to ``path`` (a changed key never reaches a policy: paramiko refuses it first). The file is written whole
    through podrun.safefs (never through a link, never another user's file); a line another process adds at the
    same moment may be lost, and its host is then accepted anew next time."""

    _lock = threading.Lock()

    def __init__(self, path: str):
        self.path = path

    def missing_host_key(self, client, hostname, key) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        if self.path == "/dev/null":
            return
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n".encode()
        with self._lock:
            d = os.path.dirname(os.path.abspath(self.path))
            if not os.path.isdir(d):
                safefs.make_dirs(d, "known_hosts directory", error=LaunchError)
            old = b""
            if os.path.lexists(self.path):
                old = safefs.read_user_file(self.path, "known_hosts file", limit=MAX_SSH_CONFIG_BYTES,
                                            error=LaunchError)
            if old and not old.endswith(b"\n"):
                old += b"\n"
            safefs.write_file(self.path, old + line, "known_hosts file", error=LaunchError)


class SSHHandle(HeldProbe, InstanceHandle):
    def __init__(self, index: int, host: str, client: paramiko.SSHClient, chan: paramiko.Channel):
        self.label = host
        self.instances = (index,)
        self.client = client
        self.chan = chan
        self._init_probe(StreamMerger(chan.makefile("rb"), chan.makefile_stderr("rb")))
        self._out: queue.Queue = queue.Queue()
        self._dead = False
        threading.Thread(target=self._writer, daemon=True).start()

    def _write(self, data: bytes) -> None:
        self._out.put(data)

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

    def poll(self):
        if self.chan.exit_status_ready():
            rc = self.chan.recv_exit_status()
            return 255 if rc == -1 else rc      # -1: the connection ended without an exit status
        if self._dead or self.chan.closed or not self.client.get_transport() or \
                not self.client.get_transport().is_active():
            return 255
        return None

    def kill(self) -> None:
        """Drop the connection: the agent sees EOF (or, if the link is cut, silence) and ends its workers."""
        self._dead = True
        self.close()
        _close_quietly(self.client)

    def close(self) -> None:
        self._out.put(None)
        _close_quietly(self.chan)


def _close_quietly(thing) -> None:
    """``thing.close()``; a connection that fails to close is closed enough."""
    with contextlib.suppress(Exception):
        thing.close()


class SSHTransport(HeldAgentTransport):
    name = "ssh"

    def __init__(self, request):
        super().__init__(request)
        path = self.opts.config_path or os.path.expanduser("~/.ssh/config")
        self.config = paramiko.SSHConfig()
        if self.opts.config_path or os.path.lexists(path):
            text = read_ssh_config(path, "--ssh-config" if self.opts.config_path else "ssh config")
            try:
                self.config = paramiko.SSHConfig.from_text(text.decode("utf-8", "replace"))
            except Exception as exc:  # noqa: BLE001
                raise LaunchError(f"ssh config {path}: cannot parse it ({exc})") from None
        self.clients: dict[str, paramiko.SSHClient] = {}
        self.host_locks: dict[str, threading.Lock] = {}
        self.lock = threading.Lock()

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
        for key in ("proxyjump", "proxycommand"):
            if str(c.get(key, "none")).lower() != "none":
                raise ProxyUnsupported(key)
        hostname, port = c.get("hostname", host), int(c.get("port", 22))
        user = c.get("user") or getpass.getuser()
        client = paramiko.SSHClient()
        user_files, global_files = known_hosts_files(c)
        for files, load in ((global_files, client.load_system_host_keys), (user_files, client.get_host_keys().load)):
            for f in files:
                if f != "/dev/null" and os.path.isfile(f):
                    load(f)
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
        t.set_keepalive(alive_interval(self.request.keepalive))
        with self.lock:
            self.clients[host] = client
        return client

    def _problem(self, host: str, exc: BaseException) -> Problem:
        c = self.config.lookup(host)
        if isinstance(exc, ProxyUnsupported):
            return Problem(host, f"the ssh config gives {host} a {exc.args[0]}, which the paramiko ssh client "
                                 "does not follow", "install the OpenSSH client (ssh) or drop --ssh-client paramiko")
        fail = functools.partial(ssh_failure, host=host, user=c.get("user") or getpass.getuser(),
                                 hostname=c.get("hostname", host), port=c.get("port", 22))
        if isinstance(exc, socket.gaierror):
            return fail("resolve")
        if isinstance(exc, paramiko.BadHostKeyException):
            return fail("mismatch")
        if isinstance(exc, paramiko.AuthenticationException):
            return fail("auth")
        if isinstance(exc, paramiko.SSHException) and "known_hosts" in str(exc):
            return fail("unknown-key")
        if isinstance(exc, (socket.timeout, TimeoutError)):
            return fail("timeout")
        if isinstance(exc, (OSError, paramiko.ssh_exception.NoValidConnectionsError)):
            return fail("connect", detail=str(exc))
        return fail("other", detail=str(exc))

    def reached_by(self, host: str) -> str | None:
        return ip_hostname(str(self.config.lookup(host).get("hostname", "")))

    def run_command(self, host: str, command: str, timeout: float) -> tuple[int, str, str]:
        client = self._connect(host)
        _, out, err = client.exec_command(command, timeout=timeout)
        rc = out.channel.recv_exit_status()
        return rc, out.read().decode(errors="replace"), err.read().decode(errors="replace")

    # -- start -------------------------------------------------------------------------
    def _start_one(self, inst, hold: bool = False) -> SSHHandle:
        client = self._connect(inst.host)
        chan = client.get_transport().open_session(timeout=self.opts.connect_timeout)
        chan.exec_command(self.request.shell_command(inst.index, hold=hold, env_stdin=True))
        handle = SSHHandle(inst.index, inst.host, client, chan)
        if self.request.env:
            handle._write(self.request.env_message())   # the first bytes on the agent's stdin (--env-stdin)
        return handle

    def close(self) -> None:
        super().close()
        with self.lock:
            clients, self.clients = list(self.clients.values()), {}
        for c in clients:
            _close_quietly(c)

