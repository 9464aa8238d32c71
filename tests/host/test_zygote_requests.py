"""A host's zygote reads each request (podrun.host.zygote._recv_request) over a real Unix socket pair: the
descriptors a request brings are kept only by a well-formed fork request; a lease, a QUIT and every malformed
request leave none of them open in the zygote (a leak would grow with each bad request a local user sends)."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import struct

import pytest

from podrun.host import zygote
from podrun.host.zygote_client import LEASE, QUIT


def _open_fds() -> set[int]:
    """This process's open descriptors below 1024 (fstat opens none, as a listing of /proc/self/fd would)."""
    open_now = set()
    for fd in range(1024):
        with contextlib.suppress(OSError):
            os.fstat(fd)
            open_now.add(fd)
    return open_now


def _framed(body: bytes) -> bytes:
    return struct.pack("!I", len(body)) + body


CASES = {
    "short": (b"\x00\x01", ValueError),
    "lease": (LEASE, None),
    "quit": (QUIT, None),
    "too large": (struct.pack("!I", zygote.MAX_REQUEST + 1), ValueError),
    "not json": (_framed(b"{not json"), ValueError),
    "descriptors missing": (_framed(json.dumps({"fds": ["stdout", "stderr"]}).encode()), ValueError),
    "cut short": (struct.pack("!I", 100) + b"{", ValueError),
}


@pytest.mark.parametrize("case", CASES)
def test_a_request_that_is_not_a_fork_leaves_no_descriptor_open(case):
    data, raised = CASES[case]
    ours, theirs = socket.socketpair()
    r, w = os.pipe()
    try:
        before = _open_fds()
        socket.send_fds(theirs, [data], [r])
        theirs.shutdown(socket.SHUT_WR)       # a request cut short ends here
        if raised is None:
            req, fds = zygote._recv_request(ours)
            assert fds == [] and (req is None) == (case == "lease")
        else:
            with pytest.raises(raised):
                zygote._recv_request(ours)
        assert _open_fds() == before
    finally:
        for fd in (r, w):
            os.close(fd)
        ours.close()
        theirs.close()


def test_a_fork_request_keeps_its_descriptors():
    ours, theirs = socket.socketpair()
    r, w = os.pipe()
    try:
        before = _open_fds()
        socket.send_fds(theirs, [_framed(json.dumps({"fds": ["stdout"]}).encode())], [r])
        req, fds = zygote._recv_request(ours)
        assert req == {"fds": ["stdout"]} and len(fds) == 1 and _open_fds() == before | set(fds)
        os.close(fds[0])
    finally:
        for fd in (r, w):
            os.close(fd)
        ours.close()
        theirs.close()
