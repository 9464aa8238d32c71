"""A minimal all_reduce over TCP, without torch: rank 0 listens on MASTER_PORT, every other rank sends its
value and reads back the sum. It measures a launcher's own path to a first collective (start, env,
rendezvous address) with no framework import in the way; it retries a refused connect every 10 ms."""
import os

from tcp_sum import tcp_sum

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
total = tcp_sum(rank, world, addr, port, rank + 1)
print(f"ALLREDUCE rank={rank} world={world} sum={total}", flush=True)
