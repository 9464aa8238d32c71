"""Installed by the podrun agent first on a worker's PYTHONPATH: lets the agent ask for this process's stacks.

When PODRUN_STACK_DIR is set, every Python process of the worker registers faulthandler on
PODRUN_STACK_SIGNAL (all threads, chained to a Python handler already there), dumping into
<dir>/<pid>.txt, and writes <dir>/<pid>.main with its main thread's id and its start time (the clock ticks
of /proc/<pid>/stat); the agent signals only a process that wrote that file and started at that time, so a
process without the handler (one that took a dead worker's pid) is never sent the signal. A process
forked from one (a DataLoader worker) registers again under its own pid. At exit (the last atexit callback,
while the interpreter is whole) the process turns its registration into <dir>/<pid>.exit (so the agent can say
its program has returned: a worker whose exit takes long is not hung) and ignores the signal from then on:
Python's finalization unregisters faulthandler's handler, the signal's default action ends a process, and a
process's exit may go on for a while after that (a library's C++ destructors: gloo, torch's thread pools), so a
dump asked in that window would otherwise end a worker that had finished (exit 166). Earlier, as its exit begins
(before non-daemon threads are joined and atexit runs), it writes <dir>/<pid>.ending, which the agent watches: a
worker that stays alive and idle after that is ended and named. Then the next sitecustomize on sys.path, if any,
runs as it would have. Imports nothing beyond the stdlib but podrun.safefs (stdlib only itself), through which its
files are made.
"""


def _safefs():
    """podrun.safefs, from this file's own podrun when the worker's Python has no podrun of its own."""
    import os
    import sys

    try:
        from podrun import safefs
    except ImportError:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        sys.path.insert(0, root)
        try:
            from podrun import safefs
        finally:
            sys.path.remove(root)
    return safefs


def _install(first=True):
    import os

    where = os.environ.get("PODRUN_STACK_DIR")
    signum = os.environ.get("PODRUN_STACK_SIGNAL", "")
    if not where or not signum.isdigit():
        return
    import faulthandler
    import signal
    import threading

    pid = os.getpid()
    try:
        safefs = _safefs()
        f = os.fdopen(safefs.open_private(os.path.join(where, f"{pid}.txt")), "a", encoding="utf-8")
        # chain only to a real handler: chaining to SIG_DFL would end the process after the dump
        faulthandler.register(int(signum), file=f, all_threads=True, chain=callable(signal.getsignal(int(signum))))
    except Exception:  # noqa: BLE001 - a refused file too: no dumps for this process
        return
    globals()["_podrun_stack_file"] = f       # the handler writes to its fd for the process's life
    try:
        with open("/proc/self/stat", "rb") as st:
            start = st.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return
    try:
        safefs.write_file(os.path.join(where, f"{pid}.main"), f"{threading.main_thread().ident:#018x}\n{start}\n",
                          "stack record", durable=False)
    except Exception:  # noqa: BLE001 - without its record the agent never signals this process
        return
    if first:
        import atexit

        os.register_at_fork(after_in_child=lambda: _install(False))
        atexit.register(_leave, where, int(signum))     # registered first: runs last; a fork's child inherits it
        _watch_ending(where, pid, threading)


def _watch_ending(where, pid, threading):
    """The process's exit begins (threading._shutdown: called first by the interpreter's finalization, and by a
    worker the zygote forked, before non-daemon threads are joined and atexit runs): <dir>/<pid>.ending says so, so
    the agent can end a worker that hangs after its program returned (podrun.host.agent's exit watch)."""
    import os

    shutdown = threading._shutdown

    def _shutdown():
        if os.getpid() == pid:            # not in a forked child (a DataLoader worker) that shares this module
            try:
                _safefs().write_file(os.path.join(where, f"{pid}.ending"), "", "exit marker", durable=False)
            except Exception:  # noqa: BLE001 - never stop an exit
                pass
        shutdown()
    threading._shutdown = _shutdown


def _leave(where, signum):
    """At exit: no more dumps (the registration renamed <pid>.exit, so the agent asks none and knows why), and the
    signal ignored for the rest of the exit (a signal the agent sent before it saw the file go)."""
    import faulthandler
    import os
    import signal

    pid = os.getpid()
    try:
        _safefs().rename(os.path.join(where, f"{pid}.main"), os.path.join(where, f"{pid}.exit"))
    except (OSError, ImportError):
        pass
    try:
        faulthandler.unregister(signum)
        signal.signal(signum, signal.SIG_IGN)       # kept to the end: finalization restores only Python handlers
    except (OSError, ValueError, RuntimeError):
        pass


def _chunk_output():
    """With PODRUN_OUTPUT_CHUNK (the agent's output sockets take one write of at most that many bytes as one
    message), sys.stdout and sys.stderr write larger data in pieces of that size, as a pipe would take it."""
    import io
    import os
    import sys

    chunk = os.environ.get("PODRUN_OUTPUT_CHUNK", "")
    if not chunk.isdigit() or int(chunk) <= 0:
        return
    limit = int(chunk)

    class ChunkedFileIO(io.FileIO):
        def write(self, b):
            view, done = memoryview(b).cast("B"), 0
            while done < len(view):
                n = super().write(view[done:done + limit])
                if n is None:           # non-blocking and full: what was written so far
                    break
                done += n
            return done

    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name, None)
        buffered = isinstance(getattr(old, "buffer", None), io.BufferedWriter)
        if not isinstance(old, io.TextIOWrapper) or not (buffered or isinstance(old.buffer, io.FileIO)):
            continue
        try:
            if old.fileno() != fd:
                continue
            old.flush()
            raw = ChunkedFileIO(fd, "wb", closefd=False)          # python -u: the raw file is the buffer
            new = io.TextIOWrapper(io.BufferedWriter(raw) if buffered else raw,
                                   encoding=old.encoding, errors=old.errors, line_buffering=old.line_buffering,
                                   write_through=old.write_through)
        except (OSError, ValueError):
            continue
        if getattr(sys, f"__{name}__", None) is old:
            setattr(sys, f"__{name}__", new)
        setattr(sys, name, new)


def _chain():
    """Import the sitecustomize this one hides (the next one on sys.path), as site would have."""
    import importlib
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    mine = sys.modules.get(__name__)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        del sys.modules[__name__]
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved
        if "sitecustomize" not in sys.modules and mine is not None:
            sys.modules[__name__] = mine


try:
    _install()
except Exception:  # noqa: BLE001 - never stop the user's program from starting
    pass
try:
    _chunk_output()
except Exception:  # noqa: BLE001
    pass
_chain()
