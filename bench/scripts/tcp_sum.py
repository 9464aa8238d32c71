"""The sum of every rank's value over TCP, without torch: rank 0 listens on port, every other rank sends its value
and reads back the sum (scale_worker.py and socket_allreduce.py, run as scripts beside this file)."""
import socket
import time


def tcp_sum(rank: int, world: int, addr: str, port: int, value: int, *, backlog: int | None = None,
            connect_for: float = 30, connect_timeout: float = 5, retry: float = 0.01,
            retry_max: float | None = None) -> int:
    """Rank 0 serves (backlog: socket's default when None); the others retry a refused connect every retry s
    for up to connect_for s; with ``retry_max`` the wait doubles after each refusal up to that many seconds (a
    backoff, as torch's store client has, so that ranks waiting for rank 0 leave the CPU to those starting)."""
    if rank == 0:
        srv = socket.create_server(("", port), **({} if backlog is None else {"backlog": backlog}))
        conns = [srv.accept()[0] for _ in range(world - 1)]
        total = value + sum(int(c.makefile().readline()) for c in conns)
        for c in conns:
            c.sendall(f"{total}\n".encode())
        return total
    deadline = time.monotonic() + connect_for
    while True:
        try:
            s = socket.create_connection((addr, port), timeout=connect_timeout)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(retry)
            retry = retry if retry_max is None else min(2 * retry, retry_max)
    s.sendall(f"{value}\n".encode())
    return int(s.makefile().readline())
