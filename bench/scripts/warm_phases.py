"""bench/scripts/elastic_train.py with the worker's start phases logged first, for bench/bench_warm.py.

Appends one JSON line per process to ``<dir>/phases.log``: rank, pid, the restart count, whether a
zygote forked it (PODRUN_WARM), ``created`` (the kernel's start time of the process, from /proc: before
the interpreter starts, for a cold start), ``first_line`` (this file's first line) and ``torch`` (torch
and torch.distributed imported); then runs elastic_train.py as ``__main__`` with the same arguments,
which logs init_done, ready and each step in steps.log.
"""
import time

FIRST_LINE = time.time()

import json  # noqa: E402
import os  # noqa: E402
import runpy  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402,F401
import torch.distributed  # noqa: E402,F401

TORCH = time.time()


def created() -> float:
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as f:
        btime = next(int(l.split()[1]) for l in f if l.startswith("btime"))
    return btime + ticks / os.sysconf("SC_CLK_TCK")


d = sys.argv[sys.argv.index("--dir") + 1]
record = {"rank": int(os.environ.get("RANK", "0")), "pid": os.getpid(),
          "restart": int(os.environ.get("PODRUN_RESTART_COUNT", "0")), "warm": "PODRUN_WARM" in os.environ,
          "created": created(), "first_line": FIRST_LINE, "torch": TORCH}
fd = os.open(os.path.join(d, "phases.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, (json.dumps(record) + "\n").encode())
os.close(fd)
script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "elastic_train.py")
sys.argv[0] = script
runpy.run_path(script, run_name="__main__")
