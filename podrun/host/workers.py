"""An instance's workers on its agent: their environment here, what they inherit, a failed one's @record error."""
from __future__ import annotations

import json
import os

from podrun import safefs
from podrun.errors import PodrunError

ERROR_TRACEBACK_LINES = 40   # of a worker's @record traceback, sent to the controller
ERROR_MESSAGE_CHARS = 2000


def worker_envs(plan, index: int, *, run_id: str, run_dir: str, plan_path: str, master_addr: str,
                master_port: int, restart_count: int = 0, max_restarts: int = 0,
                agent_store: bool = False) -> list[dict[str, str]]:
    """The env contract of instance ``index``'s workers on this host (podrun.wire.worker_env.instance_envs),
    with this host's environment, the cores this agent may use and, in a run over several hosts, gloo's
    interface where this host's name resolves to loopback (podrun.wire.probe.gloo_interface)."""
    from podrun.wire.probe import gloo_interface
    from podrun.wire.worker_env import instance_envs

    several = len({p.host for p in plan.placement}) > 1
    return instance_envs(plan, index, run_id=run_id, run_dir=run_dir, plan_path=plan_path,
                         master_addr=master_addr, master_port=master_port, restart_count=restart_count,
                         max_restarts=max_restarts, agent_store=agent_store, host_env=os.environ,
                         cpus=len(os.sched_getaffinity(0)),
                         gloo_ifname=gloo_interface(master_addr) if several else None)


def read_error_file(path: str) -> dict | None:
    """What torch's ``@record`` wrote to TORCHELASTIC_ERROR_FILE: {message, traceback, file}, or None.

    The file is JSON, ``{"message": {"message": "Type: text", "extraInfo": {"py_callstack": ...}}}``
    (or ``{"message": "text"}``); the traceback is cut to its last ERROR_TRACEBACK_LINES lines.
    """
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    msg = data.get("message") if isinstance(data, dict) else None
    tb = ""
    if isinstance(msg, dict):
        extra = msg.get("extraInfo") if isinstance(msg.get("extraInfo"), dict) else {}
        tb = str(extra.get("py_callstack") or "")
        msg = msg.get("message")
    if msg is None:
        return None
    lines = tb.rstrip("\n").splitlines()[-ERROR_TRACEBACK_LINES:]
    return {"message": str(msg)[:ERROR_MESSAGE_CHARS], "traceback": [l[:ERROR_MESSAGE_CHARS] for l in lines],
            "file": path}


def launcher_fds(environ) -> tuple[int, ...]:
    """File descriptors the worker needs to join its launcher's world: MPICH's hydra hands each rank its
    PMI connection as PMI_FD (Open MPI's PMIx needs only variables)."""
    fd = environ.get("PMI_FD", "")
    if not fd.isdigit():
        return ()
    try:
        os.fstat(int(fd))
    except OSError:
        return ()
    return (int(fd),)


def fresh_error_file(path: str | None) -> None:
    """Make the error file's directory and remove a file a previous attempt left there."""
    if not path:
        return
    try:
        safefs.make_dirs(os.path.dirname(path), "error file directory")   # private, as the run dir
        os.unlink(path)
    except (OSError, PodrunError):
        pass
