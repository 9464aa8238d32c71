"""Shared plumbing of the harness: prerequisites, slot locks, and Fabric (bridge + namespaces + anchors)."""
from __future__ import annotations

import atexit
import errno
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

BASE = Path("/run/podrun-harness")
NUM_SLOTS = 64
NETNS_DIR = Path("/run/netns")


class HarnessError(RuntimeError):
    """A harness part is missing or failed: the message names the part (and the apt package)."""


# --------------------------------------------------------------------------- prerequisites

# (executable, apt package that provides it)
BASE_TOOLS = (
    ("ip", "iproute2"),
    ("ss", "iproute2"),
    ("unshare", "util-linux"),
    ("nsenter", "util-linux"),
    ("sleep", "coreutils"),
)


def check_prerequisites(tools: Iterable[tuple[str, str]]) -> None:
    """Raise HarnessError naming every missing part (root, executables and their apt packages)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("root (network namespaces need CAP_NET_ADMIN and CAP_SYS_ADMIN: run the tests as root)")
    missing: dict[str, list[str]] = {}
    for exe, pkg in tools:
        if os.path.isabs(exe):
            ok = os.access(exe, os.X_OK)
        else:
            ok = shutil.which(exe) is not None or any(
                os.access(os.path.join(d, exe), os.X_OK) for d in ("/usr/sbin", "/sbin")
            )
        if not ok:
            missing.setdefault(pkg, []).append(exe)
    for pkg, exes in missing.items():
        problems.append(f"{', '.join(exes)} (apt-get install -y {pkg})")
    if not NETNS_DIR.parent.is_dir():
        problems.append("/run (a tmpfs for namespace files)")
    if problems:
        raise HarnessError("podrun test harness: missing " + "; ".join(problems))


def tool(exe: str) -> str:
    """Absolute path of an executable, also looking in /usr/sbin and /sbin (not on every PATH)."""
    found = shutil.which(exe) or shutil.which(exe, path="/usr/sbin:/sbin:/usr/bin:/bin")
    if not found:
        raise HarnessError(f"podrun test harness: {exe} not found")
    return found


# --------------------------------------------------------------------------- processes

def run(argv: Sequence[str], *, check: bool = True, timeout: float = 30, input: str | None = None,
        env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a helper command; on failure raise HarnessError with the command and its stderr."""
    try:
        cp = subprocess.run(list(argv), input=input, capture_output=True, text=True,
                            timeout=timeout, env=env)
    except FileNotFoundError as e:
        raise HarnessError(f"podrun test harness: cannot run {argv[0]}: {e}") from None
    except subprocess.TimeoutExpired:
        raise HarnessError(f"podrun test harness: {' '.join(argv)} did not finish in {timeout} s") from None
    if check and cp.returncode != 0:
        raise HarnessError(
            f"podrun test harness: `{' '.join(argv)}` failed with exit code {cp.returncode}: "
            f"{(cp.stderr or cp.stdout).strip()[-2000:]}")
    return cp


