"""The agent's line protocol on stdout: one self-describing line per event, parsed by the supervisor.

Every line the agent writes is ``@podrun <instance> <local_rank|-> <kind> <text>``; an agent that runs a
single worker of its instance (--rank-from-env) writes that worker's local rank on its own lines too:

  out / err   a line a worker wrote on its stdout / stderr (text verbatim; of a line redrawn with ``\r``, a
              progress bar, its final state); one worker's lines of both kinds come in the order it wrote them
  part        a worker's line not ended yet, sent once it has waited PART_WAIT_S for its end (a prompt: pdb's,
              input()'s; a ``\r`` bar, at most once per PART_WAIT_S): text = "<out|err> <-|r> <its state>", r when
              the state replaces what was shown (a ``\r`` redraw); the ``out``/``err`` line ending it follows
  ready       the agent is up: text = "<hostname> <agent pid> <workers>"
  probe       with --hold: the host's preflight facts (podrun.wire.probe.Facts); the agent then waits for a
              ``G`` on stdin before it starts any worker
  start       a worker was spawned: text = its pid
  exit        a worker ended: text = "<return code> <unix time>[ teardown]" (negative code = killed by
              that signal; "teardown" when the agent was already ending its workers)
  error       a failed worker's @record error file (``WorkerError``), sent before its ``exit`` line
  prog        a worker's progress report (podrun.runtime.progress: ``Progress``)
  stack       on an ``S`` from the controller, one running worker's stacks (``Stacks``)
  hb          heartbeat, once a second: text = the agent's wall clock
  note        a message from the agent itself (teardown reasons, spawn errors)
  stop        the agent begins ending its workers: text = "<why> <unix time> <seconds>", why a StopKind value
              (STOP_CONTROLLER_LOST: it heard nothing from the controller for <seconds>; else <seconds> is 0)
  done        the agent is about to exit: text = its exit code

The texts with fields are messages (``Message``: Ready, Start, WorkerExit, Heartbeat, AgentStop, Done) that
encode and decode themselves; those that are JSON objects (Facts, WorkerError, Progress, Stacks) are ``Record``s, each
read keeping what has its type. The controller's bytes on an agent's stdin are ``Token``s and STOP_TOKENS.

A worker's line longer than MAX_LINE bytes is cut there (the agent holds at most that much of a
line): the cut part ends with CUT_MARK, and when the line finally ends a second line says how many
bytes were dropped. Readers of agent output cut at READ_LIMIT, enough for any protocol line.

Lines that do not start with ``@podrun `` (an ssh banner, mpirun's own messages) are kept as raw
output of the stream they came on. The supervisor parses this whatever the transport: a local pipe,
an ssh channel, or the merged stdout of one mpirun/srun process carrying every instance.
"""
from __future__ import annotations

import enum
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field, fields

from podrun import safefs
from podrun.rundir.layout import SPLIT_PARTS, STACKS_REQUEST, STOP_REQUEST

PREFIX = "@podrun "
MAX_LINE = 64 * 1024           # bytes of one worker line the agent holds and forwards
READ_LIMIT = 4 * MAX_LINE + 1024   # a protocol line: prefix + a cut line after decoding (U+FFFD is 3 bytes)
CUT_MARK = " [podrun: line longer than {limit} bytes cut here; the rest up to its newline is dropped]"
KINDS = frozenset({"out", "err", "part", "ready", "probe", "start", "exit", "error", "prog", "stack", "hb", "note",
                   "stop", "done"})
PART_WAIT_S = 0.2              # how long a worker's unfinished line waits for its end before it is shown as it is
#: the ``stop`` line's why when an agent heard no heartbeat (or nothing) from its controller within its bound
STOP_CONTROLLER_LOST = "controller-lost"
#: the ``stop`` line's why when a signal to the agent itself (not a token of its controller's) ends its workers
STOP_SIGNALLED = "signalled"
LOST_EXIT = 255                # like ssh: the connection to a host was lost (the supervisor's code for its instance)


@dataclass(frozen=True)
class Event:
    """One parsed protocol line. instance is None for raw (non-protocol) lines."""

    instance: int | None
    local_rank: int | None
    kind: str
    text: str


Stamp = float    # a unix time, written to the millisecond


