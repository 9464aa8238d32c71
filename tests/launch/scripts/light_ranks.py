"""A light worker (no torch) for runs of many ranks: `light_ranks.py MODE DIR [ODD]`.

hang: rank ODD stalls in stall(), every other rank waits in wait_for_peer(); wait: every rank waits in
wait_for_peer() until the FIFO DIR/release (the test makes it) is opened for writing, blocked in one call so that
every rank's stack is the same whenever it is taken; fail: once every rank is up, rank ODD says three lines and exits 3, and
every other rank, once rank ODD's process has ended (its pid in DIR/pid), says its peer is gone
and exits 1 half a second later (as ranks do when the socket of a peer of their collective closes); progress: STEPS reports through podrun.runtime (ODD is the number of steps)."""
import os
import sys
import time

mode, where = sys.argv[1], sys.argv[2]
odd = int(sys.argv[3]) if len(sys.argv) > 3 else -1
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
print(f"up rank {rank}", flush=True)


def stall():
    time.sleep(3600)  # STALL-odd


def wait_for_peer(until=None):
    if until is None:
        time.sleep(3600)  # STALL-others
    else:
        with open(until, "rb"):  # returns once a writer opens the FIFO
            pass


if mode == "hang":
    if rank == odd:
        stall()
    wait_for_peer()
elif mode == "wait":
    wait_for_peer(os.path.join(where, "release"))
elif mode == "fail":
    if rank == odd:
        with open(os.path.join(where, "pid.tmp"), "w") as f:
            f.write(str(os.getpid()))
        os.rename(os.path.join(where, "pid.tmp"), os.path.join(where, "pid"))
    open(os.path.join(where, f"up-{rank}"), "w").close()
    if rank == odd:
        while len([n for n in os.listdir(where) if n.startswith("up-")]) < world:
            time.sleep(0.05)
        for i in range(3):
            print(f"rank {rank} own failure line {i}", file=sys.stderr, flush=True)
        sys.exit(3)
    while not os.path.exists(os.path.join(where, "pid")):
        time.sleep(0.05)
    with open(os.path.join(where, "pid")) as f:
        pid = f.read()
    while True:                                  # as a peer's socket closes: once rank ODD's process has ended
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in "ZX":
                    break
        except OSError:
            break
        time.sleep(0.05)
    print(f"rank {rank}: peer {odd} is gone", file=sys.stderr, flush=True)
    time.sleep(0.5)                              # its error handling and teardown (a torch rank's take longer)
    sys.exit(1)
elif mode == "progress":
    from podrun import runtime

    for step in range(1, odd + 1):
        time.sleep(0.3)
        runtime.report(step=step, total=odd, loss=1.0 / step, samples_per_sec=100.0, step_seconds=0.3)
    print(f"done rank {rank}", flush=True)

