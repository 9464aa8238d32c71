"""Preflight probe run on each host (`python -m podrun.launch.probe`): prints one JSON line of facts."""
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


def facts(port: int | None = None) -> dict:
    import podrun

    return {"podrun": podrun.__version__, "python": platform.python_version(), "hostname": socket.gethostname(),
            "port": port, "port_free": None if port is None else port_free(port)}


if __name__ == "__main__":
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1]) if "--port" in args else None
    print("@podrun-probe " + json.dumps(facts(port)), flush=True)