class Message:
    """A protocol line's structured text, its fields in order, separated by a space: an int or str as it is, a float
    as ``{:g}``, a Stamp as ``{:.3f}``, a true bool as its field's name (the word may stand anywhere after the fields
    before it), a false one not at all. ``decode`` gives the fields that are missing at the end their defaults, and
    raises ValueError, IndexError or TypeError on a malformed text; ``read`` gives None for one (a reader goes on)."""

    KIND = ""

    def encode(self) -> str:
        return " ".join(f.name if f.type == "bool" else _WRITE[f.type](getattr(self, f.name))
                        for f in fields(self) if getattr(self, f.name) is not False)

    @classmethod
    def decode(cls, text: str):
        words, fs = text.split(), fields(cls)
        valued = [sum(g.type != "bool" for g in fs[:i]) for i in range(len(fs))]   # words before a bool's own
        return cls(**{f.name: f.name in words[valued[i]:] if f.type == "bool" else _READ[f.type](words[i])
                      for i, f in enumerate(fs) if f.type == "bool" or i < len(words)})

    @classmethod
    def read(cls, text: str):
        try:
            return cls.decode(text)
        except (ValueError, IndexError, TypeError):
            return None


_WRITE = {"int": str, "str": str, "float": "{:g}".format, "Stamp": "{:.3f}".format}
_READ = {"int": int, "str": str, "float": float, "Stamp": float}


class Record(Message):
    """A message whose text is a JSON object of its fields (a None one left out, a nested record as its own object).
    ``decode`` keeps a field that has its annotated type (of a tuple, the items that have theirs) and drops the rest,
    a field left out taking its default; no JSON object, or one without a field that has no default, is a ValueError
    or TypeError (``read``: None)."""

    def to_dict(self) -> dict:
        return {f.name: _plain(v) for f in fields(self) if (v := getattr(self, f.name)) is not None}

    def encode(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), default=float)   # a numpy or torch scalar too

    @classmethod
    def decode(cls, text: str):
        rec = from_json(text)
        if rec is None:
            raise ValueError(f"a {cls.KIND} line is a JSON object")
        return cls.from_dict(rec)

    @classmethod
    def from_dict(cls, rec: dict):
        got = {f.name: _typed(f.type, rec.get(f.name), cls) for f in fields(cls)}
        return cls(**{k: v for k, v in got.items() if v is not _ABSENT})


_ABSENT = object()      # a record's field that is missing or does not have its type


