"""Agents that join over loopback: the hand-shake's refusals (wrong key, another run, twice, no such instance), each
one line and counted, and an instance that never joins, named after the join window (podrun.launch.transports.join)."""
from __future__ import annotations

import threading

import pytest

from podrun.launch.transports.join import JoinServer
from podrun.wire import join, protocol

KEY = "k" * 32


def _collect(handle):
    lines, ended = [], threading.Event()

    def take(stream, line):
        if stream is None:
            ended.set()
        else:
            lines.append(line)
    handle.push(take)
    return lines, ended


@pytest.fixture()
def server():
    s = JoinServer("run-a", KEY, {0: "h0", 1: "h1", 2: "h2"}, advertise="127.0.0.1", window=1.5)
    yield s
    s.close()


def test_an_agent_that_proves_the_key_joins_and_the_rest_are_refused_in_one_line_each(server):
    lines, ended = _collect(server.handles[0])
    conn, _ = join.join(server.address, KEY, "run-a", 0, 5.0)
    conn.sendall((protocol.encode(0, None, "hb", "1.000") + "\n").encode())
    conn.sendall((protocol.encode(0, None, "done", "0") + "\n").encode())
    conn.close()
    assert ended.wait(5) and lines == ["@podrun 0 - hb 1.000", "@podrun 0 - done 0"]
    assert server.handles[0].wait(1) == 0
    refusals = {  # (key, run, instance) -> the words its one line has
        ("w" * 32, "run-a", 1): "does not match this run's key",
        (KEY, "run-b", 1): "joins run run-b, this is run run-a",
        (KEY, "run-a", 0): "has joined already",
        (KEY, "run-a", 7): "has instances 0-2",
    }
    for (key, run, inst), words in refusals.items():
        with pytest.raises(join.JoinError) as exc:
            join.join(server.address, key, run, inst, 5.0)
        assert f"refused instance {inst}" in str(exc.value) and words in str(exc.value)
        assert "\n" not in str(exc.value) and key not in str(exc.value)
    assert server.record()["refused"] == {"wrong-key": 1, "other-run": 1, "no-such-instance": 1, "joined-already": 1}
    assert server.record()["joined"] == 1 and len(server.refusal_lines) == 4


def test_an_instance_that_never_joins_is_named_after_the_window_and_a_late_one_is_refused(server):
    lines, ended = _collect(server.handles[2])
    assert ended.wait(10)
    assert server.handles[2].wait(0) is None        # no done: a lost host
    assert "instance 2 (host h2) did not join within the join window of 1.5 s" in server.handles[2].lost_why
    assert lines == [f"podrun: {server.handles[2].lost_why}"]
    with pytest.raises(join.JoinError, match="has joined already"):
        join.join(server.address, KEY, "run-a", 2, 5.0)


def test_an_agent_names_the_address_it_cannot_reach_and_a_short_key_is_no_key():
    with pytest.raises(join.JoinError, match=r"cannot join the controller at 127.0.0.1:1 within 0.5 s"):
        join.join("127.0.0.1:1", KEY, "r", 0, 0.5)
    assert join.key_problem(None) == "PODRUN_JOIN_KEY is not set"
    assert "at least 16" in join.key_problem("short") and join.key_problem(join.new_key()) is None
    assert join.parse_address("[::1]:5") == ("::1", 5) and join.parse_address("node1") == ("node1", None)
    with pytest.raises(ValueError):
        join.parse_address("node1:x")