def ip_batch(lines: Sequence[str], *, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run many `ip` commands in one process (`ip [-n NS] -batch -`)."""
    argv = ["ip"] + (["-n", netns] if netns else []) + ["-batch", "-"]
    if not check:
        argv.insert(1, "-force")  # go on after an error
    return run(argv, input="\n".join(lines) + "\n", check=check)


def wait_for(pred: Callable[[], object], timeout: float, what: str, interval: float = 0.02):
    """Poll pred() until truthy (returned) or raise HarnessError naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise HarnessError(f"podrun test harness: timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def netns_inode(netns: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of a named network namespace, None when it does not exist."""
    try:
        st = os.stat(NETNS_DIR / netns)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def pids_in_netns(netns: str) -> list[int]:
    """Live (non-zombie) pids whose network namespace is /run/netns/<netns> (like `ip netns pids`)."""
    ident = netns_inode(netns)
    if ident is None:
        return []
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry.name}/ns/net")
        except OSError:
            continue  # gone, zombie, or a kernel thread
        if (st.st_dev, st.st_ino) == ident:
            out.append(int(entry.name))
    return sorted(out)


def cmdline(pid: int) -> str | None:
    """The command line of pid with spaces between arguments, None when it has gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")


def is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def kill_pids(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def pid_from_file(path: Path, pattern: str) -> int | None:
    """The pid in a pidfile when that process is alive and its cmdline matches pattern (pidfiles go stale)."""
    try:
        pid = int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    cl = cmdline(pid)
    if cl is None or is_zombie(pid) or not re.search(pattern, cl):
        return None
    return pid


def port_free(port: int) -> bool:
    """True when a listener without SO_REUSEADDR could bind port on every IPv4 address now (stricter than
    podrun.wire.probe.port_free: a port in TIME_WAIT is not free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def await_daemonised(p: subprocess.Popen, what: str, where: str, timeout: float = 30) -> None:
    """Wait for a daemon's first process p to exit (it daemonised); HarnessError naming what, its output and
    where its log is when it failed or did not exit within timeout."""
    try:
        out, err = p.communicate(timeout=timeout)
        out = out or err or ""      # the one of stdout and stderr the start piped
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        out = f"did not daemonise within {timeout:g} s"
    if p.returncode != 0:
        raise HarnessError(f"podrun test harness: {what} failed to start: {out.strip()} ({where})")


def host_prefix(addr: str) -> str:
    """The one-address route prefix of an IPv4 or IPv6 address (a.b.c.d/32, x::y/128)."""
    return f"{addr}/128" if ":" in addr else f"{addr}/32"


def tcp_open(addr: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            return True
    except OSError:
        return False


# --------------------------------------------------------------------------- slots

class SlotLock:
    """An exclusive, process-lifetime lock on slot N of a kind (fcntl lock file under /run/podrun-harness).

    The kernel drops the lock when the holder dies, so a slot whose lock can be taken is free; its
    leftovers (from a crashed session) are torn down by the caller before reuse.
    """

    def __init__(self, kind: str, slot: int, fd: int):
        self.kind, self.slot, self._fd = kind, slot, fd

    @classmethod
    def try_acquire(cls, kind: str, slot: int) -> "SlotLock | None":
        BASE.mkdir(parents=True, exist_ok=True)
        fd = os.open(BASE / f"{kind}-{slot}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return cls(kind, slot, fd)

    def release(self) -> None:
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None


def acquire_slot(kind: str, cleanup: Callable[[int], None], usable: Callable[[int], bool]) -> SlotLock:
    """Take the first free slot of a kind: lock it, tear down its leftovers, check nobody else uses its net."""
    for slot in range(NUM_SLOTS):
        lock = SlotLock.try_acquire(kind, slot)
        if lock is None:
            continue
        try:
            cleanup(slot)
            if usable(slot):
                return lock
        except BaseException:
            lock.release()
            raise
        lock.release()
    raise HarnessError(f"podrun test harness: all {NUM_SLOTS} {kind} slots are in use "
                       f"(lock files {BASE}/{kind}-*.lock); end other test sessions")


def subnet_in_use(prefix: str) -> bool:
    """True when the root namespace already routes <prefix>.0/24 (someone else's bridge)."""
    cp = run(["ip", "-4", "route", "show", "match", f"{prefix}.1/32"], check=False)
    for line in cp.stdout.splitlines():
        if line.startswith(f"{prefix}.0/24") or line.startswith(f"{prefix}."):
            return True
    return False


# --------------------------------------------------------------------------- fabric

@dataclass
class Node:
    """One namespace host: its name, address, netns, root-side veth and anchor process."""
    name: str
    address: str
    netns: str
    veth: str
    anchor: subprocess.Popen | None = None


class Fabric:
    """A private bridge with n network namespaces on it, each with its own hostname and /etc/hosts.

    Every node has an *anchor* process (`sleep infinity`) that holds its UTS and mount namespaces
    (hostname, bind-mounted /etc/hosts and /etc/resolv.conf); `exec` enters net+uts+mount through
    it. Anchors are infrastructure: they are left out of pids()/processes() and survive crash().
    """

    def __init__(self, *, netns_prefix: str, veth_prefix: str, bridge: str, net: str,
                 names: Sequence[str], run_dir: Path, extra_hosts: Sequence[str] = (),
                 binds: Sequence[tuple[str, str]] = (), own_name_address: str | None = None,
                 net6: str | None = None):
        self.netns_prefix, self.veth_prefix, self.bridge, self.net = netns_prefix, veth_prefix, bridge, net
        self.run_dir = run_dir
        # net6 ("fd00:200:7::"): IPv6 only, <net6>1/64 on the bridge and <net6><i+1>/64 on node i; no IPv4 but loopback
        self.net6 = net6
        self.controller_address = f"{net6}1" if net6 else f"{net}.1"
        self.nodes: dict[str, Node] = {}
        for i, name in enumerate(names, start=1):
            addr = f"{net6}{i + 1}" if net6 else f"{net}.{i + 1}"
            self.nodes[name] = Node(name, addr, f"{netns_prefix}{name}", f"{veth_prefix}{i}")
        self.hosts_file = run_dir / "etc-hosts"
        self.resolv_file = run_dir / "resolv.conf"
        self._extra_hosts = list(extra_hosts)
        self._binds = list(binds)  # (source file, target file) bind-mounted inside every node
        # Debian's /etc/hosts: a node's own name maps to this address (127.0.1.1) in its own hosts file only
        self.own_name_address = own_name_address

    # -- naming helpers for stale cleanup
    @staticmethod
    def teardown_leftovers(netns_prefix: str, veth_prefix: str, bridge: str) -> None:
        """Remove every netns / veth / bridge with these names (a crashed session's leftovers)."""
        names = sorted(p.name for p in NETNS_DIR.glob(f"{netns_prefix}*")) if NETNS_DIR.is_dir() else []
        Fabric._delete_netns(names)
        veths = [n for n in os.listdir("/sys/class/net") if n.startswith(veth_prefix)]
        lines = [f"link del {v}" for v in veths]
        if os.path.exists(f"/sys/class/net/{bridge}"):
            lines.append(f"link del {bridge}")
        if lines:
            ip_batch(lines, check=False)

    @staticmethod
    def _delete_netns(names: Sequence[str]) -> None:
        if not names:
            return
        for _ in range(3):
            for ns in names:
                kill_pids(pids_in_netns(ns))
        deadline = time.monotonic() + 5
        while any(pids_in_netns(ns) for ns in names) and time.monotonic() < deadline:
            for ns in names:
                kill_pids(pids_in_netns(ns))
            time.sleep(0.02)
        for ns in names:
            # orphan TCP sockets pin a deleted netns (and its veth) for minutes: destroy them
            run(["nsenter", f"--net={NETNS_DIR / ns}", "ss", "-K", "-a", "-t"], check=False)
        ip_batch([f"netns del {ns}" for ns in names], check=False)

    # -- bring up
    def up(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback",
                 f"{self.controller_address} controller {socket.gethostname()}"]
        lines += [f"{n.address} {n.name}" for n in self.nodes.values()]
        lines += self._extra_hosts
        self.hosts_file.write_text("\n".join(lines) + "\n")
        if self.own_name_address is not None:
            for n in self.nodes.values():
                own = [f"{self.own_name_address} {n.name}"] + [x for x in lines if x != f"{n.address} {n.name}"]
                self._hosts_file(n).write_text("\n".join(own) + "\n")
        self.resolv_file.write_text("nameserver 127.0.0.1\n")  # no DNS query ever leaves the machine
        plen = "64 nodad" if self.net6 else "24"    # IPv6: no duplicate address detection, usable at once
        root = [f"link add {self.bridge} type bridge",
                f"addr add {self.controller_address}/{plen} dev {self.bridge}",
                f"link set {self.bridge} up"]
        root += [f"netns add {n.netns}" for n in self.nodes.values()]
        root += [f"link add {n.veth} type veth peer name eth0 netns {n.netns}" for n in self.nodes.values()]
        root += [f"link set {n.veth} master {self.bridge} up" for n in self.nodes.values()]
        ip_batch(root)
        procs = [subprocess.Popen(["ip", "-n", n.netns, "-batch", "-"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for n in self.nodes.values()]
        for n, p in zip(self.nodes.values(), procs):
            # IPv6 only: anything outside the test's own subnet is refused inside the node, of either family
            walls = "route add unreachable default\nroute add unreachable ::/0\n" if self.net6 else ""
            _, err = p.communicate(f"addr add {n.address}/{plen} dev eth0\nlink set eth0 up\nlink set lo up\n"
                                   + walls, timeout=30)
            if p.returncode != 0:
                raise HarnessError(f"podrun test harness: configuring {n.netns} failed: {err.strip()}")
        for n in self.nodes.values():
            self._start_anchor(n, wait=False)
        for n in self.nodes.values():
            self._wait_anchor(n)

    def _hosts_file(self, n: Node) -> Path:
        """The /etc/hosts a node sees: the shared one, or its own (``own_name_address``)."""
        return self.hosts_file if self.own_name_address is None else self.run_dir / f"etc-hosts-{n.name}"

    def _start_anchor(self, n: Node, wait: bool = True) -> None:
        binds = [(self._hosts_file(n), "/etc/hosts"), (self.resolv_file, "/etc/resolv.conf")] + self._binds
        script = (f"hostname {n.name} && "
                  + "".join(f"mount --bind {src} {dst} && " for src, dst in binds)
                  + "echo ready && exec sleep infinity")
        # propagation slave: the root namespace's unmounts (ip netns del of other sessions) reach us,
        # our bind mounts do not leak out
        n.anchor = subprocess.Popen(
            ["nsenter", f"--net={NETNS_DIR / n.netns}", "unshare", "--uts", "--mount",
             "--propagation", "slave", "sh", "-c", script],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        if wait:
            self._wait_anchor(n)

    def _wait_anchor(self, n: Node) -> None:
        line = n.anchor.stdout.readline()
        if line.strip() != "ready":
            err = n.anchor.stderr.read() if n.anchor.poll() is not None else ""
            raise HarnessError(f"podrun test harness: namespace anchor of {n.name} failed: {err.strip()}")
        n.anchor.stdout.close()
        n.anchor.stderr.close()

    def _anchor_alive(self, n: Node) -> bool:
        return n.anchor is not None and n.anchor.poll() is None

    def ensure_anchor(self, name: str) -> Node:
        n = self.node(name)
        if not self._anchor_alive(n):
            if n.anchor is not None:
                n.anchor.wait()
            self._start_anchor(n)
        return n

    # -- access
    def node(self, name: str) -> Node:
        try:
            return self.nodes[name]
        except KeyError:
            raise HarnessError(f"podrun test harness: no host {name!r}; hosts are {list(self.nodes)}") from None

    def enter_argv(self, name: str, cwd: str | None = None) -> list[str]:
        """argv prefix that runs a command inside the node's net+uts+mount namespaces."""
        n = self.ensure_anchor(name)
        return ["nsenter", "-t", str(n.anchor.pid), "--net", "--uts", "--mount",
                f"--wd={cwd or os.getcwd()}", "--"]

    def exec(self, name: str, argv: Sequence[str], **kw) -> subprocess.CompletedProcess:
        cwd = kw.pop("cwd", None)
        kw.setdefault("capture_output", not any(k in kw for k in ("stdout", "stderr")))
        kw.setdefault("text", True)
        kw.setdefault("timeout", 120)
        return subprocess.run(self.enter_argv(name, cwd) + list(argv), **kw)

    def popen(self, name: str, argv: Sequence[str], **kw) -> subprocess.Popen:
        cwd = kw.pop("cwd", None)
        return subprocess.Popen(self.enter_argv(name, cwd) + list(argv), **kw)

    def pids(self, name: str) -> list[int]:
        n = self.node(name)
        skip = {n.anchor.pid} if self._anchor_alive(n) else set()
        return [p for p in pids_in_netns(n.netns) if p not in skip]

    def processes(self, name: str, pattern: str = "") -> list[tuple[int, str]]:
        out = []
        for p in self.pids(name):
            cl = cmdline(p)
            if cl is not None and not is_zombie(p) and re.search(pattern, cl):
                out.append((p, cl))
        return out

    # -- faults
    def kill_all(self, name: str, sig: int = signal.SIGKILL) -> None:
        for _ in range(3):  # a fork racing the first sweep
            kill_pids(self.pids(name), sig)
        if sig == signal.SIGKILL:
            wait_for(lambda: not self.pids(name), 5, f"every process on {name} to die")

    def link(self, name: str, up: bool) -> None:
        run(["ip", "link", "set", self.node(name).veth, "up" if up else "down"])

    def partition(self, group_a: Sequence[str], group_b: Sequence[str], add: bool = True) -> None:
        op = "add" if add else "del"
        for a in group_a:
            for b in group_b:
                run(["ip", "-n", self.node(a).netns, "route", op, "blackhole", host_prefix(self.node(b).address)],
                    check=add)
                run(["ip", "-n", self.node(b).netns, "route", op, "blackhole", host_prefix(self.node(a).address)],
                    check=add)

    # -- teardown
    def close(self) -> None:
        for n in self.nodes.values():
            if n.anchor is not None and n.anchor.poll() is None:
                n.anchor.kill()
        self._delete_netns([n.netns for n in self.nodes.values() if netns_inode(n.netns)])
        for n in self.nodes.values():
            if n.anchor is not None:
                try:
                    n.anchor.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        lines = [f"link del {n.veth}" for n in self.nodes.values() if os.path.exists(f"/sys/class/net/{n.veth}")]
        if os.path.exists(f"/sys/class/net/{self.bridge}"):
            lines.append(f"link del {self.bridge}")
        if lines:
            ip_batch(lines, check=False)
        remove_open_mpi_leftovers()



def remove_open_mpi_leftovers(tmp: str = "/tmp") -> None:
    """Open MPI 5's session directories (``prted.<pid>``, ``ompi.<pid>``) that processes killed by a test left in
    ``tmp``: the namespace hosts share this machine's /tmp and pids, and a later prted or mpirun that gets a left
    directory's pid cannot start ("The PMIx server's listener thread failed to start"). Only this user's, and only
    those whose pid no process holds."""
    for entry in os.scandir(tmp):
        m = re.fullmatch(r"(?:prted|ompi)\.(\d+)", entry.name)
        if m is None or os.path.exists(f"/proc/{m.group(1)}"):
            continue
        try:
            if entry.is_dir(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_uid == os.geteuid():
                shutil.rmtree(entry.path, ignore_errors=True)
        except OSError:
            continue

class FabricAccess:
    """What NetnsHosts and SlurmCluster share: the life cycle (a slot taken, ``close()`` idempotent and a
    no-op in a forked child, a context manager), and per-node access and faults, all through
    ``self.fabric`` (a Fabric). Subclasses call ``_init_life()`` and ``_take_slot()`` and provide
    ``_teardown()``."""

    fabric: "Fabric | None"

    def _init_life(self) -> None:
        self._closed = False
        self._owner = os.getpid()  # a forked child must not tear down its parent's hosts at exit
        self._lock: SlotLock | None = None
        self.fabric = None
        self.up_seconds = self.down_seconds = None

    def _take_slot(self, kind: str, cleanup: Callable[[int], None], usable: Callable[[int], bool]) -> int:
        self._lock = acquire_slot(kind, cleanup, usable)
        atexit.register(self.close)
        return self._lock.slot

    def _teardown(self) -> None:
        raise NotImplementedError

    def _bring_up(self, steps: Callable[[], None], since: float):
        """Run ``steps`` (the daemons, files and checks of a start); on any failure tear down what they left
        and re-raise. ``up_seconds`` counts from ``since``."""
        try:
            steps()
        except BaseException:
            self.close()
            raise
        self.up_seconds = time.monotonic() - since
        return self

    def close(self) -> None:
        """Tear everything down (``_teardown``) and release the slot, once."""
        if self._closed or os.getpid() != self._owner:
            return
        self._closed = True
        t0 = time.monotonic()
        try:
            self._teardown()
        finally:
            if self._lock is not None:
                self._lock.release()
            atexit.unregister(self.close)
        self.down_seconds = time.monotonic() - t0

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def exec(self, node: str, argv: Sequence[str], **kw) -> subprocess.CompletedProcess:
        """Run argv inside node's net+uts+mount namespaces directly (not over ssh or Slurm); kw go to
        subprocess.run (defaults: capture_output=True, text=True, timeout=120, cwd = the caller's cwd)."""
        return self.fabric.exec(node, argv, **kw)

    def popen(self, node: str, argv: Sequence[str], **kw) -> subprocess.Popen:
        """Like exec, but starts argv in the background (subprocess.Popen)."""
        return self.fabric.popen(node, argv, **kw)

    def pids(self, node: str) -> list[int]:
        """Pids of every process in node's network namespace."""
        return self.fabric.pids(node)

    def processes(self, node: str, pattern: str = "") -> list[tuple[int, str]]:
        """(pid, cmdline) of processes on node whose cmdline matches the regex pattern (orphan checks)."""
        return self.fabric.processes(node, pattern)

    def crash(self, node: str) -> None:
        """kill -9 everything on node: peers get RST at once."""
        self.fabric.kill_all(node)

    def poweroff(self, node: str) -> None:
        """Link down, then kill -9 everything: peers see silence, not RST."""
        self.fabric.link(node, False)
        self.fabric.kill_all(node)

    def isolate(self, node: str) -> None:
        """Link down: processes keep running, packets are silently dropped."""
        self.fabric.link(node, False)

    def heal(self, node: str) -> None:
        self.fabric.link(node, True)

    @property
    def addresses(self) -> dict[str, str]:
        """node name -> IPv4 address."""
        return {name: n.address for name, n in self.fabric.nodes.items()}

    def address(self, node: str) -> str:
        return self.fabric.node(node).address

    @property
    def controller_address(self) -> str:
        """The bridge address in the root namespace: reachable from every node (MASTER_ADDR candidate)."""
        return self.fabric.controller_address