def _plain(value):
    """A record's field as JSON holds it: a tuple as a list, a nested record as its object."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value.to_dict() if hasattr(value, "to_dict") else value


def _typed(kind: str, value, owner: type):
    """``value`` as a field annotated ``kind`` of the record ``owner`` holds it, else _ABSENT: a bool, str, int or
    dict as it is, a number as a float, a list as the tuple of its items that have their type, a dict as the nested
    record type it names (``from_dict``, from the owner's module)."""
    if kind.endswith(" | None"):
        if value is None:
            return None
        kind = kind[:-len(" | None")]
    if kind.startswith("tuple["):
        if not isinstance(value, list):
            return _ABSENT
        items = (_typed(kind[len("tuple["):-len(", ...]")], x, owner) for x in value)
        return tuple(v for v in items if v is not _ABSENT)
    plain = {"bool": bool, "str": str, "int": int, "dict": dict}.get(kind)
    if plain is not None:
        return value if isinstance(value, plain) and (plain is bool or not isinstance(value, bool)) else _ABSENT
    if kind in ("float", "Stamp"):
        return _ABSENT if (number := _number(value)) is None else number
    nested = getattr(sys.modules[owner.__module__], kind).from_dict(value) if isinstance(value, dict) else None
    return _ABSENT if nested is None else nested


@dataclass(frozen=True)
class Ready(Message):
    """``ready``: the agent is up on ``hostname`` as process ``pid``, with ``workers`` workers to run."""

    KIND = "ready"
    hostname: str
    pid: int
    workers: int


@dataclass(frozen=True)
class Start(Message):
    """``start``: a worker was spawned as process ``pid``."""

    KIND = "start"
    pid: int


@dataclass(frozen=True)
class Heartbeat(Message):
    """``hb``: the agent's wall clock."""

    KIND = "hb"
    at: Stamp


EXIT_HANG_S = 10.0   # a worker alive this long after its program returned, using no CPU, is hung at exit


@dataclass(frozen=True)
class WorkerExit(Message):
    """``exit``: a worker ended with return ``code`` at ``at``; ``teardown``: the agent was already ending its workers
    (their exit is no failure of their own); ``hung_at_exit``: the agent ended it, alive and idle EXIT_HANG_S after
    its program returned. A line without the time is stamped when it is read."""

    KIND = "exit"
    code: int
    at: Stamp = field(default_factory=time.time)
    teardown: bool = False
    hung_at_exit: bool = False


@dataclass(frozen=True)
class AgentStop(Message):
    """``stop``: the agent begins ending its workers at ``at``, ``why`` a StopKind value; ``silent_s``: with
    STOP_CONTROLLER_LOST, the seconds it heard nothing from the controller (else 0)."""

    KIND = "stop"
    why: str
    at: Stamp = field(default_factory=time.time)
    silent_s: float = 0.0


@dataclass(frozen=True)
class Done(Message):
    """``done``: the agent is about to exit with ``code`` (no text: 0)."""

    KIND = "done"
    code: int = 0


@dataclass(frozen=True)
class Stacks(Record):
    """``stack``: on an ``S``, one running worker's stacks, as a JSON object: ``procs`` (each process of its tree,
    ``{pid, main, text}``: main its main thread's id, text what faulthandler wrote), ``problem`` (why there is none),
    ``exiting`` (its program has returned), ``cpu`` (its tree's CPU seconds, read before the dump), ``at`` (the
    agent's monotonic clock then) and ``stdin`` (a process of its tree was blocked reading the launcher's stdin then:
    input(), pdb's prompt)."""

    KIND = "stack"
    procs: tuple[dict, ...] = ()
    problem: str | None = None
    exiting: bool = False
    cpu: float | None = None
    at: float | None = None
    stdin: bool = False


@dataclass(frozen=True)
class Part(Message):
    """``part``: the ``state`` of a worker's line not ended yet on its ``stream`` (out, err); ``redraw``: it replaces
    the state shown before (a ``\r`` redraw) rather than extending it."""

    KIND = "part"
    stream: str
    redraw: bool
    state: str

    def encode(self) -> str:
        return f"{self.stream} {'r' if self.redraw else '-'} {self.state}"

    @classmethod
    def decode(cls, text: str) -> "Part":
        stream, flag, state = text.split(" ", 2)
        if stream not in ("out", "err") or flag not in ("r", "-"):
            raise ValueError(f"not a part line: {text[:40]!r}")
        return cls(stream, flag == "r", state)


@dataclass(frozen=True)
class StepSplit:
    """One rank's update step split into its parts, in seconds (a mean over the steps a ``prog`` report covers),
    the ``split`` field of a ``prog`` record: ``input`` waiting for the loader's next batch, ``compute`` forward and
    backward up to the last gradient, ``comm`` the gradient all-reduce not hidden behind compute (from the last
    gradient until the optimiser can step), ``optim`` the optimiser step and zero_grad. ``cpus``: the cores the rank
    may run on; ``loaders``: its loader threads (0: the batch is made in the training thread)."""

    input: float = 0.0
    compute: float = 0.0
    comm: float = 0.0
    optim: float = 0.0
    cpus: int | None = None
    loaders: int | None = None

    @property
    def total(self) -> float:
        return self.input + self.compute + self.comm + self.optim

    def to_dict(self) -> dict:
        out: dict = {k: round(getattr(self, k), 6) for k in SPLIT_PARTS}
        out.update({k: getattr(self, k) for k in ("cpus", "loaders") if getattr(self, k) is not None})
        return out

    @classmethod
    def from_dict(cls, rec) -> "StepSplit | None":
        """A ``split`` field read tolerantly: None unless every part is a finite number >= 0."""
        if not isinstance(rec, dict):
            return None
        parts = [_number(rec.get(k)) for k in SPLIT_PARTS]
        if any(v is None or not v >= 0 or v == float("inf") for v in parts):
            return None
        counts = [rec.get(k) if isinstance(rec.get(k), int) and not isinstance(rec.get(k), bool)
                  and rec.get(k) >= 0 else None for k in ("cpus", "loaders")]
        return cls(*parts, *counts)


@dataclass(frozen=True)
class WorkerError(Record):
    """``error``: a failed worker's @record error file (torch.distributed.elastic), as its agent read it: the
    ``message``, the last lines of its ``traceback`` and the ``file``."""

    KIND = "error"
    message: str
    traceback: tuple[str, ...] = ()
    file: str = ""


PHASES = ("train", "eval", "checkpoint", "setup")   # a progress phase; one other than "train" does not read as a hang


@dataclass(frozen=True)
class Progress(Record):
    """``prog``: a worker's progress report (podrun.runtime.progress), the fields it gave: its ``phase`` (PHASES),
    ``step`` of ``total``, ``epoch``, ``loss``, ``samples_per_sec``, ``step_seconds`` (its last step's),
    ``busy_seconds`` (its own work in that step, without waiting for the other ranks) and ``split`` (a StepSplit)."""

    KIND = "prog"
    phase: str = "train"
    step: int | None = None
    total: int | None = None
    epoch: int | None = None
    loss: float | None = None
    samples_per_sec: float | None = None
    step_seconds: float | None = None
    busy_seconds: float | None = None
    split: StepSplit | None = None


#: the hand-shake's lines, before the protocol's, on an agent's TCP connection to its controller (podrun.wire.join)
JOIN_PREFIX = "@podrun-join "
JOIN_VERSION = 2                # 2: the controller proves the key too, and its arguments carry a MAC


@dataclass(frozen=True)
class JoinChallenge(Message):
    """The controller's first line to an agent that connects: the hand-shake's ``version`` and a fresh ``nonce``
    (hex) that the agent's proof covers, so that a proof seen once is worth nothing again."""

    KIND = "challenge"
    version: int
    nonce: str


@dataclass(frozen=True)
class Join(Message):
    """The agent's answer: it runs ``instance`` of run ``run_id`` on ``hostname`` as process ``pid``; ``proof`` is
    the HMAC of both nonces, the run id and the instance with the run's key (podrun.wire.join.proof): the key never
    travels; ``nonce``: the agent's own fresh nonce, which the controller's proof must cover in turn; ``copy``: the
    controller follows its ``ok`` with a ``JoinArgs``."""

    KIND = "join"
    run_id: str
    instance: int
    hostname: str
    pid: int
    proof: str
    nonce: str = ""
    copy: bool = False          # a copy of `podrun launch` (podrun.launch.copies): it asks for its agent's arguments


@dataclass(frozen=True)
class JoinReply(Message):
    """The controller's verdict: ``ok`` and its own ``proof`` of the key over both nonces, the run id and the
    instance (podrun.wire.join.controller_proof; the protocol follows, both ways), or ``refused`` and why, in
    words (which the agent cannot trust: any listener can say it)."""

    KIND = "joined"
    accepted: bool
    reason: str = ""
    proof: str = ""

    def encode(self) -> str:
        return f"ok {self.proof}".rstrip() if self.accepted else f"refused {self.reason}".rstrip()

    @classmethod
    def decode(cls, text: str) -> "JoinReply":
        verdict, _, rest = text.partition(" ")
        if verdict not in ("ok", "refused"):
            raise ValueError(f"not a join reply: {text[:40]!r}")
        return cls(True, "", rest) if verdict == "ok" else cls(False, rest)


@dataclass(frozen=True)
class JoinArgs(Message):
    """To a copy of `podrun launch` that joined: the agent it becomes, ``argv`` (python -m podrun.host.agent and its
    options, podrun.wire.agent_args) run in ``workdir``; ``mac``: the HMAC of them with the run's key over the
    hand-shake's nonces (podrun.wire.join.args_mac), so that only the controller that proved the key can name
    them; JSON on one line."""

    KIND = "args"
    argv: tuple[str, ...]
    workdir: str
    mac: str = ""

    def body(self) -> str:
        """What the MAC covers: the argv and the workdir, as JSON."""
        return to_json({"argv": list(self.argv), "workdir": self.workdir})

    def encode(self) -> str:
        return to_json({"argv": list(self.argv), "workdir": self.workdir, "mac": self.mac})

    @classmethod
    def decode(cls, text: str) -> "JoinArgs":
        rec = from_json(text)
        argv, workdir, mac = ((rec or {}).get(k) for k in ("argv", "workdir", "mac"))
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv) or not isinstance(workdir, str) \
                or not isinstance(mac, str):
            raise ValueError("an args line is {argv: [str], workdir: str, mac: str}")
        return cls(tuple(argv), workdir, mac)


