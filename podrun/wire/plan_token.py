"""The controller's new plan for an agent's workers on its stdin (in-place recovery): ``P<gen>,<rank>,<world>,<local
batch>,<GA>;``, digits and commas only, so that no byte of it is another token (podrun.wire.protocol)."""
from __future__ import annotations

from dataclasses import astuple, dataclass

MAX_FRAME = 64


@dataclass(frozen=True)
class PlanToken:
    """A new plan for one instance: the group's generation, the instance's first rank and the world, its share."""

    generation: int
    first_rank: int
    world: int
    local_batch: int
    grad_accum: int

    def encode(self) -> bytes:
        return b"P" + ",".join(str(int(v)) for v in astuple(self)).encode() + b";"


class PlanFrames:
    """Reads PlanTokens out of the bytes an agent reads from its stdin, whatever pieces they come in."""

    def __init__(self):
        self.buf = b""

    def feed(self, data: bytes) -> list[PlanToken]:
        if not self.buf and b"P" not in data:
            return []
        self.buf += data
        out = []
        while True:
            start = self.buf.find(b"P")
            if start < 0:
                self.buf = b""
                return out
            end = self.buf.find(b";", start)
            if end < 0:
                self.buf = self.buf[start:start + MAX_FRAME]
                return out
            fields = self.buf[start + 1:end].split(b",")
            self.buf = self.buf[end + 1:]
            if len(fields) == 5 and all(f.isdigit() for f in fields):
                out.append(PlanToken(*(int(f) for f in fields)))
