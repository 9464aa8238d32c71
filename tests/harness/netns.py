"""NetnsHosts: real OpenSSH hosts, each in its own network + UTS + mount namespace, for tests and benchmarks.

    with NetnsHosts(3) as hosts:
        subprocess.run(["ssh", "-F", hosts.ssh_config_path, "h1", "hostname"])   # -> h1

What a host is: a network namespace on a private bridge (10.200.<slot>.0/24; the root namespace is
10.200.<slot>.1 = ``controller_address``, called ``controller`` and by the machine's hostname inside
the hosts), its own hostname h1..hn, its own /etc/hosts (all hosts + controller) and
/etc/resolv.conf (127.0.0.1: no DNS query leaves the machine), and an sshd on <address>:22 with
its own host key. The filesystem is shared: sys.executable and the editable podrun are at the same
paths on every host.

PATH seen by a remote command over ssh: sshd starts `bash -c CMD` with its compiled-in default
PATH (/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin), and Debian's bash then sources
~/.bashrc for ssh commands. The machine's /root/.bashrc (pyenv init: 0.1-0.3 s per command, and
stalls of many seconds on pyenv's rehash lock when several sessions start at once) is replaced
inside every host by a bind-mounted one (``bashrc``). By default it puts the directory of
sys.executable first, so a remote command sees
    PATH=<dirname(sys.executable)>:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
(`python` and `podrun` are the test session's), and the test session's PYTHONPATH when it has one
(a checkout tested beside the installed podrun is the one the hosts import). NetnsHosts(bashrc="") gives bare hosts where
`python3` is Debian's /usr/bin/python3 without podrun. Launchers should still run Python by
absolute path (``hosts.python`` == sys.executable: the filesystem is shared). `exec()` and
`popen()` (no ssh) keep the caller's environment.
"""
from __future__ import annotations

import ipaddress
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from .common import (BASE, BASE_TOOLS, Fabric, FabricAccess, HarnessError, check_prerequisites, host_prefix,
                     ip_batch, pid_from_file, subnet_in_use, tcp_open, wait_for)

SSHD = "/usr/sbin/sshd"
KIND = "hosts"
BASTION = "bastion"                  # the gateway's name in the bastion topology
DEBIAN_OWN_NAME_ADDRESS = "127.0.1.1"   # what Debian's installer maps the machine's own name to


def _names(slot: int) -> dict:
    return dict(netns_prefix=f"prh{slot}-", veth_prefix=f"prv{slot}-", bridge=f"prb{slot}",
                net=f"10.200.{slot}")


def _net6(slot: int) -> str:
    """The IPv6 subnet of a slot (ipv6 and ipv6_only topologies): <net6>/64 on the bridge, inside <net6>/48."""
    return str(ipaddress.IPv6Address(f"fd00:200:{slot}::"))   # canonical (slot 0: fd00:200::), as ssh writes it


def _data_names(slot: int) -> dict:
    """The second (data) network of the two-network topology: its bridge, veths and subnet."""
    return dict(bridge=f"prd{slot}", veth_prefix=f"prw{slot}-", net=f"10.203.{slot}")


def _cleanup_slot(slot: int) -> None:
    n = _names(slot)
    Fabric.teardown_leftovers(n["netns_prefix"], n["veth_prefix"], n["bridge"])
    d = _data_names(slot)
    Fabric.teardown_leftovers("-", d["veth_prefix"], d["bridge"])
    ip_batch([f"route del unreachable {d['net']}.0/24", f"route del unreachable {_net6(slot)}/48"], check=False)
    shutil.rmtree(BASE / f"{KIND}-{slot}", ignore_errors=True)


def default_bashrc() -> str:
    """The hosts' ~/.bashrc unless one is given: this session's python first on PATH, and its PYTHONPATH (a
    checkout tested beside the installed one: the hosts import it too) and OMP_WAIT_POLICY (tests/conftest.py)."""
    bashrc = f'export PATH="{os.path.dirname(sys.executable)}:$PATH"\n'
    for name in ("PYTHONPATH", "OMP_WAIT_POLICY"):
        if os.environ.get(name):
            bashrc += f"export {name}={shlex.quote(os.environ[name])}\n"
    return bashrc


