"""Workers' stacks on their agent: the dump signal, podrun's sitecustomize, reading what each process wrote."""
from __future__ import annotations

import os
import signal
import time

from podrun.wire.proctl import pid_alive

STACK_SIGNAL = int(signal.SIGRTMIN) + 4   # faulthandler's dump signal in workers (podrun/runtime/site)
SITE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runtime", "site")
STACK_WAIT_S = 2.0         # how long one process may take to write its stacks
STACK_TEXT = 48 * 1024     # characters of one process's dump relayed (a stack line stays under READ_LIMIT)
STACK_PROCS = 4            # Python processes of one worker whose stacks are relayed (the worker's own first)


def worker_stacks(where: str, worker_pid: int) -> dict:
    """Signal each Python process of a worker registered in ``where`` (its directory under the agent's stack
    root, PODRUN_STACK_DIR) and read what faulthandler wrote:
    {"procs": [{"pid", "main", "text"}], "problem": why there is none}."""
    try:
        pids = sorted(int(n[:-5]) for n in os.listdir(where) if n.endswith(".main") and n[:-5].isdigit())
    except OSError:
        pids = []
    pids = [p for p in pids if pid_alive(p)]
    pids.sort(key=lambda p: (p != worker_pid, p))
    if not pids:
        return {"procs": [], "problem": "no Python process of this worker registered for stacks (not Python, "
                                        "or started with -I/-S so podrun's sitecustomize did not run)"}
    sent = []
    for pid in pids[:STACK_PROCS]:
        txt = os.path.join(where, f"{pid}.txt")
        try:
            os.truncate(txt, 0)
            os.kill(pid, STACK_SIGNAL)
        except OSError:
            continue
        sent.append((pid, txt))
    procs = []
    for pid, txt in sent:
        text = _settled(txt, STACK_WAIT_S)
        try:
            with open(os.path.join(where, f"{pid}.main"), encoding="utf-8") as f:
                main = f.read().strip()
        except OSError:
            main = ""
        procs.append({"pid": pid, "main": main, "text": text[-STACK_TEXT:]})
    return {"procs": procs, "problem": None if any(p["text"] for p in procs) else
            f"no stack written within {STACK_WAIT_S:g} s"}


def _settled(path: str, timeout: float) -> str:
    """The text of ``path`` once something was written to it and it stopped growing (or at ``timeout``)."""
    deadline = time.monotonic() + timeout
    last, still = -1, 0
    while time.monotonic() < deadline:
        try:
            size = os.path.getsize(path)
        except OSError:
            size = 0
        if size > 0 and size == last:
            still += 1
            if still >= 3:
                break
        else:
            still = 0
        last = size
        time.sleep(0.03)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""
