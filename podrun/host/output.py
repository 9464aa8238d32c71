"""A worker's output on its agent: stamped stdout/stderr sockets relayed in the order written, its progress pipe."""
from __future__ import annotations

import contextlib
import math
import mmap
import os
import select
import socket
import struct
import time
from typing import Callable

from podrun.wire import protocol

_STAMP_ROOM = socket.CMSG_SPACE(16)      # one struct timespec
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)   # Linux's value; Python does not name it
# SO_SNDBUF asked for each of a worker's output streams: Linux's default net.core.wmem_max, which the kernel
# doubles; one write is one message of at most about that (~416 KiB), and at most that much waits unread, so a
# worker is held back by a slow reader as by a pipe, and what it wrote before it exited is relayed in moments
_WRITE_BUF = 212992

# emit(kind, text): one ``out``/``err``/``prog`` line of this worker to the controller
Emit = Callable[[str, str], None]


def output_sockets() -> tuple[list[tuple[str, socket.socket]], tuple[socket.socket, socket.socket]]:
    """A worker's stdout and stderr: per stream a SOCK_SEQPACKET pair whose read end stamps each message
    (SO_TIMESTAMPNS), so that one reader can put both streams back in the order they were written.
    Returns ([("out", read end), ("err", read end)], (stdout's write end, stderr's write end))."""
    reads, writes = [], []
    for kind in ("out", "err"):
        r, w = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        r.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        w.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _WRITE_BUF)   # the largest single write it takes
        r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _WRITE_BUF)
        r.shutdown(socket.SHUT_WR)
        w.shutdown(socket.SHUT_RD)
        reads.append((kind, r))
        writes.append(w)
    return reads, (writes[0], writes[1])


def _stamp(anc) -> int:
    """The kernel's send time (ns) of a message, from its SCM_TIMESTAMPNS; now when it has none."""
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(data) >= 16:
            sec, nsec = struct.unpack("@ll", data[:16])
            return sec * 1_000_000_000 + nsec
    return time.time_ns()


def pump(streams: list[tuple[str, socket.socket]], emit: Emit) -> None:
    """Relay a worker's stdout and stderr as ``out``/``err`` lines in the order it wrote them, and a line that waits
    for its end (a prompt, a ``\r`` progress bar) as ``part`` lines, each once it waited protocol.PART_WAIT_S.

    Each stream is a SOCK_SEQPACKET socket whose every write is one message stamped by the kernel when
    it was sent (SO_TIMESTAMPNS); one thread reads both and emits in stamp order. A message read in one
    pass may be preceded (in stamp order) by one of the other stream that arrives in the next pass only
    if the writer's sendmsg was in flight across the first; so a pass emits what earlier passes read,
    merged with this pass's messages stamped before the last of them, and holds the rest one more pass."""
    socks = {s.fileno(): (kind, s) for kind, s in streams}
    lines = {kind: protocol.LineAssembler(frames=True) for kind, _ in streams}
    waiting: dict[str, float] = {}                     # stream -> since when its changed partial line waits
    room = max(s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) for _, s in streams)
    buf = mmap.mmap(-1, max(room, _WRITE_BUF * 2))    # untouched pages cost nothing
    poller = select.poll()
    for fd in socks:
        poller.register(fd, select.POLLIN)
    held: list[tuple[int, int, str, bytes]] = []       # read in an earlier pass: (stamp, order, kind, data)
    order = 0
    try:
        while socks or held:
            poller.poll(0 if held else _part_due(waiting))
            new, capped, order = _read_pass(socks, poller, buf, room, order)
            merged = sorted(held + new)
            last = _last_due(merged, held, capped, ended=not socks)
            for _, _, kind, data in merged[:last + 1]:
                for raw in lines[kind].feed(data):
                    emit(kind, raw.decode("utf-8", "replace"))
            held = merged[last + 1:]
            if not held:
                _parts(lines, waiting, emit)
        for kind in lines:
            for raw in lines[kind].end():
                emit(kind, raw.decode("utf-8", "replace"))
    except (OSError, ValueError):
        pass
    finally:
        buf.close()
        for _, s in socks.values():
            s.close()


def _part_due(waiting: dict[str, float]) -> int | None:
    """poll's timeout (ms) until the first waiting partial line is due; None (no timeout) when none waits."""
    if not waiting:
        return None
    return max(0, math.ceil((min(waiting.values()) + protocol.PART_WAIT_S - time.monotonic()) * 1000))


def _parts(lines: dict[str, protocol.LineAssembler], waiting: dict[str, float], emit: Emit) -> None:
    """Each stream's line not ended yet that changed: from now it waits; once it waited PART_WAIT_S, a ``part``."""
    now = time.monotonic()
    for kind, assembler in lines.items():
        if not assembler.changed:
            waiting.pop(kind, None)
        elif now - waiting.setdefault(kind, now) >= protocol.PART_WAIT_S:
            del waiting[kind]
            if (got := assembler.partial()) is not None:
                emit("part", protocol.Part(kind, got[1], got[0]).encode())


def _read_pass(socks: dict, poller, buf: mmap.mmap, room: int, order: int) -> tuple[list, list, int]:
    """One pass over the open streams: (the messages read as (stamp, order, kind, data), the last stamps of the
    streams left unread past a pass's share, the order of the last message read). A stream whose write ends
    are all closed is closed and dropped from ``socks``."""
    new = []
    capped = []                               # last stamps of streams left unread past a pass's share
    for fd, (kind, s) in list(socks.items()):
        got = 0
        while True:
            if got >= room:                   # a pass takes at most a receive buffer of each stream:
                capped.append(new[-1][0])     # memory stays bounded however fast the worker writes
                break
            try:
                n, anc, _, _ = s.recvmsg_into([buf], _STAMP_ROOM, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                n, anc = 0, []
            if n == 0 and not anc:            # every copy of the write end is closed
                poller.unregister(fd)
                s.close()
                del socks[fd]
                break
            order += 1
            got += n
            new.append((_stamp(anc), order, kind, bytes(buf[:n])))
    return new, capped, order


def _last_due(merged: list, held: list, capped: list, ended: bool) -> int:
    """The index in ``merged`` (this pass's messages and the held ones, in stamp order) of the last one to emit
    now: the last held one, all of them once every stream ``ended``, never past a capped stream's last stamp."""
    old = {m[1] for m in held}
    last_old = max((i for i, m in enumerate(merged) if m[1] in old), default=-1)
    if ended:                                 # nothing more can come: all of it, in order
        last_old = len(merged) - 1
    if capped:                                # a stream's unread messages may precede later stamps
        last_old = min(last_old, max((i for i, m in enumerate(merged) if m[0] <= min(capped)), default=-1))
    return last_old


def pump_progress(fd: int, emit: Emit) -> None:
    """Relay a worker's progress records (JSON lines on its PODRUN_PROGRESS_FD pipe) as ``prog`` lines."""
    with contextlib.suppress(OSError, ValueError), os.fdopen(fd, "rb") as f:
        for raw in protocol.bounded_lines(f, 4096):
            text = raw.decode("utf-8", "replace").strip()
            if text.startswith("{"):
                emit("prog", text)
