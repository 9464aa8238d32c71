"""The controller's own process limits against a run's size: open files (RLIMIT_NOFILE) and processes (RLIMIT_NPROC),
raised to the hard limit when the soft one is too low, else a LaunchError naming the limit and the `ulimit` to raise."""
from __future__ import annotations

import os
import resource

from podrun.errors import LaunchError
from podrun.wire.worker_env import workers_per_instance

FDS_BASE = 24              # the controller's own (about 10: Python, the run directory's files, the control socket)
FDS_PER_HOST = 6           # an agent on another host: its ssh client's pipes (or paramiko's socket), its log (about 4.2
                           # measured: 4 hosts over OpenSSH need 25 to 28 open files, 16 hosts 70 to 80)
FDS_PER_WORKER = 4         # a worker on this machine: its agent's ends of its output sockets and progress pipe (3)
PROCS_PER_HOST = 4         # an agent on another host: its OpenSSH client (or paramiko's transport and reader threads)
PROCS_PER_WORKER = 3       # a worker on this machine: it, and its agent's reader threads


def needs(remote_hosts: int, local_workers: int) -> tuple[int, int]:
    """(open files, processes and threads) a run of ``remote_hosts`` agents elsewhere and ``local_workers`` workers on
    this machine takes from the controller's limits, with room to spare."""
    return (FDS_BASE + FDS_PER_HOST * remote_hosts + FDS_PER_WORKER * local_workers,
            PROCS_PER_HOST * remote_hosts + PROCS_PER_WORKER * local_workers)


def _user_tasks(uid: int) -> int:
    """Processes and threads of ``uid`` on this machine now (what RLIMIT_NPROC counts)."""
    n = 0
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/status", encoding="ascii", errors="replace") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                n += int(fields["Threads"])
        except (OSError, KeyError, ValueError):
            continue
    return n


def _shown(v: int) -> str:
    return "unlimited" if v == resource.RLIM_INFINITY else str(v)


def _ensure(which: int, name: str, option: str, want: int, unit: str, why: str, notice) -> None:
    """Raise the soft limit ``which`` to at least ``want`` (up to its hard limit), or refuse the run."""
    soft, hard = resource.getrlimit(which)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return
    if hard == resource.RLIM_INFINITY or hard >= want:
        resource.setrlimit(which, (want if hard == resource.RLIM_INFINITY else hard, hard))
        notice(f"raised {name} from {soft} to {_shown(resource.getrlimit(which)[0])}: the run needs about {want} "
               f"{unit} ({why})")
        return
    raise LaunchError(
        f"this run needs about {want} {unit} in each of podrun's processes on this machine ({why}), "
        f"more than this shell allows: {name} is {soft} (hard limit {hard}), so podrun would fail to start "
        f"agents or workers part way",
        hint=f"raise the limit in the shell that runs podrun (`{option} {want}`); above the hard limit ask the "
             "administrator (/etc/security/limits.conf), or run fewer hosts or workers per host")


def ensure(remote_hosts: int, local_workers: int, notice=lambda text: None) -> None:
    """Before anything starts: the controller's RLIMIT_NOFILE (and, for a user other than root, whom the kernel
    does not hold to it, RLIMIT_NPROC) fits the run, raised to the hard limit if need be; a LaunchError (exit 2)
    names the limit and the `ulimit` to raise when even the hard limit is too low."""
    fds, procs = needs(remote_hosts, local_workers)
    terms = [f"{n} {what} x {per}" for n, what, per in ((remote_hosts, "host(s)", FDS_PER_HOST),
                                                          (local_workers, "worker(s) here", FDS_PER_WORKER)) if n > 0]
    where = " + ".join([*terms, str(FDS_BASE)])
    _ensure(resource.RLIMIT_NOFILE, "RLIMIT_NOFILE", "ulimit -n", fds, "open files", where, notice)
    if os.geteuid() != 0 and procs > 0:
        have = _user_tasks(os.getuid())
        _ensure(resource.RLIMIT_NPROC, "RLIMIT_NPROC", "ulimit -u", have + procs, "processes and threads",
                f"the {have} this user runs now + {remote_hosts} host(s) x {PROCS_PER_HOST} + {local_workers} "
                f"worker(s) here x {PROCS_PER_WORKER}", notice)


def run_size(request) -> tuple[int, int]:
    """(agents on other hosts the controller keeps a connection to, workers on this machine) of a LaunchRequest:
    over ssh one connection per instance; on this machine (local) every worker; mpirun and srun are one launcher
    process, which reaches the hosts itself."""
    n, kind = len(request.instances), request.kind
    if not kind.remote:
        return 0, n * workers_per_instance(request.plan)
    return (n, 0) if kind.ssh_per_host else (1, 0)
