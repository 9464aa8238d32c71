"""Namespace hosts shaped like separate machines on one: links capped by `tc` (a token bucket on each host's eth0),
cores of their own (each host's sshd, and so all it starts, bound to a share of this machine's cores)."""
from __future__ import annotations

import os
from typing import Sequence

DEVICE = "eth0"          # each namespace host's end of its veth (tests/harness/netns.py)


def shape(hosts, names: Sequence[str] | None = None, *, rate_mbit: float = 1000.0, burst_kb: int = 256,
          queue_ms: int = 100) -> None:
    """Cap what each host sends at ``rate_mbit`` Mbit/s (tbf on its eth0: every byte a host sends passes it, so
    every host-to-host path runs at that rate). ``hosts``: a NetnsHosts; ``names``: default all of them.
    The kernel here has no netem, so no delay is added: the latency is the bridge's, plus the bucket's queue."""
    for name in names if names is not None else hosts.hosts:
        r = hosts.exec(name, ["tc", "qdisc", "replace", "dev", DEVICE, "root", "tbf", "rate", f"{rate_mbit:g}mbit",
                              "burst", f"{burst_kb}kb", "latency", f"{queue_ms}ms"])
        if r.returncode != 0:
            raise RuntimeError(f"tc on {name} failed: {r.stderr.strip()} (needs iproute2's tc and sch_tbf)")


def unshape(hosts, names: Sequence[str] | None = None) -> None:
    """Take the shaping off again (the link back to the bridge's speed)."""
    for name in names if names is not None else hosts.hosts:
        hosts.exec(name, ["tc", "qdisc", "del", "dev", DEVICE, "root"])


def shaped_rate_mbit(hosts, name: str) -> float | None:
    """The rate the host's eth0 is shaped at (None: not shaped), read back from `tc qdisc show`."""
    out = hosts.exec(name, ["tc", "qdisc", "show", "dev", DEVICE]).stdout
    words = out.split()
    if "tbf" not in words or "rate" not in words:
        return None
    text = words[words.index("rate") + 1]
    for unit, f in (("Gbit", 1000.0), ("Mbit", 1.0), ("Kbit", 0.001), ("bit", 1e-6)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * f
    return float(text) * 1e-6



def give_cores(hosts, names: Sequence[str] | None = None) -> dict[str, set[int]]:
    """Bind each host's sshd to cores of its own, dealt round-robin from the cores this process may use (one each
    while there are enough; two hosts on one core when there are twice as many hosts): every session, agent and
    worker the host starts inherits the binding, and podrun's agent gives its workers OMP_NUM_THREADS from it, as
    on a machine of that many cores. Connections open before the call keep the old binding. Returns the binding."""
    cores = sorted(os.sched_getaffinity(0))
    names = list(names if names is not None else hosts.hosts)
    share = max(1, len(cores) // len(names))
    out = {}
    for i, name in enumerate(names):
        mine = {cores[(i * share + k) % len(cores)] for k in range(share)}
        pid = hosts.sshd_pid(name)
        if pid is None:
            raise RuntimeError(f"host {name} has no sshd to bind to cores")
        os.sched_setaffinity(pid, mine)
        out[name] = mine
    return out

