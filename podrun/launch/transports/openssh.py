"""The ssh transport's OpenSSH client: one ``ssh -T HOST 'cd WORKDIR; exec AGENT'`` subprocess per instance.

The agent protocol travels over the ssh process's stdin/stdout/stderr, as over the local transport's pipes.
The system's ``ssh`` reads the user's config (~/.ssh/config or --ssh-config) itself, so every ssh_config
directive works as it does for ``ssh HOST``: ProxyJump/ProxyCommand, Include, Match, CertificateFile,
IdentityAgent/SSH_AUTH_SOCK, @cert-authority lines in known_hosts, ControlMaster. podrun adds on the
command line only what it must decide: ``-T`` (no tty), ``BatchMode yes`` (never a prompt),
``ServerAliveInterval``/``ServerAliveCountMax`` from --keepalive, ``ConnectTimeout`` where the config sets
none, and with --no-host-key-check ``StrictHostKeyChecking no`` with /dev/null known-hosts files.
Host keys are then checked by OpenSSH itself. ``ssh -G HOST`` (config only, no connection) gives the
user, address and port that messages name.
"""
from __future__ import annotations

import functools
import shutil
import subprocess
from typing import TYPE_CHECKING

from podrun.launch.transports.base import PipedAgentHandle, Problem
from podrun.launch.transports.ssh_common import (ALIVE_COUNT_MAX, HeldAgentTransport, HeldProbe, alive_interval,
                                                 ip_hostname, read_ssh_config, ssh_failure)

if TYPE_CHECKING:  # pragma: no cover
    from podrun.launch.request import LaunchRequest

SSH = "ssh"


def ssh_binary() -> str | None:
    """The OpenSSH client on PATH, or None."""
    return shutil.which(SSH)


class OpenSSHHandle(HeldProbe, PipedAgentHandle):
    def __init__(self, index: int, host: str, proc: subprocess.Popen):
        super().__init__(index, host, proc)
        self._init_probe(self._merger)
        self.slot_held = False


