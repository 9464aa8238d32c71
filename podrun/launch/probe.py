"""Preflight facts of a host (podrun and python versions, busy ports): what a held agent reports first."""
from __future__ import annotations

import platform
import socket


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


def facts(ports=(), busy=None) -> dict:
    """podrun and python versions, the hostname, the run's ports on this host and the busy ones among them
    (``busy``: as the caller found them binding the ports it holds; else each port is tried here)."""
    import podrun

    ports = list(ports)
    return {"podrun": podrun.__version__, "python": platform.python_version(), "hostname": socket.gethostname(),
            "ports": ports, "ports_busy": list(busy) if busy is not None else [p for p in ports if not port_free(p)]}
