"""The controller's hearing: the agents' lines to its loop parsed once, heartbeats out, when each was last heard
(the controller's own waits taken out), and which hosts are silent past their bound."""
from __future__ import annotations

import contextlib
import functools
import queue
import threading
import time
from dataclasses import dataclass, field

from podrun.launch.transports.base import InstanceHandle
from podrun.wire import protocol
from podrun.wire.liveness import FIRST_HEARTBEAT_S, Liveness

QUEUED = 256              # protocol lines waiting for the supervisor (bounded: memory stays flat)
_HUB_READER = "the line hub"   # the reader of every handle the hub reads, for the waits on a full queue (Hearing)
STALL_S = 1.0              # a gap between two turns of the controller's loop beyond this is its own stall, not silence
SCAN_SHARE = 5             # the controller looks at every host's silence each period / SCAN_SHARE (at most every 0.1 s)


class Every:
    """Whether a periodic duty is due: ``due(now)`` is true at most once per ``seconds``."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.next = 0.0

    def due(self, now: float) -> bool:
        if now < self.next:
            return False
        self.next = now + self.seconds
        return True


def scan_every(live: Liveness) -> float:
    """How often the controller looks at every host's silence: a fifth of the period, at least 0.1 s (the lines
    that come between cost nothing per host)."""
    return max(0.1, live.period / SCAN_SHARE)


@dataclass(frozen=True)
class Heard:
    """One item for the controller's loop: a line of ``handle``, parsed once (``event`` None: the handle's end, with
    ``silences``: each of its instances' silence then, None for one never heard); ``at``: the wall time it was
    heard (a connection's end is dated when it ended, not when the loop came to it)."""

    handle: InstanceHandle
    event: protocol.Event | None               # its kind says the stream of a line that is not the protocol's
    silences: dict = field(default_factory=dict)
    at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class Silent:
    """An instance silent past its bound: ``heard`` False when it was never heard (its bound is the first one)."""

    instance: int
    seconds: float
    limit: float
    heard: bool


class Hearing:
    """What the readers heard, per instance; thread-safe. ``key`` names a reader: a handle's own thread, or the line hub
    that reads many handles (podrun.launch.supervisor); ``end`` and ``silence`` take the handle."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.lock = threading.Lock()
        self.waited: dict[object, float] = {}        # reader -> seconds it spent waiting on the full queue
        self.waiting: dict[object, float] = {}       # reader -> since when it waits now
        self.ended: set = set()                      # readers whose stream ended (their end is queued)
        self.last: dict[int, tuple[float, object, float, float]] = {}   # instance -> (when, reader, its waited then,
        #                                                                  the controller's stalls then)
        self.gap: dict[int, float] = {}             # instance -> the largest silence between two of its lines
        self.stalled = 0.0                          # seconds the controller's own loop did not run (``stall``)

    def _waited(self, key, now: float) -> float:
        since = self.waiting.get(key)
        return self.waited.get(key, 0.0) + (now - since if since is not None else 0.0)

    def _silence(self, instance: int, now: float) -> float | None:
        got = self.last.get(instance)
        if got is None:
            return None
        when, key, waited, stalled = got
        return max(0.0, now - when - (self._waited(key, now) - waited) - (self.stalled - stalled))

    def heard(self, key, instance: int) -> None:
        """A line of ``instance`` came from reader ``key``."""
        with self.lock:
            now = self.clock()
            gap = self._silence(instance, now)
            if gap is not None and gap > self.gap.get(instance, 0.0):
                self.gap[instance] = gap
            self.last[instance] = (now, key, self._waited(key, now), self.stalled)

    def stall(self, seconds: float) -> None:
        """The controller's loop did not run for ``seconds`` more than it should (a starved or stopped machine):
        nobody listened then, so that time counts in no instance's silence."""
        with self.lock:
            self.stalled += seconds

    def wait_begins(self, key) -> None:
        with self.lock:
            self.waiting[key] = self.clock()

    def wait_ends(self, key) -> None:
        with self.lock:
            since = self.waiting.pop(key, None)
            if since is not None:
                self.waited[key] = self.waited.get(key, 0.0) + self.clock() - since

    def end(self, key) -> None:
        with self.lock:
            self.ended.add(key)

    def silence(self, instance: int, key) -> float | None:
        """Seconds since ``instance`` was last heard, less the time its reader waited on the controller since;
        None when it was never heard, 0.0 when its reader ``key`` has ended (the end says the rest)."""
        with self.lock:
            if key in self.ended:
                return 0.0
            return self._silence(instance, self.clock())

    def silent_for(self, instance: int) -> float | None:
        """Seconds since ``instance`` was last heard (its reader's waits taken out), whether or not its reader has
        ended: how long a host whose connection just closed had been silent (None: never heard)."""
        with self.lock:
            return self._silence(instance, self.clock())

    def gaps(self) -> dict[int, float]:
        """Each instance's largest silence between two of its lines so far (an instance with fewer than two lines
        is not in it)."""
        with self.lock:
            return dict(self.gap)


class Listener:
    """The Supervisor's part that hears the agents: their lines on the way to its loop through one bounded queue,
    fed by the line hub's thread or by a thread per handle the hub does not read, noting when each instance was
    last heard; and a heartbeat to every open agent each ``heartbeat_s`` from a thread of its own."""

    def __init__(self, live: Liveness):
        self.live = live
        self.hearing = Hearing()                 # when each instance was last heard, less the controller's own waits
        self.q: queue.Queue = queue.Queue(maxsize=QUEUED)   # Heard items
        self.done = threading.Event()            # the loop ended
        self.handles: tuple[InstanceHandle, ...] = ()   # the open handles, that get heartbeats
        self.scan = Every(scan_every(live))      # when the loop next looks at every host's silence
        self.started = 0.0                       # when the agents were started (monotonic)
        self.stalled_at_start = 0.0              # the hearing's stalls then

    def start(self, handles: list[InstanceHandle]) -> None:
        self.started, self.stalled_at_start = time.monotonic(), self.hearing.stalled
        self.handles = tuple(handles)
        threading.Thread(target=self._heartbeats, daemon=True).start()
        for h in handles:
            if not h.push(functools.partial(self._pushed, h)):
                threading.Thread(target=self._reader, args=(h,), daemon=True).start()

    def _reader(self, h: InstanceHandle) -> None:
        """h's lines in a thread of its own (a handle the line hub does not read: paramiko, mpirun, srun)."""
        try:
            for stream, line in h.lines():
                self._take(h, h, stream, line)
        finally:
            self._ended(h)

    def _pushed(self, h: InstanceHandle, stream: str | None, line: str | None) -> None:
        """h's lines from the line hub's thread, which reads every such handle (podrun.launch.transports.linehub)."""
        if stream is None:
            self._ended(h)
        else:
            self._take(h, _HUB_READER, stream, line)

    def _take(self, h: InstanceHandle, reader: object, stream: str, line: str) -> None:
        """Move one of h's lines to the supervisor's bounded queue, noting when its instance was last heard from
        and how long ``reader`` (a thread that reads h, or the hub's) waited on a full queue (a slow console or disk
        holds the supervisor back, not the host: that wait does not count as the host's silence)."""
        ev = protocol.parse(line, stream)
        if ev.instance is not None:
            self.hearing.heard(reader, ev.instance)
        self.hearing.wait_begins(reader)
        self._put(Heard(h, ev))
        self.hearing.wait_ends(reader)

    def _ended(self, h: InstanceHandle) -> None:
        self.hearing.end(h)             # its end is queued: nothing more to hear
        self._put(Heard(h, None, {i: self.hearing.silent_for(i) for i in h.instances}))

    def next(self, timeout: float) -> Heard | None:
        """The next item for the loop, or None when none came within ``timeout`` seconds."""
        try:
            return self.q.get(timeout=timeout)
        except queue.Empty:
            return None

    def silent(self, now: float, alive: list[int], carrier: dict) -> list[Silent]:
        """The instances of ``alive`` silent past their bound now (looked at once per scan period, else []): past the
        keepalive since last heard, or, never heard, past the first bound since the start (the fan-out, a slow
        python); an agent that is a busy process of this machine (``busy_here``) is starved, not lost.
        ``carrier``: instance -> the handle that reads it."""
        if not self.scan.due(now):
            return []
        out = []
        for i in alive:
            silent = self.hearing.silence(i, carrier.get(i))
            if silent is not None and silent > self.live.bound:
                if carrier.get(i) is not None and carrier[i].busy_here():   # starved here, not lost
                    continue
                out.append(Silent(i, silent, self.live.bound, True))
            elif silent is None:
                since = now - self.started - (self.hearing.stalled - self.stalled_at_start)
                first = max(self.live.bound, FIRST_HEARTBEAT_S)
                if since > first:
                    out.append(Silent(i, since, first, False))
        return out

    def _put(self, item: Heard) -> None:
        """Queue an item for the loop, waiting while the queue is full, but not once the loop has ended: a handle
        it let go (a lost host, one it killed) may still have lines, and the hub that reads them serves the
        next attempt too."""
        while not self.done.is_set():
            with contextlib.suppress(queue.Full):
                self.q.put(item, timeout=0.2)
                return

    def _heartbeats(self) -> None:
        """A byte to every open agent each heartbeat period, from its own thread: the agents keep their
        controller even while the supervisor waits on a slow console."""
        while not self.done.wait(self.live.period):
            for h in self.handles:
                h.heartbeat()