def join_line(message: Message) -> bytes:
    """A hand-shake message as its line on the connection."""
    return f"{JOIN_PREFIX}{message.KIND} {message.encode()}\n".encode("utf-8", "replace")


def read_join_line(line: bytes, cls):
    """The hand-shake message of type ``cls`` that ``line`` holds, or None for anything else."""
    text = line.decode("utf-8", "replace").rstrip("\r\n")
    kind, _, rest = text[len(JOIN_PREFIX):].partition(" ") if text.startswith(JOIN_PREFIX) else ("", "", "")
    return cls.read(rest) if kind == cls.KIND else None


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def to_json(record: dict) -> str:
    """The text of a JSON line: compact, on one line."""
    return json.dumps(record, separators=(",", ":"))


def from_json(text: str) -> dict | None:
    """The record of a JSON line; None when it is no JSON object."""
    try:
        record = json.loads(text)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def encode(instance: int, local_rank: int | None, kind: str, text: str = "") -> str:
    """One protocol line (without the newline); text must not contain a newline."""
    lr = "-" if local_rank is None else str(local_rank)
    return f"{PREFIX}{instance} {lr} {kind} {text}"


def parse(line: str, stream: str = "out") -> Event:
    """Parse one line (newline stripped); anything malformed is a raw line of ``stream``."""
    if line.startswith(PREFIX):
        parts = line[len(PREFIX):].split(" ", 3)
        if len(parts) >= 3 and parts[2] in KINDS:
            try:
                inst = int(parts[0])
                lr = None if parts[1] == "-" else int(parts[1])
            except ValueError:
                pass
            else:
                return Event(inst, lr, parts[2], parts[3] if len(parts) > 3 else "")
    return Event(None, None, "err" if stream == "err" else "out", line)


