"""Agents that join: the join address, the run's key (from the environment, never a command line) and the hand-shake.

An agent started by a launcher of its own (srun, mpirun), or a copy of `podrun launch` (podrun.launch.copies),
connects over TCP to its controller's join address. The hand-shake proves the run's key both ways, and the key never
travels: the controller writes a challenge with a fresh nonce; the agent answers with a ``Join`` (podrun.wire.protocol):
its run id, instance, host name and pid, a fresh nonce of its own, and ``proof``: the HMAC-SHA256 with the run's key of
both nonces, the run id and the instance. The controller compares it in constant time and says ``refused`` and why, or
``ok`` with ``controller_proof``: the HMAC of the same four under another label, which only a holder of the key can
make for the agent's fresh nonce. The agent takes nothing from its listener (no ``ok``, no arguments) before that
proof checks; a copy's arguments (``JoinArgs``) carry ``args_mac`` over the same nonces, so no one else can name the
program it runs or where. After an ``ok`` the connection carries the protocol both ways, as a pipe does for a started
agent: the agent's lines in, the controller's tokens out. The key reaches the agent in its launcher's environment
(KEY_ENV: srun's --export=ALL, mpirun's -x NAME), which the agent takes out of its own environment before any worker
starts.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import time

from podrun.wire import protocol

KEY_ENV = "PODRUN_JOIN_KEY"      # the run's key, in the agent's (and a job script's) environment
MIN_KEY_CHARS = 16               # a shorter key is refused: it would be guessable
LINE_LIMIT = 1024                # bytes of one hand-shake line
HANDSHAKE_S = 10.0               # how long either side waits for the other's next hand-shake line


class JoinError(Exception):
    """A hand-shake that did not succeed: ``str`` is one line naming the address and why."""


class UnprovenListener(JoinError):
    """The listener on the join address could not prove the run's key: it is no controller of this run (another
    process may hold the port); nothing it sent is used."""


def new_key() -> str:
    """A fresh run key (256 bits)."""
    return secrets.token_hex(32)


def take_key(environ=None, name: str = KEY_ENV) -> str | None:
    """The run key from ``environ`` (os.environ), removed from it so that no worker inherits it; None when not set."""
    environ = os.environ if environ is None else environ
    return environ.pop(name, None) or None


def user_key_path(environ) -> str:
    """Where this user's join key is kept: podrun/join.key in the user's configuration directory ($XDG_CONFIG_HOME,
    else ~/.config), which a cluster's nodes share with the home directory, as ssh keys are."""
    base = environ.get("XDG_CONFIG_HOME")
    if not base:
        home = environ.get("HOME")
        if not home:
            import pwd

            home = pwd.getpwuid(os.geteuid()).pw_dir
        base = os.path.join(home, ".config")
    return os.path.join(base, "podrun", "join.key")


def user_key(path: str) -> str:
    """This user's join key, kept in ``path`` (user_key_path): a file of this user's alone (0600, not a link, in a
    directory of theirs that no one else may write), made on first use (exclusively: two copies starting at once
    on nodes that share the home directory read the one made first). ValueError (one line naming the file, its
    owner and mode) for a file or directory another user owns or may read or write."""
    from podrun import safefs

    what = "join key"
    try:
        safefs.own_dir(os.path.dirname(path), "directory of the join key")
        if not os.path.lexists(path):
            safefs.create_whole(path, (new_key() + "\n").encode(), what)
        key = safefs.read_trusted(path, what, limit=4096, private=True).decode("utf-8", "replace").strip()
    except safefs.UnsafePath as exc:
        raise ValueError(f"{exc.message}; a join key must be yours alone: `chmod 600` it (and `chmod go-w` its "
                         f"directory), or remove it and podrun makes a new one") from None
    problem = f"{path} is empty" if not key else key_problem(key, path)
    if problem is not None:
        raise ValueError(f"the join key {problem}; remove it and podrun makes a new one")
    return key


def key_problem(key: str | None, name: str = KEY_ENV) -> str | None:
    """Why ``key`` cannot serve as a run key, in words (None: it can)."""
    if key is None:
        return f"{name} is not set"
    if len(key) < MIN_KEY_CHARS:
        return f"{name} has {len(key)} characters; a run key needs at least {MIN_KEY_CHARS} (a secret: " \
               "python3 -c 'import secrets; print(secrets.token_hex(32))')"
    return None


def _mac(key: str, label: str, *words: str) -> str:
    return hmac.new(key.encode(), "\n".join((label, *words)).encode(), hashlib.sha256).hexdigest()


def proof(key: str, nonce: str, agent_nonce: str, run_id: str, instance: int) -> str:
    """What an agent sends for ``instance`` of ``run_id`` against the controller's ``nonce``, with its own
    ``agent_nonce``."""
    return _mac(key, "podrun-join agent", nonce, agent_nonce, run_id, str(instance))


def proof_ok(key: str, nonce: str, join: protocol.Join) -> bool:
    """Whether ``join`` proves the key (compared in constant time)."""
    return hmac.compare_digest(proof(key, nonce, join.nonce, join.run_id, join.instance), join.proof)


def controller_proof(key: str, nonce: str, agent_nonce: str, run_id: str, instance: int) -> str:
    """What the controller sends with its ``ok`` to the agent of ``instance`` of ``run_id``: the key's proof over
    both nonces under a label of its own (an agent's proof sent back is no controller's)."""
    return _mac(key, "podrun-join controller", nonce, agent_nonce, run_id, str(instance))


