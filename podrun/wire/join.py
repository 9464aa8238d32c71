"""Agents that join: the join address, the run's key (from the environment, never a command line) and the hand-shake.

An agent started by a launcher of its own (srun, mpirun) connects over TCP to its controller's join address. The
controller writes a challenge with a fresh nonce; the agent answers with a ``Join`` (podrun.wire.protocol): its run
id, instance, host name and pid, and the HMAC-SHA256 of the nonce, run id and instance with the run's key; the
controller compares it in constant time and says ``ok`` or ``refused`` and why. After an ``ok`` the connection
carries the protocol both ways, as a pipe does for a started agent: the agent's lines in, the controller's tokens out.
The key reaches the agent in its launcher's environment (KEY_ENV: srun's --export=ALL, mpirun's -x NAME), which the
agent takes out of its own environment before any worker starts.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import socket
import time

from podrun.wire import protocol

KEY_ENV = "PODRUN_JOIN_KEY"      # the run's key, in the agent's (and a job script's) environment
MIN_KEY_CHARS = 16               # a shorter key is refused: it would be guessable
LINE_LIMIT = 1024                # bytes of one hand-shake line
HANDSHAKE_S = 10.0               # how long either side waits for the other's next hand-shake line


class JoinError(Exception):
    """A hand-shake that did not succeed: ``str`` is one line naming the address and why."""


def new_key() -> str:
    """A fresh run key (256 bits)."""
    import secrets

    return secrets.token_hex(32)


def take_key(environ=None, name: str = KEY_ENV) -> str | None:
    """The run key from ``environ`` (os.environ), removed from it so that no worker inherits it; None when not set."""
    environ = os.environ if environ is None else environ
    return environ.pop(name, None) or None


def key_problem(key: str | None, name: str = KEY_ENV) -> str | None:
    """Why ``key`` cannot serve as a run key, in words (None: it can)."""
    if key is None:
        return f"{name} is not set"
    if len(key) < MIN_KEY_CHARS:
        return f"{name} has {len(key)} characters; a run key needs at least {MIN_KEY_CHARS} (a secret: " \
               "python3 -c 'import secrets; print(secrets.token_hex(32))')"
    return None


def proof(key: str, nonce: str, run_id: str, instance: int) -> str:
    """What an agent sends for ``instance`` of ``run_id`` against the controller's ``nonce``."""
    return hmac.new(key.encode(), f"{nonce} {run_id} {instance}".encode(), hashlib.sha256).hexdigest()


def proof_ok(key: str, nonce: str, join: protocol.Join) -> bool:
    """Whether ``join`` proves the key (compared in constant time)."""
    return hmac.compare_digest(proof(key, nonce, join.run_id, join.instance), join.proof)


def split_address(text: str) -> tuple[str, str | None, bool]:
    """``HOST``, ``HOST:PORT`` or ``[IPV6]:PORT`` split (one grammar for every address podrun reads: --join-address
    here, torchrun's --rdzv-endpoint): (host, the port's text or None, whether a bracketed host's bracket closed with
    at most ``:PORT`` after it)."""
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else None
        return host, port, bool(sep) and (not rest or port is not None)
    if text.count(":") == 1:
        host, port = text.split(":")
        return host, port, True
    return text, None, True


def parse_address(text: str) -> tuple[str, int | None]:
    """``HOST``, ``HOST:PORT`` or ``[IPV6]:PORT`` -> (host, port or None); ValueError for a port that is not one."""
    host, port, _ = split_address(text)
    if port is not None and not (port.isdigit() and 0 <= int(port) <= 65535):
        raise ValueError(f"{text!r}: the port is not a number from 0 to 65535")
    if not host:
        raise ValueError(f"{text!r} names no host")
    return host, None if port is None else int(port)


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def read_line(sock: socket.socket, deadline: float, limit: int = LINE_LIMIT) -> bytes:
    """One hand-shake line (with its newline), taking nothing after it off the connection; b"" when the peer
    closed or ``deadline`` (monotonic) passed, or the line is longer than ``limit`` bytes."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return b""
        sock.settimeout(left)
        try:
            data = sock.recv(limit, socket.MSG_PEEK)
        except OSError:
            return b""
        if not data:
            return b""
        end = data.find(b"\n")
        if end >= 0:
            return sock.recv(end + 1)
        if len(data) >= limit:
            return b""
        time.sleep(0.005)          # a part of the line: wait for the rest


def join(address: str, key: str, run_id: str, instance: int, bound_s: float, copy: bool = False
         ) -> tuple[socket.socket, protocol.JoinArgs | None]:
    """The agent's side: connect to ``address`` (trying again until ``bound_s`` seconds have passed: the controller
    may start after its agents) and pass the hand-shake; the connected socket (blocking) and, for a ``copy`` of
    `podrun launch`, the agent it is to become; or JoinError."""
    host, port = parse_address(address)
    deadline = time.monotonic() + bound_s
    last = "no answer"
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=max(0.1, min(5.0, deadline - time.monotonic())))
            break
        except OSError as exc:
            last = exc.strerror or str(exc)
            if time.monotonic() + 0.2 >= deadline:
                raise JoinError(f"cannot join the controller at {address} within {bound_s:g} s: {last}") from None
            time.sleep(0.2)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        hs_deadline = time.monotonic() + HANDSHAKE_S
        challenge = protocol.read_join_line(read_line(sock, hs_deadline), protocol.JoinChallenge)
        if challenge is None or challenge.version != protocol.JOIN_VERSION:
            raise JoinError(f"{address} did not answer as a podrun controller (hand-shake version "
                            f"{protocol.JOIN_VERSION})")
        sock.sendall(protocol.join_line(protocol.Join(run_id, instance, socket.gethostname(), os.getpid(),
                                                      proof(key, challenge.nonce, run_id, instance), copy)))
        reply = protocol.read_join_line(read_line(sock, hs_deadline), protocol.JoinReply)
        if reply is None:
            raise JoinError(f"the controller at {address} did not answer the join of instance {instance}")
        if not reply.accepted:
            raise JoinError(f"the controller at {address} refused instance {instance}: {reply.reason}")
        args = None
        if copy:
            args = protocol.read_join_line(read_line(sock, hs_deadline, protocol.READ_LIMIT), protocol.JoinArgs)
            if args is None:
                raise JoinError(f"the controller at {address} sent no arguments for instance {instance}")
    except OSError as exc:
        sock.close()
        raise JoinError(f"the connection to the controller at {address} broke in the hand-shake: "
                        f"{exc.strerror or exc}") from None
    except BaseException:
        sock.close()
        raise
    sock.settimeout(None)
    return sock, args
