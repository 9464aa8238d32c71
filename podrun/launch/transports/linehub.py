"""One thread that reads the output pipes of every agent this controller starts (a selector), cut into lines.

A thread per pipe (two per host, and the supervisor's one per host) costs the controller a thread start per
host and a wake-up per line each, and at 64 hosts beside 256 starting workers on a busy machine those ~190
threads queued for the GIL for seconds. The hub reads every ready pipe in one pass, however many there are;
a source that its owner cannot take more from is paused (left unread, so the pipe fills and holds the agent
back) until it is resumed. Everything a source's callbacks do runs on the hub's thread, in the order read.
"""
from __future__ import annotations

import contextlib
import io
import os
import selectors
import stat
import threading
from typing import Callable

from podrun.wire.protocol import READ_LIMIT, LineAssembler

CHUNK = 65536             # bytes read from one pipe per pass: a flooding host cannot starve the others


class Source:
    """One pipe the hub reads: ``on_line(text)`` for each of its lines, then ``on_end()`` once, on the hub's
    thread. An exception from either ends the source (and is not raised further)."""

    def __init__(self, hub: "LineHub", fd: int, on_line: Callable[[str], None], on_end: Callable[[], None]):
        self.hub = hub
        self.fd = fd
        self.on_line = on_line
        self.on_end = on_end
        self.lines = LineAssembler(READ_LIMIT)
        self.paused = False
        self.ended = False

    def pause(self) -> None:
        """Stop reading this pipe until ``resume`` (from any thread; at once on the hub's)."""
        self.hub.call(lambda: self.hub._set_paused(self, True))

    def resume(self) -> None:
        self.hub.call(lambda: self.hub._set_paused(self, False))

    def close(self, then: Callable[[], None] = lambda: None) -> None:
        """Read no more: unless the pipe ended already, stop watching it and call ``on_end`` now; then ``then``
        (which may close the pipe: the hub no longer holds it). From any thread."""
        def close() -> None:
            if not self.ended:
                self.hub._end(self)
            then()
        self.hub.call(close)


class LineHub:
    """The selector thread (started with the first source; a daemon, it lives as long as the process)."""

    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._todo: list[Callable[[], None]] = []
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread: threading.Thread | None = None

    def add(self, fd: int, on_line: Callable[[str], None], on_end: Callable[[], None]) -> Source:
        """Read pipe ``fd`` (made non-blocking; its owner reads it no more) from now on."""
        os.set_blocking(fd, False)
        src = Source(self, fd, on_line, on_end)

        def register() -> None:
            try:
                self._sel.register(fd, selectors.EVENT_READ, src)
            except (KeyError, ValueError, OSError):   # closed, or not a descriptor: nothing will come from it
                src.paused = True                     # (not in the selector)
                self._end(src)

        self.call(register)
        return src

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the hub's thread: at once when called there, else after what it does now, in the order
        called."""
        if threading.current_thread() is self._thread:
            fn()
            return
        with self._lock:
            self._todo.append(fn)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="podrun-linehub", daemon=True)
                self._thread.start()
        with contextlib.suppress(BlockingIOError):      # a wake-up is pending already
            os.write(self._wake_w, b"x")

    def _set_paused(self, src: Source, paused: bool) -> None:
        if src.ended or src.paused == paused:
            return
        src.paused = paused
        if paused:
            self._sel.unregister(src.fd)
        else:
            self._sel.register(src.fd, selectors.EVENT_READ, src)

    def _run(self) -> None:
        while True:
            for key, _ in self._sel.select():
                if key.data is None:
                    self._run_todo()
                elif not (key.data.paused or key.data.ended):    # paused by an earlier one of this pass
                    self._read(key.data)

    def _run_todo(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass
        with self._lock:
            todo, self._todo = self._todo, []
        for fn in todo:
            with contextlib.suppress(Exception):   # one owner's mistake must not stop every host's output
                fn()

    def _read(self, src: Source) -> None:
        try:
            data = os.read(src.fd, CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        with contextlib.suppress(Exception):    # a broken owner ends its source, nothing more
            if data:
                for raw in src.lines.feed(data):
                    src.on_line(raw.decode("utf-8", "replace"))
                return
            for raw in src.lines.end():
                src.on_line(raw.decode("utf-8", "replace"))
        self._end(src)

    def _end(self, src: Source) -> None:
        if not src.paused:
            self._sel.unregister(src.fd)
        src.ended = True
        with contextlib.suppress(Exception):
            src.on_end()


_HUB: LineHub | None = None
_HUB_LOCK = threading.Lock()


def hub() -> LineHub:
    """This process's hub."""
    global _HUB
    with _HUB_LOCK:
        if _HUB is None:
            _HUB = LineHub()
        return _HUB


def pipe_fd(f) -> int | None:
    """The descriptor of ``f`` when the hub can read it (a pipe or a socket), else None (a paramiko channel's
    file, a regular file). ``f`` must be fresh: what its buffer may hold already would be skipped."""
    if not isinstance(f, (io.BufferedReader, io.FileIO)):      # what subprocess and os.fdopen give
        return None
    try:
        fd = f.fileno()
        mode = os.fstat(fd).st_mode
    except (AttributeError, OSError, ValueError):
        return None
    return fd if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) else None
