"""The control socket's messages (podrun.launch.control): a request (``Ask``) and its reply, each one JSON line."""
from __future__ import annotations

import json
from dataclasses import dataclass

STACKS = "stacks"                    # the running workers' merged stacks (podrun stack)
MAX_REPLY_BYTES = 16 * 1024 * 1024   # of a reply (the stacks of thousands of ranks are some MiB)
MAX_REPLY_DEPTH = 32                 # JSON nesting of a reply (a stacks reply nests 4 deep)


@dataclass(frozen=True)
class Ask:
    """A request: ``what`` the controller is to answer (STACKS, or a live view's own: podrun.live.state.STATE_ASK);
    ``parse(a.to_line()) == a``."""

    what: str

    def to_line(self) -> bytes:
        return json.dumps({"ask": self.what}).encode() + b"\n"

    @classmethod
    def parse(cls, data: bytes) -> "Ask":
        """The request ``data`` holds; ValueError for one that is no JSON object with a string ``ask``."""
        rec = json.loads(data or b"{}")
        if not isinstance(rec, dict) or not isinstance(rec.get("ask"), str):
            raise ValueError("a request is a JSON object with a string ask")
        return cls(rec["ask"])


def reply_line(reply: dict) -> bytes:
    return json.dumps(reply, default=str).encode() + b"\n"


def read_reply(data: bytes):
    """A reply (its reader bounds it to MAX_REPLY_BYTES), parsed (any shape: the caller checks it); ValueError for
    one nested deeper than MAX_REPLY_DEPTH, or not JSON."""
    too_deep = ValueError(f"a reply nested more than {MAX_REPLY_DEPTH} deep")
    try:
        reply = json.loads(data)
    except RecursionError:
        raise too_deep from None
    todo = [(reply, 0)]
    while todo:
        value, depth = todo.pop()
        if isinstance(value, (dict, list)):
            if depth == MAX_REPLY_DEPTH:
                raise too_deep
            todo += [(v, depth + 1) for v in (value.values() if isinstance(value, dict) else value)]
    return reply