class NetnsHosts(FabricAccess):
    """n OpenSSH hosts in network namespaces; a context manager (``close()`` is idempotent).

    Files (all under ``run_dir``): ``key_path`` (client ed25519 key, authorised on every host),
    ``ssh_config_path`` (Host h1..hn -> HostName <ip>, User root, Port 22, IdentityFile, BatchMode,
    ConnectTimeout 5, StrictHostKeyChecking yes, UserKnownHostsFile = ``known_hosts_path``),
    ``known_hosts_path`` (each host's real key under its alias and its IP),
    ``ssh_config_unknown_path`` (same, but no known hosts: every host key is unknown),
    ``ssh_config_wrong_host_key_path`` / ``known_hosts_wrong_path`` (a key no host has),
    ``wrong_key_path`` (a client key no host authorises).

    Topologies (docs/test-harness.md): ``bastion=True`` (a gateway host that alone is reachable from the
    controller; the config gives the others ProxyJump), ``loopback_hostname=True`` (Debian's
    ``127.0.1.1 HOSTNAME``), ``ca=True`` (user and host certificate authorities, an agent-only key),
    ``data_network=True`` (a second network, eth1), ``ipv6=True`` (IPv6 addresses on eth0), ``ipv6_only=True``
    (IPv6 addresses only: ``addresses`` are IPv6, names resolve to them, ssh goes over IPv6).
    """

    def __init__(self, n: int = 4, name_prefix: str = "h", *, bashrc: str | None = None, start: bool = True,
                 bastion: bool = False, loopback_hostname: bool = False, ca: bool = False,
                 data_network: bool = False, ipv6: bool = False, ipv6_only: bool = False):
        if n < 1 or n > 200:
            raise HarnessError(f"podrun test harness: NetnsHosts(n={n}): n must be 1..200")
        self.n, self.name_prefix = n, name_prefix
        # topologies (docs/test-harness.md): a gateway that alone is reachable from the controller, and
        # Debian's /etc/hosts (a host's own name -> 127.0.1.1)
        self.bastion = BASTION if bastion else None
        self.loopback_hostname = loopback_hostname
        self.ca = ca       # certificate authorities for users and hosts, and an agent-only key
        self._agents: list[int] = []      # ssh-agent pids (ssh_agent())
        self.data_network = data_network  # a second network (eth1) the hosts share and the controller is not on
        self.data_addresses: dict[str, str] = {}
        self.ipv6 = ipv6                  # every host also gets an IPv6 address (``addresses6``), sshd listens on it
        self.addresses6: dict[str, str] = {}
        # hosts with no IPv4 but loopback: every address of the fabric is IPv6 (``addresses``, /etc/hosts, ssh)
        self.ipv6_only = ipv6_only
        if ipv6_only and (ipv6 or data_network):
            raise HarnessError("podrun test harness: ipv6_only=True takes neither ipv6=True (dual stack) nor "
                               "data_network=True (an IPv4 network)")
        self.bashrc = default_bashrc() if bashrc is None else bashrc
        self._init_life()
        if start:
            self.start()

    # ------------------------------------------------------------------ life cycle
    def start(self) -> "NetnsHosts":
        t0 = time.monotonic()
        check_prerequisites(BASE_TOOLS + ((SSHD, "openssh-server"), ("ssh", "openssh-client"),
                                          ("ssh-keygen", "openssh-client")))
        self.slot = self._take_slot(KIND, _cleanup_slot, lambda s: not subnet_in_use(f"10.200.{s}"))
        return self._bring_up(self._start_hosts, since=t0)

    def _start_hosts(self) -> None:
        """The namespaces, keys and ssh files, then every sshd, waited for."""
        self.run_dir = BASE / f"{KIND}-{self.slot}"
        self.run_dir.mkdir(parents=True)
        os.chmod(self.run_dir, 0o700)
        names = [f"{self.name_prefix}{i}" for i in range(1, self.n + 1)] + ([self.bastion] if self.bastion else [])
        binds = []
        home_bashrc = os.path.expanduser("~root/.bashrc")
        if os.path.isfile(home_bashrc):
            (self.run_dir / "bashrc").write_text("# podrun test host: replaces ~/.bashrc inside the host\n"
                                                 + self.bashrc)
            binds.append((str(self.run_dir / "bashrc"), home_bashrc))
        self.fabric = Fabric(**_names(self.slot), names=names, run_dir=self.run_dir, binds=binds,
                             own_name_address=DEBIAN_OWN_NAME_ADDRESS if self.loopback_hostname else None,
                             net6=_net6(self.slot) if self.ipv6_only else None)
        keygen = self._keygen_start(names)
        if self.ipv6 or self.ipv6_only:
            # the slot's whole IPv6 prefix stays on this machine: what is not on the bridge is refused here
            ip_batch([f"route add unreachable {_net6(self.slot)}/48"])
        self.fabric.up()
        if self.bastion:
            self._wall_off()
        if self.data_network:
            self._data_up()
        if self.ipv6:
            self._ipv6_up()
        for p in keygen:
            if p.wait(timeout=30) != 0:
                raise HarnessError(f"podrun test harness: ssh-keygen failed: {p.stderr.read()}")
        self._write_ssh_files()
        if self.ca:
            self._write_ca_files()
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
        for h in self.fabric.nodes:
            self._start_sshd(h, wait=False)
        for h in self.fabric.nodes:
            self._wait_sshd(h)

    def _data_up(self) -> None:
        """Two-network topology: a second bridge (no address in the root namespace, which gets an ``unreachable``
        route for the subnet so nothing it sends there leaves the machine by its default route) and an ``eth1``
        in every host on 10.203.<slot>.0/24 (``data_addresses``). Names and ssh stay on the first (management)
        network."""
        d = _data_names(self.slot)
        # the root namespace's default route would send the data subnet off the machine: refuse it here
        lines = [f"route add unreachable {d['net']}.0/24", f"link add {d['bridge']} type bridge",
                 f"link set {d['bridge']} up"]
        for i, h in enumerate(self.hosts, start=1):
            ns = self.fabric.node(h).netns
            lines += [f"link add {d['veth_prefix']}{i} type veth peer name eth1 netns {ns}",
                      f"link set {d['veth_prefix']}{i} master {d['bridge']} up"]
        ip_batch(lines)
        for i, h in enumerate(self.hosts, start=1):
            self.data_addresses[h] = f"{d['net']}.{i + 1}"
            ip_batch([f"addr add {self.data_addresses[h]}/24 dev eth1", "link set eth1 up"],
                     netns=self.fabric.node(h).netns)

    def _ipv6_up(self) -> None:
        """IPv6 on the management network: fd00:200:<slot>::1/64 on the bridge, ::<i+1> on each host's eth0
        (no duplicate address detection, so they are usable at once). known_hosts lists these addresses too."""
        net = _net6(self.slot)
        ip_batch([f"addr add {net}1/64 dev {self.fabric.bridge} nodad"])
        for i, h in enumerate(self.fabric.nodes, start=1):
            self.addresses6[h] = f"{net}{i + 1}"
            ip_batch([f"addr add {self.addresses6[h]}/64 dev eth0 nodad"], netns=self.fabric.node(h).netns)

    def data_link(self, host: str, up: bool) -> None:
        """Bring host's data-network link (its root-side veth) down or up; the management network stays."""
        i = self.hosts.index(host) + 1
        ip_batch([f"link set {_data_names(self.slot)['veth_prefix']}{i} {'up' if up else 'down'}"])

    def _wall_off(self) -> None:
        """Bastion topology: no compute host has a route back to the controller (an ``unreachable`` route to
        its address), so only the bastion can talk to them; they still reach each other and the bastion."""
        for h in self.hosts:
            ip_batch([f"route add unreachable {host_prefix(self.controller_address)}"], netns=self.fabric.node(h).netns)

    def _teardown(self) -> None:
        """Kill everything in the hosts, delete veths, namespaces and bridge (``close()`` releases the slot)."""
        for pid in self._agents:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.fabric is not None:
            self.fabric.close()
        if self.data_network and self._lock is not None:
            d = _data_names(self._lock.slot)
            Fabric.teardown_leftovers("-", d["veth_prefix"], d["bridge"])
            ip_batch([f"route del unreachable {d['net']}.0/24"], check=False)
        if (self.ipv6 or self.ipv6_only) and self._lock is not None:
            ip_batch([f"route del unreachable {_net6(self._lock.slot)}/48"], check=False)
        if self._lock is not None:
            shutil.rmtree(BASE / f"{KIND}-{self._lock.slot}", ignore_errors=True)

    # ------------------------------------------------------------------ properties
    @property
    def hosts(self) -> list[str]:
        """The compute hosts h1..hn (not the bastion)."""
        return [h for h in self.fabric.nodes if h != self.bastion]

    @property
    def python(self) -> str:
        """The interpreter to run on hosts (same path on every host: the filesystem is shared)."""
        return sys.executable

    def ssh_argv(self, host: str, *command: str, config: str | None = None) -> list[str]:
        """argv of OpenSSH's client running command on host with this harness's config."""
        return ["ssh", "-F", config or self.ssh_config_path, host, *command]

    # ------------------------------------------------------------------ namespaces

    def enter_argv(self, host: str, cwd: str | None = None) -> list[str]:
        """argv prefix (nsenter ...) that enters host's namespaces."""
        return self.fabric.enter_argv(host, cwd)

    def sshd_pid(self, host: str) -> int | None:
        return pid_from_file(self.run_dir / f"sshd-{host}.pid", "sshd")

    # ------------------------------------------------------------------ faults

    def freeze(self, host: str) -> None:
        """SIGSTOP every process on host (a hung host; the kernel still ACKs TCP)."""
        self.fabric.kill_all(host, signal.SIGSTOP)

    def thaw(self, host: str) -> None:
        self.fabric.kill_all(host, signal.SIGCONT)

    def partition(self, group_a: Sequence[str], group_b: Sequence[str]) -> None:
        """Blackhole routes between every host of group_a and every host of group_b."""
        self.fabric.partition(group_a, group_b, add=True)

    def unpartition(self, group_a: Sequence[str], group_b: Sequence[str]) -> None:
        self.fabric.partition(group_a, group_b, add=False)

    def stop_sshd(self, host: str) -> None:
        """Kill host's sshd listener only (running sessions and processes stay)."""
        pid = self.sshd_pid(host)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not tcp_open(self.address(host), 22, 0.1) and self.sshd_pid(host) is None,
                     5, f"sshd on {host} to stop")

    def revive(self, host: str) -> None:
        """Link up and (re)start sshd on host (after crash, poweroff or stop_sshd)."""
        self.fabric.link(host, True)
        if self.sshd_pid(host) is None:
            self._start_sshd(host)

    # ------------------------------------------------------------------ internals
    def _keygen_start(self, names: list[str]) -> list[subprocess.Popen]:
        jobs = [("id_ed25519", "client"), ("wrong_id_ed25519", "not authorised"),
                ("wrong_hostkey", "no host has this key")]
        jobs += [(f"hostkey-{h}", h) for h in names]
        return [subprocess.Popen(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment,
                                  "-f", str(self.run_dir / f)], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                for f, comment in jobs]

    def _write_ssh_files(self) -> None:
        d = self.run_dir
        self.key_path = str(d / "id_ed25519")
        self.wrong_key_path = str(d / "wrong_id_ed25519")
        (d / "authorized_keys").write_text((d / "id_ed25519.pub").read_text())
        pub = lambda f: " ".join((d / f).read_text().split()[:2])  # noqa: E731
        self.known_hosts_path = str(d / "known_hosts")
        Path(self.known_hosts_path).write_text("".join(
            f"{h},{a}{',' + self.addresses6[h] if h in self.addresses6 else ''} {pub(f'hostkey-{h}.pub')}\n"
            for h, a in self.addresses.items()))
        self.known_hosts_wrong_path = str(d / "known_hosts_wrong")
        Path(self.known_hosts_wrong_path).write_text("".join(
            f"{h},{a} {pub('wrong_hostkey.pub')}\n" for h, a in self.addresses.items()))
        self.ssh_config_path = self._ssh_config("ssh_config", self.known_hosts_path)
        self.ssh_config_unknown_path = self._ssh_config("ssh_config_unknown", "/dev/null")
        self.ssh_config_wrong_host_key_path = self._ssh_config("ssh_config_wrong_host_key",
                                                               self.known_hosts_wrong_path)
        self.sshd_config_path = str(d / "sshd_config")
        Path(self.sshd_config_path).write_text(f"""\
AuthorizedKeysFile {d}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
PrintMotd no
PrintLastLog no
MaxStartups 200
MaxSessions 200
AcceptEnv *
Subsystem sftp /usr/lib/openssh/sftp-server
LogLevel ERROR
""")

    def _write_ca_files(self) -> None:
        """The certificate topology: a user CA the hosts trust (TrustedUserCAKeys) and a client key that only
        its certificate gets in (``ca_key_path``, certificate ``ca_key_path + "-cert.pub"`` beside it); a host CA
        that signed every host key (each sshd presents its HostCertificate) with a known_hosts of one
        ``@cert-authority`` line (``known_hosts_ca_path``) and ``ssh_config_ca_path`` using both; and
        ``agent_key_path``, a key encrypted with ``agent_passphrase`` that the hosts accept, for ssh-agent tests
        (``ssh_config_agent_path``: no IdentityFile; the key comes from the agent)."""
        d = self.run_dir
        jobs = [("user_ca", "user CA", ""), ("host_ca", "host CA", ""), ("ca_id_ed25519", "needs its certificate", ""),
                ("agent_id_ed25519", "encrypted, for the agent", self.agent_passphrase)]
        procs = [subprocess.Popen(["ssh-keygen", "-q", "-t", "ed25519", "-N", pw, "-C", c, "-f", str(d / f)],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for f, c, pw in jobs]
        for p in procs:
            if p.wait(timeout=30) != 0:
                raise HarnessError(f"podrun test harness: ssh-keygen failed: {p.stderr.read()}")
        sign = [["ssh-keygen", "-q", "-s", str(d / "user_ca"), "-I", "podrun-test-user", "-n", "root", "-V", "-5m:+1d",
                 str(d / "ca_id_ed25519.pub")]]
        sign += [["ssh-keygen", "-q", "-s", str(d / "host_ca"), "-I", f"host-{h}", "-h", "-n", f"{h},{a}",
                  "-V", "-5m:+1d", str(d / f"hostkey-{h}.pub")] for h, a in self.addresses.items()]
        for argv in sign:
            subprocess.run(argv, check=True, capture_output=True, timeout=30)
        self.ca_key_path = str(d / "ca_id_ed25519")
        self.agent_key_path = str(d / "agent_id_ed25519")
        with open(d / "authorized_keys", "a") as f:
            f.write((d / "agent_id_ed25519.pub").read_text())
        with open(self.sshd_config_path, "a") as f:
            f.write(f"TrustedUserCAKeys {d}/user_ca.pub\n")
        self.known_hosts_ca_path = str(d / "known_hosts_ca")
        Path(self.known_hosts_ca_path).write_text(f"@cert-authority * {(d / 'host_ca.pub').read_text().strip()}\n")
        self.ssh_config_ca_path = self._ssh_config("ssh_config_ca", self.known_hosts_ca_path,
                                                   identity=self.ca_key_path)
        self.ssh_config_agent_path = self._ssh_config("ssh_config_agent", self.known_hosts_path, identity=None)

    agent_passphrase = "podrun-test-passphrase"

    def ssh_agent(self) -> str:
        """Start an ssh-agent (in the root namespace, ended by ``close()``) holding ``agent_key_path``, its
        passphrase given through SSH_ASKPASS; returns the agent's socket path (for SSH_AUTH_SOCK or
        IdentityAgent). Needs ``ca=True``."""
        d = self.run_dir
        sock = str(d / f"agent-{len(self._agents)}.sock")
        cp = subprocess.run(["ssh-agent", "-a", sock], capture_output=True, text=True, timeout=30)
        if cp.returncode != 0:
            raise HarnessError(f"podrun test harness: ssh-agent failed: {cp.stderr.strip()}")
        pid = int(cp.stdout.split("SSH_AGENT_PID=", 1)[1].split(";", 1)[0])
        self._agents.append(pid)
        askpass = d / "askpass"
        askpass.write_text(f"#!/bin/sh\necho {shlex.quote(self.agent_passphrase)}\n")
        askpass.chmod(0o700)
        env = {**os.environ, "SSH_AUTH_SOCK": sock, "SSH_ASKPASS": str(askpass), "SSH_ASKPASS_REQUIRE": "force",
               "DISPLAY": ":0"}
        cp = subprocess.run(["ssh-add", self.agent_key_path], env=env, capture_output=True, text=True,
                            stdin=subprocess.DEVNULL, timeout=30)
        if cp.returncode != 0:
            raise HarnessError(f"podrun test harness: ssh-add failed: {cp.stderr.strip()}")
        return sock

    def _ssh_config(self, name: str, known_hosts: str, identity: str | None = "") -> str:
        """An ssh config for every host; ``identity``: the IdentityFile ("" = ``key_path``, None = none:
        keys come from the agent)."""
        identity = self.key_path if identity == "" else identity
        path = self.run_dir / name
        jump = f"  ProxyJump {self.bastion}\n" if self.bastion else ""
        blocks = [f"Host {h}\n  HostName {a}\n" + (jump if h != self.bastion else "")
                  for h, a in self.addresses.items()]
        blocks.append(f"""\
Host *
  User root
  Port 22
{f"  IdentityFile {identity}{chr(10)}  IdentitiesOnly yes" if identity else "  IdentitiesOnly no"}
  UserKnownHostsFile {known_hosts}
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  CheckHostIP no
  BatchMode yes
  ConnectTimeout 5
  LogLevel ERROR
""")
        path.write_text("".join(blocks))
        return str(path)

    def _start_sshd(self, host: str, wait: bool = True) -> None:
        d = self.run_dir
        (d / f"sshd-{host}.pid").unlink(missing_ok=True)
        cp = self.exec(host, [SSHD, "-f", self.sshd_config_path,
                              "-o", f"ListenAddress={self.address(host)}",
                              *(["-o", f"ListenAddress={self.addresses6[host]}"] if host in self.addresses6 else []),
                              "-o", f"HostKey={d}/hostkey-{host}",
                              *(["-o", f"HostCertificate={d}/hostkey-{host}-cert.pub"] if self.ca else []),
                              "-o", f"PidFile={d}/sshd-{host}.pid",
                              "-E", str(d / f"sshd-{host}.log")], timeout=30)
        if cp.returncode != 0:
            raise HarnessError(f"podrun test harness: sshd on {host} failed to start: "
                               f"{cp.stderr.strip()} (log: {d}/sshd-{host}.log)")
        if wait:
            self._wait_sshd(host)

    def _wait_sshd(self, host: str) -> None:
        a = self.address(host)
        if self.bastion and host != self.bastion:       # walled off from here: ask from the bastion
            probe = [sys.executable, "-c", f"import socket; socket.create_connection(({a!r}, 22), 0.2).close()"]
            wait_for(lambda: self.sshd_pid(host) and self.exec(self.bastion, probe, timeout=10).returncode == 0,
                     20, f"sshd on {host} ({a}:22, from {self.bastion})")
            return
        wait_for(lambda: self.sshd_pid(host) and tcp_open(a, 22), 20, f"sshd on {host} ({a}:22)")

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"slot {getattr(self, 'slot', '?')}"
        return f"NetnsHosts(n={self.n}, {state})"
