"""A worker that prints its last line and then hangs at exit: its atexit handler waits on a lock never released
(rank 1 only; the others end at once). With --fail-first GLOB the first attempt instead waits until a file matches
GLOB (the zygote's socket) and exits 1, so that the hang is in the restart, whose workers the zygote forks."""
import atexit
import glob
import os
import sys
import threading
import time

LOCK = threading.Lock()


def wait_for_the_lock() -> None:
    LOCK.acquire()


if len(sys.argv) > 2 and sys.argv[1] == "--fail-first" and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
    while not glob.glob(sys.argv[2]):
        time.sleep(0.1)
    sys.exit(1)
if os.environ.get("RANK") == "1":
    LOCK.acquire()
    atexit.register(wait_for_the_lock)
print(f"rank {os.environ.get('RANK')}: last line", flush=True)
