"""A minimal all_reduce over TCP, without torch: rank 0 listens on MASTER_PORT, every other rank sends its
value and reads back the sum. It measures a launcher's own path to a first collective (start, env,
rendezvous address) with no framework import in the way; it retries a refused connect every 10 ms."""
import os
import socket
import time

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
value = rank + 1
if rank == 0:
    srv = socket.create_server(("", port))
    conns = [srv.accept()[0] for _ in range(world - 1)]
    total = value + sum(int(c.makefile().readline()) for c in conns)
    for c in conns:
        c.sendall(f"{total}\n".encode())
else:
    deadline = time.monotonic() + 30
    while True:
        try:
            s = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    s.sendall(f"{value}\n".encode())
    total = int(s.makefile().readline())
print(f"ALLREDUCE rank={rank} world={world} sum={total}", flush=True)
