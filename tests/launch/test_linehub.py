"""The line hub (podrun.launch.transports.linehub) and StreamMerger over it: real pipes and real processes.

One thread reads every agent's pipes: lines come whole and in each stream's order, a long line is cut as
bounded_lines cuts it, a merger whose consumer stops taking lines leaves its pipe unread (the writer blocks, the
controller's memory stays bounded) while the other pipes keep flowing, and ``push`` hands over exactly the lines
not yet taken, in order, then one end."""
from __future__ import annotations

import io
import os
import queue
import subprocess
import sys
import threading

import pytest

from podrun.launch.transports import linehub
from podrun.launch.transports.base import StreamMerger
from podrun.wire.protocol import READ_LIMIT, bounded_lines


def _writer(script: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_many_processes_lines_come_whole_and_in_order_from_one_thread():
    before = threading.active_count()
    procs = [_writer(f"import sys\nfor i in range(300):\n    print('p{k}', i, 'x' * (i % 97))\n"
                     f"    print('e{k}', i, file=sys.stderr)\n") for k in range(24)]
    mergers = [StreamMerger(p.stdout, p.stderr) for p in procs]
    assert threading.active_count() <= before + 1          # the hub's thread at most, no thread per pipe
    for k, (p, m) in enumerate(zip(procs, mergers)):
        got = list(m)
        out = [line for s, line in got if s == "out"]
        err = [line for s, line in got if s == "err"]
        assert out == [f"p{k} {i} " + "x" * (i % 97) for i in range(300)]
        assert err == [f"e{k} {i}" for i in range(300)]
        assert p.wait(10) == 0


@pytest.mark.parametrize("size", [READ_LIMIT - 1, READ_LIMIT, READ_LIMIT + 1, 3 * READ_LIMIT + 5])
def test_a_long_line_is_cut_as_bounded_lines_cuts_it(size):
    data = b"a" * size + b"\nnext\n" + b"b" * 10        # the last line has no newline
    r, w = os.pipe()
    m = StreamMerger(os.fdopen(r, "rb"), None)
    threading.Thread(target=lambda: (os.write(w, data), os.close(w)), daemon=True).start()
    want = [raw.decode() for raw in bounded_lines(io.BytesIO(data), READ_LIMIT)]
    assert [line for _, line in m] == want


def test_a_consumer_that_stops_taking_lines_holds_its_writer_back_not_the_others():
    """The pipe of a merger nobody reads is left unread once QUEUED lines wait: its writer blocks (it cannot finish
    writing 20 MiB), while another process's lines keep coming through the same hub."""
    stuck = _writer("import sys\nfor i in range(200000):\n    print('y' * 100)\nprint('wrote all', file=sys.stderr)\n")
    m_stuck = StreamMerger(stuck.stdout, stuck.stderr)
    first = m_stuck.next(timeout=20)
    assert first == ("out", "y" * 100)
    other = _writer("for i in range(2000):\n    print(i)\n")
    m_other = StreamMerger(other.stdout, other.stderr)
    assert [line for _, line in m_other] == [str(i) for i in range(2000)]
    assert stuck.poll() is None                                   # still blocked on its full pipe
    assert len(m_stuck._items) <= StreamMerger.QUEUED + 65536 // 101 + 1   # at most one read past the bound
    rest = sum(1 for s, _ in m_stuck if s == "out")                # taking lines lets it go on
    assert rest == 200000 - 1
    assert stuck.wait(20) == 0


def test_push_hands_over_the_lines_not_taken_then_the_rest_then_one_end():
    p = _writer("import sys, time\nfor i in range(200):\n    print(i, flush=True)\n"
                "sys.stdin.readline()\nfor i in range(200, 400):\n    print(i)\n")
    p.stdin = None
    m = StreamMerger(p.stdout, p.stderr)
    taken = [m.next(timeout=20)[1] for _ in range(50)]
    got: queue.Queue = queue.Queue()
    early = [("out", "early")]
    assert m.push(lambda s, line: got.put((s, line)), first=early)
    items = []
    while True:
        item = got.get(timeout=20)
        items.append(item)
        if item == (None, None):
            break
    assert taken == [str(i) for i in range(50)]
    assert items[0] == ("out", "early")
    assert [line for _, line in items[1:-1]] == [str(i) for i in range(50, 400)]
    assert items.count((None, None)) == 1
    assert p.wait(10) == 0


def test_push_after_both_streams_ended_still_ends_once():
    p = _writer("print('only')")
    m = StreamMerger(p.stdout, p.stderr)
    assert p.wait(10) == 0
    got: queue.Queue = queue.Queue()
    assert m.push(lambda s, line: got.put((s, line)))
    assert got.get(timeout=10) == ("out", "only")
    assert got.get(timeout=10) == (None, None)


def test_a_file_that_is_no_pipe_is_read_by_a_thread_and_push_declines():
    m = StreamMerger(io.BytesIO(b"one\ntwo\n"), None)
    assert not m.push(lambda s, line: None)
    assert list(m) == [("out", "one"), ("out", "two")]


def test_a_callback_that_raises_ends_its_source_and_the_hub_serves_the_others():
    r, w = os.pipe()
    ended = threading.Event()

    def bad(line):
        raise RuntimeError("owner bug")

    linehub.hub().add(r, bad, ended.set)
    os.write(w, b"boom\n")
    assert ended.wait(10)
    os.close(w)
    os.close(r)
    p = _writer("print('still served')")
    assert list(StreamMerger(p.stdout, p.stderr)) == [("out", "still served")]
    p.wait(10)


def test_a_merger_closed_before_its_pipes_end_leaves_the_hub_no_stale_descriptor():
    """A handle's close (a lost host's, a killed one's) comes before its pipes end: the hub stops reading them and
    only then are they closed, so the next pipe, which gets the same descriptor number, is read."""
    for _ in range(5):
        r, w = os.pipe()
        m = StreamMerger(os.fdopen(r, "rb"), None)
        got: queue.Queue = queue.Queue()
        assert m.push(lambda s, line: got.put((s, line)))
        os.write(w, b"before\n")
        assert got.get(timeout=10) == ("out", "before")
        m.close()
        assert got.get(timeout=10) == (None, None)          # the end, once
        os.close(w)
        p = _writer("print('next pipe')")                   # its pipes take the numbers just freed
        assert list(StreamMerger(p.stdout, p.stderr)) == [("out", "next pipe")]
        assert p.wait(10) == 0


def test_a_supervisor_that_has_ended_never_holds_the_hub():
    """Lines of a handle the supervisor let go (a lost host's, a killed one's) may come after its loop ended, from
    the hub's thread, which the next attempt's supervisor needs: they are dropped, not waited on forever."""
    from podrun.launch.listener import Listener
    from podrun.wire.liveness import Liveness

    sup = Listener(Liveness(1.0, 4.0))   # the supervisor's part that _put belongs to: its queue and its end
    sup.q = queue.Queue(maxsize=1)
    sup.q.put("the loop never took this")
    t = threading.Thread(target=sup._put, args=(("h", "out", "late"),), daemon=True)
    t.start()
    t.join(0.5)
    assert t.is_alive()                           # a live supervisor's full queue holds the reader back
    sup.done.set()
    t.join(5)
    assert not t.is_alive()


def test_a_descriptor_the_selector_refuses_ends_its_source_at_once(tmp_path):
    """epoll refuses a regular file: the source ends (its owner sees the end) instead of waiting for ever."""
    f = open(tmp_path / "plain", "wb+")
    ended = threading.Event()
    linehub.hub().add(f.fileno(), lambda line: None, ended.set)
    try:
        assert ended.wait(10)
    finally:
        f.close()
