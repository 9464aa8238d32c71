"""Free TCP ports for tests, taken below the kernel's ephemeral range so no outgoing connection can hold them."""
from __future__ import annotations

import random

from tests.harness.common import port_free


def ephemeral_low() -> int:
    """The first port of net.ipv4.ip_local_port_range (Linux's default when it cannot be read)."""
    try:
        return int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(n: int = 1) -> int:
    """A port P with P .. P+n-1 all free to listen on (a test that runs two launches side by side, or a
    restart that moves to the next port, takes more than one).

    Chosen below the ephemeral range: there no client socket is given the port as its source, and a
    connect to it before its server listens cannot be joined to itself (see podrun.wire.probe.pick_free_port).
    """
    top = min(ephemeral_low(), 29400) - n     # above it the tests' fixed ports (29500-29900)
    for _ in range(200):
        p = random.randrange(20000, top)
        if all(port_free(q) for q in range(p, p + n)):
            return p
    raise AssertionError(f"no {n} consecutive free ports between 20000 and {top}")
