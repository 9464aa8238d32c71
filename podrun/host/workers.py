"""An instance's workers on its agent: what they inherit, a failed one's @record error, its fresh error file."""
from __future__ import annotations

import json
import os

from podrun import safefs
from podrun.errors import PodrunError

ERROR_TRACEBACK_LINES = 40   # of a worker's @record traceback, sent to the controller
ERROR_MESSAGE_CHARS = 2000


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
