"""The controller's CPU per agent that joins (issue 41): 64 real hand-shakes over loopback against one JoinServer,
three times; `PYTHONPATH=. python3 bench/scripts/join_cpu.py`."""
from __future__ import annotations

import os
import statistics
import threading
import time

from podrun.launch.transports.join import JoinServer
from podrun.wire import join

AGENTS = 64


def one_round(key: str) -> float:
    """The server's CPU (ms) per join: the hand-shake on its thread and the connection handed to the line hub."""
    srv = JoinServer("r", key, {i: f"h{i}" for i in range(AGENTS)}, advertise="127.0.0.1", window=60)
    conns = []
    threads = [threading.Thread(target=lambda i=i: conns.append(join.join(srv.address, key, "r", i, 10)[0]))
               for i in range(AGENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    deadline = time.monotonic() + 10
    while srv.joined < AGENTS and time.monotonic() < deadline:
        time.sleep(0.01)
    assert srv.joined == AGENTS, srv.joined
    for c in conns:
        c.close()
    srv.close()
    return 1000 * srv.serial_cpu_s / AGENTS


def main() -> None:
    key = join.new_key()
    res = [one_round(key) for _ in range(3)]
    print(f"the controller's CPU per join ({AGENTS} agents, 3 rounds): {[round(x, 3) for x in res]} ms, median "
          f"{statistics.median(res):.3f} ms; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