def args_mac(key: str, nonce: str, agent_nonce: str, run_id: str, instance: int, args: protocol.JoinArgs) -> str:
    """The MAC of a copy's arguments (their argv and workdir) in this hand-shake."""
    return _mac(key, "podrun-join args", nonce, agent_nonce, run_id, str(instance), args.body())


def with_mac(key: str, nonce: str, agent_nonce: str, run_id: str, instance: int,
             args: protocol.JoinArgs) -> protocol.JoinArgs:
    """``args`` carrying their MAC in this hand-shake (args_mac)."""
    return protocol.JoinArgs(args.argv, args.workdir, args_mac(key, nonce, agent_nonce, run_id, instance, args))


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
    """One hand-shake line (with its newline) from a blocking ``sock``, taking nothing after it off the connection
    (the protocol's lines follow it, read by another): what is there is looked at (MSG_PEEK) and taken up to the
    newline, and the call blocks for more; b"" when the peer closed or ``deadline`` (monotonic) passed, or the line
    is longer than ``limit`` bytes."""
    got = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return b""
        sock.settimeout(left)
        try:
            data = sock.recv(limit - len(got), socket.MSG_PEEK)
            if not data:
                return b""
            end = data.find(b"\n")
            got += sock.recv(end + 1 if end >= 0 else len(data))
        except OSError:
            return b""
        if end >= 0:
            return got
        if len(got) >= limit:
            return b""


def join(address: str, key: str, run_id: str, instance: int, bound_s: float, copy: bool = False
         ) -> tuple[socket.socket, protocol.JoinArgs | None]:
    """The agent's side: connect to ``address`` and pass the hand-shake, trying again until ``bound_s`` seconds
    have passed while no listener answers (the controller may start after its agents, or close a hand-shake when
    many come at once); the connected socket (blocking) and, for a ``copy`` of `podrun launch`, the agent it is to
    become, its MAC checked; or JoinError, one line (what the listener said escaped), when the listener refuses the
    join or cannot prove the run's key: nothing it sent is then used."""
    host, port = parse_address(address)
    deadline = time.monotonic() + bound_s
    last = "no answer"
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=max(0.1, min(5.0, deadline - time.monotonic())))
        except OSError as exc:
            sock, last = None, exc.strerror or str(exc)
        if sock is not None:
            try:
                got = _handshake(sock, address, key, run_id, instance, copy)
            except OSError as exc:
                sock.close()
                raise JoinError(f"the connection to the controller at {address} broke in the hand-shake: "
                                f"{exc.strerror or exc}") from None
            except BaseException:
                sock.close()
                raise
            if got is not None:
                sock.settimeout(None)
                return sock, got[0]
            sock.close()
            last = "the listener closed the connection before its verdict"
        if time.monotonic() + 0.2 >= deadline:
            raise JoinError(f"cannot join the controller at {address} within {bound_s:g} s: {last}")
        time.sleep(0.2)


def _handshake(sock: socket.socket, address: str, key: str, run_id: str, instance: int, copy: bool
               ) -> tuple[protocol.JoinArgs | None] | None:
    """One hand-shake on ``sock``: (the copy's arguments or None) once the controller proved the key; None when the
    listener closed before its verdict (the caller tries again); else JoinError."""
    from podrun.redaction import escape_controls

    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    hs_deadline = time.monotonic() + HANDSHAKE_S
    line = read_line(sock, hs_deadline)
    if not line:
        return None
    challenge = protocol.read_join_line(line, protocol.JoinChallenge)
    if challenge is None or challenge.version != protocol.JOIN_VERSION:
        raise JoinError(f"{address} did not answer as a podrun controller (hand-shake version "
                        f"{protocol.JOIN_VERSION})")
    mine = secrets.token_hex(16)
    sock.sendall(protocol.join_line(protocol.Join(run_id, instance, socket.gethostname(), os.getpid(),
                                                  proof(key, challenge.nonce, mine, run_id, instance), mine, copy)))
    line = read_line(sock, hs_deadline)
    if not line:
        return None
    reply = protocol.read_join_line(line, protocol.JoinReply)
    if reply is None:
        raise JoinError(f"the controller at {address} did not answer the join of instance {instance}")
    if not reply.accepted:
        raise JoinError(f"the controller at {address} refused instance {instance}: {escape_controls(reply.reason)}")
    if not hmac.compare_digest(reply.proof, controller_proof(key, challenge.nonce, mine, run_id, instance)):
        raise UnprovenListener(f"the listener at {address} cannot prove this run's key ({KEY_ENV}): it is no "
                               f"controller of run {run_id} (another process may hold the port); nothing it sent was "
                               "used")
    if not copy:
        return (None,)
    args = protocol.read_join_line(read_line(sock, hs_deadline, protocol.READ_LIMIT), protocol.JoinArgs)
    if args is None:
        raise JoinError(f"the controller at {address} sent no arguments for instance {instance}")
    if not hmac.compare_digest(args.mac, args_mac(key, challenge.nonce, mine, run_id, instance, args)):
        raise UnprovenListener(f"the arguments the controller at {address} sent for instance {instance} do not "
                               "carry this run's key's MAC; nothing it sent was used")
    return (args,)
