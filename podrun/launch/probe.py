"""Preflight facts of a host (podrun and python versions, busy ports): what a held agent reports first;
`python -m podrun.launch.probe [--port N ...]` prints them as one JSON line."""
from __future__ import annotations

import json
import platform
import socket
import sys


def port_free(port: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def facts(ports: list[int] = ()) -> dict:
    """podrun and python versions, the hostname, and for each port whether it is free (the busy ones)."""
    import podrun

    return {"podrun": podrun.__version__, "python": platform.python_version(), "hostname": socket.gethostname(),
            "ports": list(ports), "ports_busy": [p for p in ports if not port_free(p)]}


if __name__ == "__main__":
    args = sys.argv[1:]
    ports = [int(args[i + 1]) for i, a in enumerate(args) if a == "--port"]
    print("@podrun-probe " + json.dumps(facts(ports)), flush=True)
