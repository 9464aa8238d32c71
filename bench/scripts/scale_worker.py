"""A light worker for the scale benchmark (no torch): writes DIR/up-<rank> (its wall clock) and DIR/cpu-<rank> (its
CPU seconds so far) as it starts, does one all_reduce over TCP (rank 0 serves MASTER_PORT + 1; the others send
rank + 1 and read back the sum; a refused connect is retried after 20 ms, the wait doubling up to 0.25 s, as torch's
store client backs off), writes DIR/coll-<rank>, then sleeps until a signal ends it. Usage:
scale_worker.py DIR MARKER (MARKER names the run's processes on the hosts). The rank and world size come from
RANK/WORLD_SIZE, or Open MPI's or Slurm's names."""
import os
import sys
import time

from tcp_sum import tcp_sum


def _env(*names):
    for n in names:
        if n in os.environ:
            return int(os.environ[n])
    raise SystemExit(f"scale_worker: none of {names} is set")


def _stamp(path, value=None):
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(repr(time.time() if value is None else value))
    os.rename(tmp, path)


def main():
    out = sys.argv[1]
    rank = _env("RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
    world = _env("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS")
    _stamp(os.path.join(out, f"up-{rank}"))
    t = os.times()
    _stamp(os.path.join(out, f"cpu-{rank}"), t.user + t.system)     # its own start's CPU, before any wait
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]) + 1
    # a launch that takes minutes on a loaded machine still counts
    total = tcp_sum(rank, world, addr, port, rank + 1, backlog=max(world, 16), connect_for=300, connect_timeout=30,
                    retry=0.02, retry_max=0.25)
    if total != world * (world + 1) // 2:
        raise SystemExit(f"scale_worker: rank {rank}: sum {total}, expected {world * (world + 1) // 2}")
    _stamp(os.path.join(out, f"coll-{rank}"))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
