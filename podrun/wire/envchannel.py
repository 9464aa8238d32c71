"""The env message on an agent's stdin: how the controller hands an agent the run's --env values off every command line.

Over a private stdin pipe (the ssh transports: OpenSSH's client, paramiko's channel) the controller's first
bytes to an agent started with ``--env-stdin`` are one framed message, written before anything else:

    PODRUN-ENV <n>\\n<n bytes: UTF-8 JSON, a list of [name, value] pairs>

The agent reads exactly those bytes, unbuffered, before it reads or starts anything else; only then does its
stdin watch begin, so the controller's single-byte tokens that follow (``.`` heartbeat, ``S``, ``T``, ``G``)
are never taken for part of the message, nor a byte of the message (a value may hold any letter) for a token.
"""
from __future__ import annotations

import json
import os
import select
import time

MAGIC = b"PODRUN-ENV "
MAX_HEADER = len(MAGIC) + 12      # the magic, at most 11 digits, the newline
MAX_BYTES = 16 * 1024 * 1024      # far above any environment a kernel accepts (ARG_MAX)


class EnvMessageError(Exception):
    """The bytes on stdin are not an env message (or it did not come in time)."""


def encode(pairs) -> bytes:
    """The framed message for ``pairs`` (NAME, VALUE)."""
    body = json.dumps([[str(k), str(v)] for k, v in pairs], separators=(",", ":")).encode("utf-8")
    return MAGIC + str(len(body)).encode() + b"\n" + body


def _read_exactly(fd: int, n: int, deadline: float, what: str) -> bytes:
    out = bytearray()
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise EnvMessageError(f"no {what} on stdin within the time allowed")
        chunk = os.read(fd, n - len(out))
        if not chunk:
            raise EnvMessageError(f"stdin closed before the {what} was complete")
        out += chunk
    return bytes(out)


def read(fd: int, timeout: float) -> list[tuple[str, str]]:
    """Read one message from ``fd`` (byte by byte for the header, then exactly its length: nothing after it is
    consumed) and return its pairs; EnvMessageError when it is not one or does not come within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    header = bytearray()
    while not header.endswith(b"\n"):
        if len(header) >= MAX_HEADER:
            raise EnvMessageError("the env message's header is too long")
        header += _read_exactly(fd, 1, deadline, "env message")
        if not MAGIC.startswith(bytes(header[:len(MAGIC)])):
            raise EnvMessageError(f"stdin does not start with an env message (got {bytes(header)!r})")
    size = header[len(MAGIC):-1]
    if not size.isdigit() or int(size) > MAX_BYTES:
        raise EnvMessageError(f"the env message's length {bytes(size)!r} is not a number up to {MAX_BYTES}")
    body = _read_exactly(fd, int(size), deadline, "env message")
    try:
        pairs = json.loads(body.decode("utf-8"))
        out = [(str(k), str(v)) for k, v in pairs]
    except (ValueError, TypeError):
        raise EnvMessageError("the env message is not a JSON list of [name, value] pairs") from None
    if any(not k or "=" in k or "\0" in k + v for k, v in out):
        raise EnvMessageError("the env message holds a name or value no environment can hold")
    return out