def read_done(line: str) -> tuple[int, int | None, Done | None] | None:
    """Of an agent's ``done`` line (newline stripped): its instance, its local rank and its Done (None when its code
    does not read); None for any other line."""
    if not line.startswith(PREFIX) or (ev := parse(line)).kind != Done.KIND:
        return None
    return ev.instance, ev.local_rank, Done.read(ev.text)


def bounded_lines(f, limit: int = MAX_LINE):
    """Yield the lines of binary file ``f`` (``\r\n``/``\n`` stripped), holding at most ``limit`` bytes
    of one in memory. A longer line is yielded cut at ``limit`` bytes with CUT_MARK as soon as that much
    has arrived; its rest is read and dropped, and a line saying how many bytes were dropped follows."""
    lines = LineAssembler(limit)
    while raw := f.readline(limit):
        yield from lines.feed(raw)
    yield from lines.end()


class LineAssembler:
    """The lines of a stream fed in chunks (a worker's datagrams; a file's in ``bounded_lines``): at most
    ``limit`` bytes of one line are held; a longer one is yielded cut with CUT_MARK, and when it ends a line
    says how many bytes were dropped. ``feed`` returns the lines a chunk completed, ``end`` the last partial.
    With ``frames`` (a worker's output) a line redrawn with ``\r`` (a progress bar) is held as its last state only,
    what a terminal shows once it ends, and ``partial`` gives the line not ended yet when it changed."""

    def __init__(self, limit: int = MAX_LINE, frames: bool = False):
        self.limit = limit
        self.frames = frames
        self.buf = bytearray()
        self.dropping: int | None = None     # bytes dropped of the line cut above, until its newline
        self.changed = False                 # the line not ended yet changed since ``partial`` gave it
        self.redrawn = False                 # ... by a ``\r`` redraw since then

    def _dropped(self) -> bytes:
        n, self.dropping = self.dropping, None
        return f"[podrun: dropped {n} more bytes of the line cut above]".encode()

    def _redraw(self) -> None:
        """Keep only the last state of a line redrawn with ``\r`` (trailing ``\r``s wait for what follows)."""
        cut = self.buf.rstrip(b"\r").rfind(b"\r")
        if cut >= 0:
            del self.buf[:cut + 1]
            self.redrawn = True

    def feed(self, data: bytes) -> list[bytes]:
        out: list[bytes] = []
        start = 0
        while start < len(data):
            nl = data.find(b"\n", start)
            stop = len(data) if nl < 0 else nl
            piece = data[start:stop]
            start = len(data) if nl < 0 else nl + 1
            if self.frames and self.dropping is None and (b"\r" in piece or self.buf.endswith(b"\r")):
                self.buf += piece
                piece = b""
                self._redraw()
            if self.dropping is not None:
                self.dropping += len(piece)
            elif len(self.buf) + len(piece) >= self.limit:
                whole = bytes(self.buf) + piece
                self.buf.clear()
                out.append(whole[:self.limit] + CUT_MARK.format(limit=self.limit).encode())
                self.dropping = len(whole) - self.limit
            elif nl >= 0:
                out.append((bytes(self.buf) + piece).rstrip(b"\r"))
                self.buf.clear()
            else:
                self.buf += piece
            self.changed = bool(self.buf) and (self.changed or nl < 0)
            self.redrawn = self.redrawn and self.changed
            if nl >= 0 and self.dropping is not None:
                out.append(self._dropped())
        return out

    def partial(self) -> tuple[str, bool] | None:
        """The line not ended yet when it changed since the last call (else None), as text (a character cut at
        the end waits for the rest), and whether it was redrawn with ``\r`` since."""
        if not self.changed:
            return None
        raw = bytes(self.buf).rstrip(b"\r")
        for cut in range(min(4, len(raw)) + 1):      # a UTF-8 character whose last bytes did not come yet
            try:
                text = raw[:len(raw) - cut].decode("utf-8")
                break
            except UnicodeDecodeError:
                continue
        else:
            text = raw.decode("utf-8", "replace")
        if not text:
            return None
        redrawn, self.changed, self.redrawn = self.redrawn, False, False
        return text, redrawn

    def end(self) -> list[bytes]:
        self.changed = False
        if self.dropping is not None:
            return [self._dropped()]
        if self.buf:
            line = bytes(self.buf).rstrip(b"\r")
            self.buf.clear()
            return [line]
        return []


