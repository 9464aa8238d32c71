"""click parameter types for numbers: each checks a range at the option and says why a value is refused."""
from __future__ import annotations

import math
import re

import click

from podrun.specs.limits import MAX_BATCH, MAX_HOSTS, MAX_PER_HOST, MAX_RESTARTS, MAX_SECONDS

_INT = re.compile(r"[+-]?[0-9]{1,40}")
# a decimal number in ASCII (float() alone also takes other scripts' digits, '1_000', 'nan' and 'inf')
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def ascii_number(value) -> float | None:
    """``value`` as a float when it is a decimal number written in ASCII digits (or already a number); else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    if len(text) > 64 or not _NUMBER.fullmatch(text):
        return None
    return float(text)


class BoundedInt(click.ParamType):
    """An integer in [minimum, maximum]; ``why`` says what the bounds mean."""

    name = "integer"

    def __init__(self, minimum: int, maximum: int, why: str):
        self.minimum, self.maximum, self.why = minimum, maximum, why

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool):
            n = value
        else:
            text = str(value).strip()
            if not _INT.fullmatch(text):
                self.fail(f"{_short(value)} is not an integer ({self.why})", param, ctx)
            n = int(text)
        if not self.minimum <= n <= self.maximum:
            self.fail(f"{n if abs(n) < 10 ** 12 else f'{n:.3g}'} is outside {self.minimum}..{self.maximum}: "
                      f"{self.why}", param, ctx)
        return n

    def __repr__(self) -> str:
        return f"BoundedInt({self.minimum}, {self.maximum})"


class BoundedFloat(click.ParamType):
    """A finite number in [minimum, maximum] (above ``minimum`` with ``above``) written in ASCII digits: NaN and
    the infinities are refused, however written; ``why`` says what the bounds mean. Every float option takes one."""

    name = "number"
    noun, unit = "a number", ""

    def __init__(self, minimum: float, maximum: float, why: str, *, above: bool = False):
        self.minimum, self.maximum, self.why, self.above = minimum, maximum, why, above

    def convert(self, value, param, ctx):
        x = ascii_number(value)
        if x is None:
            self.fail(f"{_short(value)} is not {self.noun} ({self.why})", param, ctx)
        low = f"{'more than' if self.above else 'at least'} {self.minimum:g}"
        if not math.isfinite(x) or x < self.minimum or (self.above and x == self.minimum) or x > self.maximum:
            self.fail(f"{_short(value)}{self.unit}: must be finite, {low} and at most {self.maximum:g} ({self.why})",
                      param, ctx)
        return x

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.minimum}, {self.maximum})"


class Seconds(BoundedFloat):
    """A finite duration in seconds, >= 0 (or > 0 with ``positive``), at most MAX_SECONDS."""

    name = "seconds"
    noun, unit = "a number of seconds", " seconds"

    def __init__(self, why: str, *, positive: bool = False):
        super().__init__(0.0, MAX_SECONDS, why, above=positive)


def _short(value) -> str:
    r = repr(value)
    return r if len(r) <= 40 else r[:37] + "..."


# --- the option types podrun's commands share -------------------------------------------------

PORT = BoundedInt(0, 65535, "a TCP port is 1..65535; 0 means podrun picks a free port")
POD_SIZE = BoundedInt(1, 256, "IPU-PODs come in 16, 64, 128 and 256 IPUs")
NODES = BoundedInt(1, MAX_HOSTS, f"a plan needs at least one host, and at most {MAX_HOSTS}")
BATCH = BoundedInt(1, MAX_BATCH, f"a batch holds at least one sample; more than {MAX_BATCH} (2**24) is a typo")
GRAD_ACCUM = BoundedInt(1, MAX_BATCH, f"GA counts micro batches per weight update, at least 1, at most {MAX_BATCH}")
PER_HOST = BoundedInt(1, MAX_PER_HOST, f"a host runs at least one, and at most {MAX_PER_HOST}")
INSTANCE_INDEX = BoundedInt(0, MAX_HOSTS * MAX_PER_HOST, "instances are numbered from 0")
RESTARTS = BoundedInt(0, MAX_RESTARTS, f"0 means no restart; at most {MAX_RESTARTS}")
CONCURRENCY = BoundedInt(1, MAX_HOSTS, f"at least one handshake must be in flight; at most {MAX_HOSTS}")
CPUS = BoundedInt(1, 1 << 20, "a node has at least one CPU")
GRACE = Seconds("seconds between SIGTERM and SIGKILL; 0 kills at once")
KEEPALIVE = Seconds("seconds without a heartbeat before a host counts as lost", positive=True)
JOIN_WINDOW = Seconds("seconds an agent that joins has to join before its host counts as lost", positive=True)
HEARTBEAT = Seconds("seconds between two heartbeats, both ways", positive=True)
MISSES = BoundedInt(1, 10 ** 6, "heartbeats missed in a row before a host counts as lost; at least 1")
POLL = Seconds("seconds between scheduler queries; 0 would query without pause", positive=True)
TIMEOUT = Seconds("seconds to wait; 0 does not wait")
NUM_ILDS = BoundedInt(1, 1024, "an IPU-POD has at least one IPU-Link domain")
STRAGGLER = Seconds("seconds the other workers may run on after one exited 0", positive=True)
DEVICE_MEMORY_GB = BoundedFloat(0, 1e6, "GB of one device's memory", above=True)
AGE_DAYS = BoundedFloat(0, 1e5, "days")
