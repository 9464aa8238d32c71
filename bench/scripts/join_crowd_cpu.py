"""The join listener's CPU under a crowd of slow partial lines (issue 51): a JoinServer in a process of its own,
1,500 connections that each send a part of a join line and then one byte a second for 10 s; the server process's
CPU seconds over that time. `PYTHONPATH=. python3 bench/scripts/join_crowd_cpu.py`."""
from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time

CONNECTIONS, SECONDS = 1500, 10
SERVER = """
import resource, sys
from podrun.launch.transports.join import JoinServer
s = JoinServer("r", "k" * 32, {0: "h0"}, advertise="127.0.0.1", window=600)
print(s.port, flush=True)
sys.stdin.readline()
u = resource.getrusage(resource.RUSAGE_SELF)
print(round(u.ru_utime + u.ru_stime, 2), flush=True)
"""


def main() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (8192, 8192))
    srv = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
    port = int(srv.stdout.readline())
    conns = []
    for _ in range(CONNECTIONS):
        c = socket.create_connection(("127.0.0.1", port))
        c.sendall(b"@podrun-join join r 0 ")
        conns.append(c)
    end = time.monotonic() + SECONDS
    while time.monotonic() < end:
        for c in conns:
            try:
                c.send(b"x")
            except OSError:
                pass
        time.sleep(1)
    srv.stdin.write("\n")
    srv.stdin.flush()
    print(f"the join listener's CPU over {SECONDS} s of {CONNECTIONS} slow partial lines: "
          f"{srv.stdout.readline().strip()} s; load average {os.getloadavg()[0]:.1f}")
    srv.wait(10)
    for c in conns:
        c.close()


if __name__ == "__main__":
    main()