def exit_code_from_returncode(rc: int) -> int:
    """Popen-style return code -> shell-style exit code (128+signal for a signal)."""
    return 128 - rc if rc < 0 else rc


# -- the run directory's messages to agents that have no stdin (mpirun, srun: they share the run dir) --

def write_request(run_dir: str) -> None:
    """Ask the agents that have no stdin (mpirun, srun: they share the run dir) for stacks: a new token in
    <run_dir>/stacks-request, written whole (a new private file, then a rename)."""
    safefs.write_file(os.path.join(run_dir, STACKS_REQUEST), f"{time.time_ns()}\n", "request file", durable=False)


def read_request(run_dir: str, name: str = STACKS_REQUEST) -> str:
    """The current token of <run_dir>/stacks-request, or of the request file ``name`` ("" when there is none)."""
    try:
        with open(os.path.join(run_dir, name), encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return ""


# -- the controller's bytes on an agent's stdin (or its connection to the controller) ---------------

class Token(bytes, enum.Enum):
    """What the controller's byte on an agent's stdin says (but a stop: STOP_TOKENS): HEARTBEAT that it is alive,
    STACKS to send its workers' stacks (``stack`` lines), GO that a held agent may start its workers."""

    HEARTBEAT = b"."
    STACKS = b"S"
    GO = b"G"


# -- how the controller asks an agent to end its workers with a signal ------------------------------

#: the controller's byte on an agent's stdin that ends its workers, by the signal they get first: T is the
#: controller's own teardown (SIGTERM; also a SIGTERM podrun received), I, H and U relay podrun's SIGINT
#: (Ctrl-C), SIGHUP and SIGUSR1, as torchrun passes on the signal it received
STOP_TOKENS = {b"T": "SIGTERM", b"I": "SIGINT", b"H": "SIGHUP", b"U": "SIGUSR1"}
#: after a SIGINT, SIGHUP or SIGUSR1 stop the agent sends SIGTERM at --interrupt-grace (for what outlives the first
#: signal) and SIGKILL this many seconds later; after a SIGTERM stop, SIGKILL at --grace
TERM_TO_KILL_S = 1.0


def stop_token(sig: int) -> bytes:
    """The stdin byte asking an agent to end its workers with ``sig`` first (T for any other signal)."""
    name = signal.Signals(sig).name
    return next((tok for tok, n in STOP_TOKENS.items() if n == name), b"T")


def write_stop(run_dir: str, sig: int) -> None:
    """Ask the agents that have no stdin (mpirun, srun) to end their workers with ``sig`` first: its name and
    a new token in <run_dir>/stop-request, written whole (a new private file, then a rename); an agent acts on
    a token it did not see at its start (an earlier attempt's request in the same run dir is no request)."""
    safefs.write_file(os.path.join(run_dir, STOP_REQUEST), f"{signal.Signals(sig).name} {time.time_ns()}\n",
                      "request file", durable=False)


def read_stop(run_dir: str) -> tuple[str, int | None]:
    """(the token of <run_dir>/stop-request, "" when there is none; the signal it names, one of STOP_TOKENS',
    else None)."""
    text = read_request(run_dir, STOP_REQUEST)
    name = text.partition(" ")[0]
    return text, int(getattr(signal, name)) if name in STOP_TOKENS.values() else None
