"""Preflight facts of a host (podrun and python versions, busy ports): what a held agent reports first."""
from __future__ import annotations

import os
import platform
import random
import socket

PICK_FROM = 10000          # the lowest port pick_free_port tries


def port_free(port: int) -> bool:
    """True when a TCP listener could bind ``port`` on every address (what torch's store will do)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def ephemeral_low() -> int:
    """The first port of net.ipv4.ip_local_port_range (Linux's default when it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def pick_free_port() -> int:
    """A port free now, below the ephemeral range: one that nothing will hold, so the program that binds it
    later (with a window in between) cannot lose it to a client socket's source port."""
    top = ephemeral_low()
    for _ in range(200):
        port = random.randrange(PICK_FROM, top)
        if port_free(port):
            return port
    raise OSError(f"no free port found between {PICK_FROM} and {top}")


def missing_modules(python: str, modules) -> list[str]:
    """The ``modules`` that ``python`` cannot import, found without importing them (importlib.util.find_spec);
    all of them when ``python`` cannot be run."""
    import subprocess
    import sys

    modules = list(modules)
    if os.path.abspath(python) == os.path.abspath(sys.executable):   # not realpath: venvs link one interpreter
        import importlib.util

        return [m for m in modules if importlib.util.find_spec(m) is None]
    code = ("import importlib.util,sys; print(' '.join(m for m in sys.argv[1:] "
            "if importlib.util.find_spec(m) is None))")
    try:
        cp = subprocess.run([python, "-c", code, *modules], stdin=subprocess.DEVNULL, capture_output=True,
                            text=True, timeout=60, env={**os.environ, "PYTHONSAFEPATH": "1"})
    except (OSError, subprocess.TimeoutExpired):
        return modules
    if cp.returncode != 0:
        return modules
    return cp.stdout.split()


def facts(ports=(), busy=None, needs=()) -> dict:
    """podrun and python versions, the hostname, the run's ports on this host and the busy ones among them
    (``busy``: as the caller found them binding the ports it holds; else each port is tried here), and the
    modules among ``needs`` that this python cannot import."""
    import sys

    import podrun

    ports = list(ports)
    return {"podrun": podrun.__version__, "python": platform.python_version(), "hostname": socket.gethostname(),
            "ports": ports, "ports_busy": list(busy) if busy is not None else [p for p in ports if not port_free(p)],
            "missing": missing_modules(sys.executable, needs) if needs else []}


def missing_text(python: str, missing, what: str) -> tuple[str, str]:
    """(problem, hint) for a --python that cannot import ``missing``, which ``what`` needs on every worker."""
    return (f"{python} cannot import {', '.join(missing)}, which {what} needs on every worker",
            f"install podrun's training extra for that python: {python} -m pip install 'podrun[train]' "
            "(from a checkout: pip install -e '.[train]'), or give --python a python that has it")