class OpenSSHTransport(HeldAgentTransport):
    name = "ssh"

    def __init__(self, request):
        super().__init__(request)
        from podrun.errors import LaunchError

        self.ssh = ssh_binary()
        if self.ssh is None:
            raise LaunchError("--ssh-client openssh: no ssh client on PATH",
                              hint="install openssh-client, or pass --ssh-client paramiko")
        if self.opts.config_path:
            read_ssh_config(self.opts.config_path, "--ssh-config")

    # -- the ssh command line ------------------------------------------------------------
    def base_argv(self) -> list[str]:
        """``ssh`` and the options podrun decides, before the host."""
        argv = [self.ssh, "-T", "-o", "BatchMode=yes"]
        if self.opts.config_path:
            argv += ["-F", self.opts.config_path]
        argv += ["-o", f"ServerAliveInterval={alive_interval(self.request.keepalive)}",
                 "-o", f"ServerAliveCountMax={ALIVE_COUNT_MAX}"]
        if not self.opts.host_key_check:
            argv += ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                     "-o", "GlobalKnownHostsFile=/dev/null"]
        return argv

    @functools.cache          # a host's config, asked once per transport
    def settings(self, host: str) -> dict[str, str]:
        """The config OpenSSH applies to ``host`` (``ssh -G``: lower-case keys, first value of each)."""
        cp = subprocess.run(self.base_argv() + ["-G", "--", host], capture_output=True, text=True, timeout=30)
        out: dict[str, str] = {}
        if cp.returncode == 0:
            for line in cp.stdout.splitlines():
                key, _, value = line.partition(" ")
                out.setdefault(key.lower(), value)
        else:
            out["error"] = (cp.stderr.strip().splitlines() or ["ssh -G failed"])[-1]
        return out

    def host_argv(self, host: str, command: str) -> list[str]:
        """The exact ssh command line that runs ``command`` on ``host``."""
        argv = self.base_argv()
        s = self.settings(host)
        if s.get("connecttimeout", "none") == "none":
            argv += ["-o", f"ConnectTimeout={int(self.opts.connect_timeout)}"]
        return argv + ["--", host, command]

    def reached_by(self, host: str) -> str | None:
        return ip_hostname(self.settings(host).get("hostname", ""))

    def run_command(self, host: str, command: str, timeout: float) -> tuple[int, str, str]:
        cp = subprocess.run(self.host_argv(host, command), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=timeout)
        return cp.returncode, cp.stdout, cp.stderr

    # -- start ---------------------------------------------------------------------------
    def _start_one(self, inst, hold: bool = False) -> OpenSSHHandle:
        s = self.settings(inst.host)
        if "error" in s:
            raise SSHConfigError(s["error"])
        argv = self.host_argv(inst.host, self.request.shell_command(inst.index, hold=hold, env_stdin=True))
        if hold:
            self.handshakes.acquire()     # freed when the held agent has reported (or ended)
        # no PR_SET_PDEATHSIG: it fires when the forking thread (a pool thread) ends, not the controller. If the
        # controller dies, ssh's stdin closes; the agent reads EOF and ends its workers, then ssh exits.
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except BaseException:
            if hold:
                self.handshakes.release()
            raise
        handle = OpenSSHHandle(inst.index, inst.host, proc)
        handle.slot_held = hold
        if self.request.env:
            handle._write(self.request.env_message())   # the first bytes on the agent's stdin (--env-stdin)
        return handle

    def _probed(self, handle) -> None:
        if handle is not None and handle.slot_held:
            handle.slot_held = False
            self.handshakes.release()

    # -- problems ------------------------------------------------------------------------
    def _problem(self, host: str, exc: BaseException) -> Problem:
        if isinstance(exc, SSHConfigError):
            return Problem(host, f"the ssh config cannot be read for {host}: {exc}", "check --ssh-config")
        return Problem(host, f"cannot run ssh for {host}: {exc}", "is the OpenSSH client installed?")

    def _check_exit(self, host: str, rc: int | None, err: str) -> Problem:
        ssh = self._ssh_error(host, err) if rc == 255 else None
        return ssh if ssh is not None else super()._check_exit(host, rc, err)

    def _ssh_error(self, host: str, err: str) -> Problem | None:
        """OpenSSH's own failure (exit 255 and its message on stderr) as a Problem naming the host."""
        s = self.settings(host)
        fail = functools.partial(ssh_failure, host=host, user=s.get("user", "?"), hostname=s.get("hostname", host),
                                 port=s.get("port", "22"), via=s.get("proxyjump", "none"), detail=_last(err))
        low = err.lower()
        if "could not resolve hostname" in low:
            return fail("resolve")
        if "remote host identification has changed" in low or "host key for" in low and "has changed" in low:
            return fail("mismatch", detail=None)
        if "host key verification failed" in low or "no such host key" in low or "host key is known" in low:
            return fail("unknown-key", detail=None)
        if "permission denied" in low:
            return fail("auth", hint="check IdentityFile/CertificateFile in the ssh config, the ssh agent "
                                     "(SSH_AUTH_SOCK), and the host's authorized_keys")
        if "timed out" in low:
            return fail("timeout")
        if any(w in low for w in ("connection refused", "no route to host", "network is unreachable",
                                  "connection closed by", "connection reset", "closed by remote host",
                                  "ssh_exchange_identification", "kex_exchange_identification")):
            return fail("connect", hint="is the host up and sshd running? check HostName/Port/ProxyJump in the "
                                        "ssh config")
        if err.strip():
            return fail("other")
        return None


class SSHConfigError(Exception):
    """``ssh -G HOST`` refused the config (its message in args[0])."""


def _last(err: str) -> str:
    lines = [ln.strip() for ln in err.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no message"


def ssh_transport(request: "LaunchRequest") -> HeldAgentTransport:
    """The ssh transport for ``request.ssh.client``: ``openssh`` (the system's ssh), ``paramiko``, or ``auto``
    (OpenSSH's client when ``ssh`` is on PATH, as mpirun, pdsh and Ansible use it; else paramiko)."""
    client = request.ssh.client
    if client == "openssh" or (client == "auto" and ssh_binary() is not None):
        return OpenSSHTransport(request)
    from podrun.launch.transports.ssh import SSHTransport

    return SSHTransport(request)
