"""A machine's facts and ports: preflight facts (podrun and python versions, busy ports, how MASTER_ADDR resolves),
its network interfaces (which one reaches the master), and the listening sockets a port is held by."""
from __future__ import annotations

import errno
import fcntl
import importlib.util
import os
import random
import socket
import struct
import subprocess
import sys
from dataclasses import dataclass

from podrun import pystart
from podrun.wire.protocol import Record

PICK_FROM = 10000          # the lowest port pick_free_port tries


def python_version() -> str:
    """This interpreter's version, ``3.11.7``, from sys.version_info (the platform module would parse sys.version
    with regular expressions it compiles at its import: 4.4-4.7 ms of each agent's start, for this one string)."""
    return "%d.%d.%d" % sys.version_info[:3]


def port_free(port: int) -> bool:
    """True when a TCP listener could bind ``port`` on every address (what torch's store will do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("", port))
        except OSError:
            return False
    return True


def ephemeral_low() -> int:
    """The first port of net.ipv4.ip_local_port_range (Linux's default when it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def pick_free_port() -> int:
    """A port free now, below the ephemeral range: one that nothing will hold, so the program that binds it
    later (with a window in between) cannot lose it to a client socket's source port."""
    top = ephemeral_low()
    for _ in range(200):
        port = random.randrange(PICK_FROM, top)
        if port_free(port):
            return port
    raise OSError(f"no free port found between {PICK_FROM} and {top}")


def missing_modules(python: str, modules) -> list[str]:
    """The ``modules`` that ``python`` cannot import, found without importing them (importlib.util.find_spec);
    all of them when ``python`` cannot be run."""
    modules = list(modules)
    # this python, started with its site (a lean agent runs without: it asks a python started as usual)
    if os.path.abspath(python) == os.path.abspath(sys.executable) and not sys.flags.no_site:   # not realpath: venvs
        return [m for m in modules if importlib.util.find_spec(m) is None]
    code = ("import importlib.util,sys; print(' '.join(m for m in sys.argv[1:] "
            "if importlib.util.find_spec(m) is None))")
    try:
        cp = pystart.run(pystart.safe(python, *modules, code=code, root=None), stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return modules
    if cp.returncode != 0:
        return modules
    return cp.stdout.split()


def missing_text(python: str, missing, what: str) -> tuple[str, str]:
    """(problem, hint) for a --python that cannot import ``missing``, which ``what`` needs on every worker."""
    return (f"{python} cannot import {', '.join(missing)}, which {what} needs on every worker",
            f"install podrun's training extra for that python: {python} -m pip install 'podrun[train]' "
            "(from a checkout: pip install -e '.[train]'), or give --python a python that has it")
REACH_TIMEOUT = 3.0       # seconds a worker host's probe waits for the master's TCP answer


@dataclass(frozen=True)
class Reach(Record):
    """Whether the master answered TCP from a host (``ok``), the interface the connection went ``via``, and why not
    (``error``: timed out, no route)."""

    ok: bool
    via: str = "?"
    error: str = ""


@dataclass(frozen=True)
class Facts(Record):
    """``probe``: a held agent's preflight facts: ``podrun`` and ``python`` versions, the ``hostname``, the run's
    ``ports`` on the host and the busy ones among them (``ports_busy``), the modules it needs that its python cannot
    import (``missing``), its ``interfaces`` with an IPv4 or a global IPv6 address, the addresses MASTER_ADDR
    resolves to there (``master_resolves``; None: not asked) and, from a worker host, whether the master answers
    there (``master_reach``)."""

    KIND = "probe"
    podrun: str
    python: str
    hostname: str = ""
    ports: tuple[int, ...] = ()
    ports_busy: tuple[int, ...] = ()
    missing: tuple[str, ...] = ()
    interfaces: tuple[str, ...] = ()
    master_resolves: tuple[str, ...] | None = None
    master_reach: Reach | None = None


def facts(ports=(), busy=None, needs=(), master_addr: str | None = None, master_port: int | None = None) -> Facts:
    """This host's Facts: ``busy``, the run's ports the caller found busy binding the ports it holds (else each
    port is tried here); ``needs``, the modules to look for; the master's resolution with ``master_addr``, and
    with ``master_port`` too (a worker host) whether the master answers there (see reach)."""
    import podrun

    ports = tuple(ports)
    resolves = tuple(resolve(master_addr)) if master_addr is not None else None
    return Facts(podrun.__version__, python_version(), socket.gethostname(), ports,
                 tuple(busy) if busy is not None else tuple(p for p in ports if not port_free(p)),
                 tuple(missing_modules(sys.executable, needs)) if needs else (),
                 tuple(sorted(set(interface_addresses()) | set(interface_addresses6()))), resolves,
                 reach(master_addr, master_port) if master_addr is not None and master_port is not None else None)


def reach(addr: str, port: int, timeout: float = REACH_TIMEOUT) -> Reach:
    """Whether ``addr`` answers TCP on ``port`` from here. A refused connection counts as reached (the host
    answered; rank 0's store may not listen yet); a timeout, no route or an unreachable network does not."""
    targets = resolve(addr)             # a name: the route to the address it resolves to first, of either family
    src = route_source(targets[0]) if targets else None
    via = (interface_of(src) if src else None) or "?"
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            pass
    except ConnectionRefusedError:
        pass
    except OSError as exc:
        why = "timed out" if isinstance(exc, (socket.timeout, TimeoutError)) else (exc.strerror or str(exc))
        return Reach(False, via, why)
    return Reach(True, via)


def resolve(name: str) -> list[str]:
    """The addresses ``name`` resolves to on this host, in the resolver's order; [] when it does not."""
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, OSError):
        return []
    return list(dict.fromkeys(str(i[4][0]) for i in infos))


def is_loopback(addr: str) -> bool:
    return addr.startswith("127.") or addr == "::1"


def is_ipv6(addr: str) -> bool:
    return ":" in addr


SIOCGIFADDR = 0x8915


def interface_addresses() -> dict[str, str]:
    """interface name -> its (primary) IPv4 address, for every interface that has one."""
    out = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            out[name] = socket.inet_ntoa(raw[20:24])
    return out


IF_INET6 = "/proc/net/if_inet6"     # Linux: address, index, prefix length, scope, flags, name per line
IPV6_SCOPE_GLOBAL = 0x00
IFA_F_UNUSABLE = 0x40 | 0x08         # IFA_F_TENTATIVE, IFA_F_DADFAILED: not yet (or never) usable


def ipv6_addresses() -> list[tuple[str, str]]:
    """(interface, address) for every usable global-scope IPv6 address of this host (link-local and loopback
    left out: another host cannot reach them by address alone), as the kernel lists them; [] without IPv6."""
    out = []
    try:
        with open(IF_INET6) as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        words = line.split()
        if len(words) != 6 or len(words[0]) != 32:
            continue
        try:
            scope, flags = int(words[3], 16), int(words[4], 16)
            addr = socket.inet_ntop(socket.AF_INET6, bytes.fromhex(words[0]))
        except ValueError:
            continue
        if scope == IPV6_SCOPE_GLOBAL and not flags & IFA_F_UNUSABLE:
            out.append((words[5], addr))
    return out


def interface_addresses6() -> dict[str, str]:
    """interface name -> one global IPv6 address of it, for every interface that has one."""
    out: dict[str, str] = {}
    for name, addr in ipv6_addresses():
        out.setdefault(name, addr)
    return out


def interface_address(name: str) -> str | None:
    """The address podrun gives for interface ``name`` (--data-interface): its IPv4 address, else (an IPv6-only
    network) its global IPv6 address; None when it has neither."""
    return interface_addresses().get(name) or interface_addresses6().get(name)


def route_source(addr: str) -> str | None:
    """The local address (IPv4 or IPv6, as ``addr`` is) the kernel would send from to reach ``addr`` (a route
    lookup: a UDP socket is connected, nothing is sent); None when there is no route."""
    family = socket.AF_INET6 if is_ipv6(addr) else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((addr, 9))
            return s.getsockname()[0]
    except OSError:
        return None


def interface_of(addr: str) -> str | None:
    """The interface that holds the local address ``addr`` (IPv4, or a global IPv6 one)."""
    if is_ipv6(addr):
        want = socket.inet_pton(socket.AF_INET6, addr.split("%", 1)[0])
        return next((name for name, a in ipv6_addresses() if socket.inet_pton(socket.AF_INET6, a) == want), None)
    return next((name for name, a in interface_addresses().items() if a == addr), None)


def gloo_interface(master_addr: str, hostname: str | None = None) -> str | None:
    """The interface gloo must bind on this host, when its own default would be loopback; else None.

    gloo (torch's ProcessGroupGloo) binds to the address the machine's hostname resolves to and tells the
    other ranks that address. Where the hostname maps to loopback (Debian's and Ubuntu's ``127.0.1.1
    HOSTNAME`` line in /etc/hosts) every rank there would advertise 127.0.1.1 and the other hosts would
    wait on themselves. Then: the interface on the route to MASTER_ADDR; on the master host itself (where
    MASTER_ADDR may be this host's loopback name) the one the ssh connection came in on (SSH_CONNECTION),
    else the first interface with a non-loopback address.
    """
    own = resolve(hostname or socket.gethostname())
    if own and not all(is_loopback(a) for a in own):
        return None
    for target in resolve(master_addr):
        if is_loopback(target):
            continue
        src = route_source(target)
        name = interface_of(src) if src else None
        if name is not None and not is_loopback(src):
            return name
    server = (os.environ.get("SSH_CONNECTION") or "").split()
    if len(server) == 4 and not is_loopback(server[2]):
        name = interface_of(server[2])
        if name is not None:
            return name
    return next((name for name, a in [*interface_addresses().items(), *interface_addresses6().items()]
                 if not is_loopback(a)), None)


def listen(port: int) -> socket.socket:
    """A listening socket on every address (IPv4 and IPv6 where the host has it); port 0: the kernel picks.
    TCP_NODELAY is set on it, so the store's accepted connections have it (Linux passes it on at accept)."""
    sock = None
    if socket.has_dualstack_ipv6():
        try:
            sock = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=4096)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:     # no point trying IPv4 alone
                raise
    if sock is None:
        sock = socket.create_server(("", port), backlog=4096)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def torch_available(python: str | None = None) -> bool:
    """Whether ``python`` (default: this one) can import torch, found without importing it."""
    return not missing_modules(sys.executable if python is None else python, ["torch"])


def reserve(port: int) -> socket.socket:
    """The controller's hold on a port of this machine (0: a free one), handed to rank 0's local agent."""
    sock = listen(port)
    os.set_inheritable(sock.fileno(), False)   # passed on explicitly (pass_fds), to the agent only
    return sock
