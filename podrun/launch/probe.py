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


def facts(ports=()) -> dict:
    """podrun and python versions, the hostname, and for each port whether it is free (the busy ones)."""
    import podrun

    return {"podrun": podrun.__version__, "python": platform.python_version(), "hostname": socket.gethostname(),
            "ports": list(ports), "ports_busy": [p for p in ports if not port_free(p)]}

