"""Every Python process podrun starts for itself (its helpers): their command lines, and their start here.

A helper (an agent, a host's zygote, rank 0's store host, a probe, calibrate's worker, the bench's subjects) imports
only from directories podrun chose, never from the directory it happens to run in: ``python -m M`` and
``python -c CODE`` put the working directory first on ``sys.path``, where a shared (1777) scratch or project
directory may hold another user's ``podrun/__init__.py`` or ``torch.py``. Every command line here is one of two:

- ``isolated`` (``python -I -S -c BOOT``): the lean agent. It needs nothing from its environment's Python settings
  (no PYTHONPATH, no user or system site, no .pth file run), only podrun from ``root`` (the directory that holds
  podrun/), which the boot puts first; where that podrun is not there (a host without this file system) or is
  another version, the process becomes the safe-path agent (exec: the same process, the same arguments).
- ``safe`` (``python -c BOOT``): every other helper. It keeps site-packages, the user's site and PYTHONPATH (the
  zygote forks the user's workers, which must see them; the store host and the probes import torch or ask about the
  host's own modules) and drops only the working directory, which ``-c`` puts first as '' (``-P``, which does the
  same, is Python 3.11's and podrun runs on 3.10). With ``root`` the boot then puts podrun's own location first (a
  helper started on this host by this podrun: the zygote and the store host import the podrun their agent runs);
  without it (a probe or a worker on another host, an agent for another python) the host's own podrun is found as
  that python finds it, but never in the working directory.

The boot is one line (a remote shell line quotes it plainly; csh takes no newline in quotes) before code of more
lines, and names the module it runs, so that a process list shows which helper a process is. The user's own script or module is not a helper: it runs as under torchrun
(``python script.py``: its own directory first; ``python -m M``: the working directory first), built here too
(``target``) so that this module is the one home of every Python command line podrun writes. ``popen``, ``run``
and ``execv`` start only a command line built here (tests/security/test_python_starts.py reads podrun/'s and
bench/'s source for any other start of a Python process).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))     # the directory that holds this podrun/
AGENT_MODULE = "podrun.host.agent"
# the safe boot's first words: -c puts '' (the working directory) first on sys.path, -P or PYTHONSAFEPATH nothing
_DROP_CWD = "import os, sys; sys.path[:1] == [\"\"] and sys.path.pop(0)"
_LEAN = "import os, sys; sys.dont_write_bytecode = "    # the lean boot's first words


def _root_first(root: str | None) -> str:
    if root is None:
        return ""
    return (f"; r = {json.dumps(root)}; os.path.isfile(os.path.join(r, \"podrun\", \"__init__.py\")) and "
            f"sys.path.insert(0, r)")


def safe_code(code: str, *, root: str | None = ROOT) -> str:
    """The ``-c`` text of a safe helper that runs ``code`` (its ``sys.argv`` is ``["-c", ARGS...]``, as under
    ``python -c``): the working directory off the path, then ``root`` first where it holds podrun."""
    return f"{_DROP_CWD}{_root_first(root)}" + ("\n" if "\n" in code else "; ") + code


def module_code(module: str, *, root: str | None = ROOT) -> str:
    """The ``-c`` text of a safe helper that runs ``module`` as ``__main__``, as ``python -m`` would (runpy; its
    ``sys.argv[0]`` the module's file), one line."""
    return (f"{_DROP_CWD}{_root_first(root)}; import runpy; runpy.run_module({json.dumps(module)}, "
            f"run_name=\"__main__\", alter_sys=True)")


def safe(python: str, *args: str, module: str | None = None, code: str | None = None,
         root: str | None = ROOT) -> list[str]:
    """The command line of a safe helper: ``python`` running ``module`` (or ``code``) with ``args``."""
    if (module is None) == (code is None):
        raise ValueError("a helper runs a module or code, one of them")
    text = module_code(module, root=root) if module is not None else safe_code(code, root=root)
    return [python, "-c", text, *args]


def lean_boot(root: str, version: str) -> str:
    """The ``-c`` code of an agent started isolated (``python -I -S -c CODE OPTIONS``), one line: podrun ``version``
    from ``root`` first on the path, without site; where that podrun is not there or is another version, the safe
    agent instead (``safe(python, AGENT_MODULE)`` without a root: site, PYTHONPATH, not the working directory),
    which the interpreter becomes. Where the host's environment asks for no bytecode files
    (PYTHONDONTWRITEBYTECODE, which ``-I`` ignores), the lean agent writes none either, as the usual start would
    not."""
    # a JSON string is a Python string literal, in double quotes: a shell line quotes them plainly
    return (f"{_LEAN}bool(os.environ.get(\"PYTHONDONTWRITEBYTECODE\")); "
            f"r = {json.dumps(root)}; here = os.path.isfile(os.path.join(r, \"podrun\", \"host\", "
            f"\"agent.py\")) and not sys.path.insert(0, r) and __import__(\"podrun\").__version__ == "
            f"{json.dumps(version)}; here or os.execv(sys.executable, [sys.executable, \"-c\", "
            f"{json.dumps(module_code(AGENT_MODULE, root=None))}, *sys.argv[1:]]); "
            f"from {AGENT_MODULE} import main; sys.exit(main())")


def isolated(python: str, options: list[str], *, root: str = ROOT, version: str | None = None) -> list[str]:
    """The lean agent's command line with ``options``: podrun ``version`` (this one's by default) from ``root``."""
    if version is None:
        import podrun

        version = podrun.__version__
    return [python, "-I", "-S", "-c", lean_boot(root, version), *options]


def agent(python: str, options: list[str], *, lean: bool) -> list[str]:
    """An agent's command line with ``options``: ``lean`` with this very interpreter (the same path on every host),
    isolated with this podrun's root and version; else safe, the host's own podrun."""
    if lean and os.path.abspath(python) == os.path.abspath(sys.executable):
        return isolated(python, options)
    return safe(python, *options, module=AGENT_MODULE, root=None)


def target(python: str, kind: str, name: str, args=()) -> list[str]:
    """What a worker runs for the user's ``kind`` "script" (``python NAME ARGS``: its directory first) or "module"
    (``python -m NAME ARGS``: the working directory first), as torchrun runs them; a module of podrun's own
    (calibrate's worker) is a helper: safe, the host's own podrun."""
    if kind == "module":
        if name == "podrun" or name.startswith("podrun."):
            return safe(python, *args, module=name, root=None)
        return [python, "-m", name, *args]
    return [python, name, *args]


def is_helper(argv) -> bool:
    """Whether ``argv`` is a helper's command line built here (safe or isolated)."""
    argv = list(argv)
    if argv[1:2] == ["-c"] and len(argv) > 2:
        return argv[2].startswith(_DROP_CWD)
    return argv[1:4] == ["-I", "-S", "-c"] and len(argv) > 4 and argv[4].startswith(_LEAN)


def _checked(argv) -> list[str]:
    argv = list(argv)
    if not is_helper(argv):
        raise ValueError(f"not a helper's command line built by podrun.pystart: {argv[:3]!r}")
    return argv


def popen(argv, **kw) -> subprocess.Popen:
    """Start a helper (``safe``, ``agent``) as subprocess.Popen would."""
    return subprocess.Popen(_checked(argv), **kw)


def run(argv, **kw) -> subprocess.CompletedProcess:
    """Run a helper to its end as subprocess.run would."""
    return subprocess.run(_checked(argv), **kw)


def execv(argv) -> None:
    """Become a helper (``argv[0]`` the interpreter), as os.execv would."""
    argv = _checked(argv)
    os.execv(argv[0], argv)
