"""The contracts between processes (podrun.wire): each written once, read back as it was written."""
from __future__ import annotations

import string

import pytest
from hypothesis import given, strategies as st

from podrun import pystart
from podrun.launch.request import LaunchRequest
from podrun.wire import protocol
from podrun.wire.agent_args import AGENT_MODULE, AgentArgs, CpuBind, FromEnv, RunAttempt
from podrun.wire.control import STACKS, Ask

_TEXT = st.text(string.ascii_letters + string.digits + "/._-= ", min_size=1).filter(lambda t: not t.startswith("-"))
_WORD = st.text(string.ascii_letters + string.digits + "._-", min_size=1).filter(lambda t: not t.startswith("-"))
_FD = st.none() | st.integers(0, 1 << 20)
# what the agent's command line writes back exactly: a float as an int when it is whole, else its repr
_SECONDS = st.integers(0, 10 ** 6) | st.floats(0, 1e6, allow_nan=False, allow_infinity=False)
_STAMP = st.integers(0, 4 * 10 ** 12).map(lambda n: n / 1000)         # a unix time to the millisecond
_SHORT = st.integers(0, 39999).map(lambda n: n / 4)                  # what {:g} writes whole (6 digits)

_ATTEMPT = st.builds(RunAttempt, _TEXT, _TEXT, _TEXT, _WORD, st.integers(0, 65535), st.integers(0, 1000),
                     st.integers(0, 1000))
_COMMAND = st.lists(st.sampled_from(["--", "-", "-x", "--flag", "--plan", "a b", "", "python", "-m", "é"])
                    | st.text(max_size=8), min_size=1).map(tuple)
_CORES = st.lists(st.integers(0, 4095), min_size=1, max_size=6).map(lambda c: tuple(sorted(set(c))))
_CPU_BIND = st.sampled_from([CpuBind(), CpuBind("auto")]) | st.builds(
    CpuBind, st.just("list"), st.lists(_CORES, min_size=1, max_size=4).map(tuple))
_ARGS = st.builds(AgentArgs, _ATTEMPT, st.integers(0, 10 ** 4) | st.sampled_from(list(FromEnv)), _COMMAND,
                  grace=_SECONDS, heartbeat=_SECONDS, stdin_timeout=st.none() | _SECONDS, agent_store=st.booleans(),
                  listen_fd=_FD, warm=st.booleans(), hold=st.booleans(),
                  needs=st.lists(st.from_regex(r"[a-z_][a-z0-9_.]{0,12}", fullmatch=True), max_size=4).map(tuple),
                  env_stdin=st.booleans(), worker_stdin_fd=_FD, cpu_bind=_CPU_BIND,
                  join=st.none() | _WORD, join_fd=_FD)


@given(_ARGS)
def test_the_agents_arguments_read_back_as_written(args):
    assert AgentArgs.parse(args.to_argv()) == args


def test_the_agents_arguments_at_their_edges():
    bare = AgentArgs(RunAttempt("r", "/r", "/r/plan.json", "h", 0), 0, ("--", "--instance", "1"))
    assert AgentArgs.parse(bare.to_argv()) == bare
    assert bare.to_argv()[-4:] == ["--", "--", "--instance", "1"] and "--needs" not in bare.to_argv()
    with pytest.raises(SystemExit) as exc:          # no command: argparse's usage, exit 2
        AgentArgs.parse(bare.to_argv()[:-3])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):                 # an instance and a launcher's rank at once
        AgentArgs.parse(["--index-from-env", *bare.to_argv()])


_MESSAGES = (st.builds(protocol.Ready, _WORD, st.integers(0, 1 << 22), st.integers(0, 4096))
             | st.builds(protocol.Start, st.integers(0, 1 << 22))
             | st.builds(protocol.WorkerExit, st.integers(-64, 255), _STAMP, st.booleans())
             | st.builds(protocol.Heartbeat, _STAMP)
             | st.builds(protocol.AgentStop, _WORD, _STAMP, _SHORT)
             | st.builds(protocol.Done, st.integers(0, 255))
             | st.builds(protocol.Stacks, st.lists(st.fixed_dictionaries(
                 {"pid": st.integers(1, 1 << 22), "main": st.integers(0, 1 << 48), "text": st.text(max_size=40)}),
                 max_size=3).map(tuple), st.none() | _WORD, st.booleans(), st.none() | _SHORT, st.none() | _STAMP)
             | st.builds(protocol.WorkerError, _TEXT, st.lists(st.text(max_size=20), max_size=3).map(tuple), _TEXT)
             | st.builds(protocol.Progress, st.sampled_from(protocol.PHASES), *[st.none() | st.integers(0, 1 << 40)] * 3,
                         *[st.none() | _SHORT] * 4, st.none() | st.builds(
                             protocol.StepSplit, *[_SHORT.map(lambda x: x / 1000)] * 4, st.none() | st.integers(1, 512),
                             st.none() | st.integers(0, 64))))
_JOINS = (st.builds(protocol.JoinChallenge, st.integers(0, 99), _WORD)
          | st.builds(protocol.Join, _WORD, st.integers(0, 1 << 20), _WORD, st.integers(1, 1 << 22), _WORD,
                      _WORD, st.booleans())
          | st.builds(protocol.JoinArgs, _COMMAND, _TEXT, st.just("") | _WORD)
          | st.builds(protocol.JoinReply, st.just(False), st.from_regex(r"([a-z0-9.:()-]+( [a-z0-9.:()-]+)*)?",
                                                                        fullmatch=True))
          | st.builds(protocol.JoinReply, st.just(True), st.just(""), st.just("") | _WORD))


@given(_JOINS)
def test_each_join_message_reads_back_as_written(message):
    """The hand-shake of an agent that joins (podrun.wire.join): its own lines, read back as written."""
    line = protocol.join_line(message)
    assert line.endswith(b"\n") and protocol.read_join_line(line, type(message)) == message
    assert protocol.read_join_line(line, protocol.Heartbeat) is None


@given(_MESSAGES)
def test_each_message_reads_back_as_written(message):
    line = protocol.encode(2, None, message.KIND, message.encode())
    event = protocol.parse(line)
    assert event.kind == message.KIND and type(message).read(event.text) == message


def test_the_messages_are_written_as_before_and_read_tolerantly():
    assert protocol.WorkerExit(-9, 1.5, True).encode() == "-9 1.500 teardown"
    assert protocol.AgentStop("controller-lost", 12.25, 2.0).encode() == "controller-lost 12.250 2"
    assert protocol.Ready("h", 7, 2).encode() == "h 7 2" and protocol.Done(0).encode() == "0"
    assert protocol.Done.decode("") == protocol.Done(0)
    old = protocol.WorkerExit.decode("3")                  # an exit without its time: stamped when read
    assert old.code == 3 and old.at > 0 and not old.teardown
    for kind, text in (("exit", "x 1.0"), ("exit", ""), ("ready", "h"), ("done", "no"), ("stop", "why 1 x")):
        assert next(m for m in (protocol.WorkerExit, protocol.Ready, protocol.Done, protocol.AgentStop)
                    if m.KIND == kind).read(text) is None
    assert protocol.from_json("[1]") is None and protocol.from_json("{") is None
    assert protocol.Stacks.read("[1]") is None               # a stack reply keeps what has its type, drops the rest
    assert protocol.Stacks.read('{"procs": "x", "problem": 3, "exiting": 1, "cpu": true, "at": "1"}') == \
        protocol.Stacks()
    assert protocol.Stacks.read('{"procs": [{"pid": 1}, 2], "cpu": 2}') == protocol.Stacks(({"pid": 1},), cpu=2.0)
    assert protocol.from_json(protocol.to_json({"a": [1, "b"]})) == {"a": [1, "b"]}


# the agent options of request.agent_argv as they were before AgentArgs wrote them (after ``python -m AGENT_MODULE``)
GOLDEN = [
    ('plain', (0,), {},
     '--plan /runs/r1/plan.json --run-id r1 --run-dir /runs/r1 --master-addr 10.0.0.1 --master-port 29500 '
     '--grace 5 --interrupt-grace 30 '
     '--restart-count 0 --max-restarts 0 --heartbeat 0.25 --instance 0 --stdin-timeout 1 '
     '--agent-store -- python train.py -- -x'),
    ('plain', (None,), {'stdin_watch': False},
     '--plan /runs/r1/plan.json --run-id r1 --run-dir /runs/r1 --master-addr 10.0.0.1 --master-port 29500 '
     '--grace 5 --interrupt-grace 30 '
     '--restart-count 0 --max-restarts 0 --heartbeat 0.25 --index-from-env --no-stdin-watch '
     '--agent-store -- python train.py -- -x'),
    ('plain', (None,), {'stdin_watch': False, 'per_worker': True},
     '--plan /runs/r1/plan.json --run-id r1 --run-dir /runs/r1 --master-addr 10.0.0.1 --master-port 29500 '
     '--grace 5 --interrupt-grace 30 '
     '--restart-count 0 --max-restarts 0 --heartbeat 0.25 --rank-from-env --no-stdin-watch '
     '--agent-store -- python train.py -- -x'),
    ('plain', (1,), {'hold': True, 'env_stdin': True},
     '--plan /runs/r1/plan.json --run-id r1 --run-dir /runs/r1 --master-addr 10.0.0.1 --master-port 29500 '
     '--grace 5 --interrupt-grace 30 '
     '--restart-count 0 --max-restarts 0 --heartbeat 0.25 --instance 1 --stdin-timeout 1 '
     '--agent-store --hold -- python train.py -- -x'),
    ('full', (0,), {'hold': True, 'env_stdin': True, 'worker_stdin_fd': 5},
     '--plan /runs/r1/plan.json --run-id r1 --run-dir /runs/r1 --master-addr 10.0.0.1 --master-port 0 '
     '--grace 2.5 --interrupt-grace 30 '
     '--restart-count 1 --max-restarts 3 --heartbeat 0.1 --instance 0 --stdin-timeout 3 '
     '--listen-fd 7 --warm --hold --needs torch,numpy --env-stdin --worker-stdin-fd 5 -- python train.py '
     '-- -x'),
    ('full', (1,), {'hold': True},
     '--plan /runs/r1/plan.json --run-id r1 --run-dir /runs/r1 --master-addr 10.0.0.1 --master-port 0 '
     '--grace 2.5 --interrupt-grace 30 '
     '--restart-count 1 --max-restarts 3 --heartbeat 0.1 --instance 1 --stdin-timeout 3 --warm '
     '--hold --needs torch,numpy -- python train.py -- -x'),
    ('full', (None,), {'stdin_watch': False},
     '--plan /runs/r1/plan.json --run-id r1 --run-dir /runs/r1 --master-addr 10.0.0.1 --master-port 0 '
     '--grace 2.5 --interrupt-grace 30 '
     '--restart-count 1 --max-restarts 3 --heartbeat 0.1 --index-from-env --no-stdin-watch --warm -- '
     'python train.py -- -x'),
    ('full', (None,), {'stdin_watch': False, 'per_worker': True},
     '--plan /runs/r1/plan.json --run-id r1 --run-dir /runs/r1 --master-addr 10.0.0.1 --master-port 0 '
     '--grace 2.5 --interrupt-grace 30 '
     '--restart-count 1 --max-restarts 3 --heartbeat 0.1 --rank-from-env --no-stdin-watch -- '
     'python train.py -- -x'),
    ('full', (0,), {},
     '--plan /runs/r1/plan.json --run-id r1 --run-dir /runs/r1 --master-addr 10.0.0.1 --master-port 0 '
     '--grace 2.5 --interrupt-grace 30 '
     '--restart-count 1 --max-restarts 3 --heartbeat 0.1 --instance 0 --stdin-timeout 3 '
     '--listen-fd 7 --warm -- python train.py -- -x'),
    ('bound', (0,), {},
     '--plan /runs/r1/plan.json --run-id r1 --run-dir /runs/r1 --master-addr 10.0.0.1 --master-port 0 '
     '--grace 2.5 --interrupt-grace 30 '
     '--restart-count 1 --max-restarts 3 --heartbeat 0.1 --instance 0 --stdin-timeout 3 '
     '--listen-fd 7 --warm --cpu-bind 0-3+8,4-7 -- python train.py -- -x'),
]


@pytest.mark.parametrize(("name", "index", "kw", "options"), GOLDEN)
def test_the_agent_command_line_is_unchanged(name, index, kw, options):
    base = dict(run_id="r1", run_dir="/runs/r1", plan=None, plan_path="/runs/r1/plan.json",
                command=("python", "train.py", "--", "-x"), python="/usr/bin/python3", workdir="/w",
                master_addr="10.0.0.1", master_port=29500)
    full = dict(base, master_port=0, grace=2.5, heartbeat=0.1, keepalive=3.0, restart_count=1, max_restarts=3,
                env=(("A", "1"),), listen_fd=7, needs=("torch", "numpy"), warm=True, agent_store=False)
    bound = dict(full, cpu_bind=CpuBind("list", ((0, 1, 2, 3, 8), (4, 5, 6, 7))))
    req = LaunchRequest(**{"plain": base, "full": full, "bound": bound}[name])
    argv = [*pystart.safe("/usr/bin/python3", module=AGENT_MODULE, root=None), *options.split(" ")]
    assert req.agent_argv(*index, **kw) == argv
    assert AgentArgs.parse(argv[3:]).to_argv() == argv[3:]


def test_a_hand_shake_line_in_pieces_is_read_whole_and_one_past_its_limit_is_none():
    """join.read_line waits for the rest of a line that arrives in pieces (a slow link, a short TCP segment), takes
    nothing after its newline, and gives b"" for a line longer than its limit or a peer that closed mid-line."""
    import socket
    import threading
    import time

    from podrun.wire import join

    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"JOIN part")
        later = threading.Timer(0.2, a.sendall, (b" two\nnext",))
        later.start()
        try:
            assert join.read_line(b, time.monotonic() + 10) == b"JOIN part two\n"
        finally:
            later.join()
        assert b.recv(4) == b"next"
        a.sendall(b"x" * 9)
        assert join.read_line(b, time.monotonic() + 10, limit=8) == b""
        a.close()
        assert join.read_line(b, time.monotonic() + 10) == b""


def test_the_typed_lines_are_written_as_before_and_read_tolerantly():
    """A progress report is the JSON record the runtime always wrote (the fields given), read keeping what has its
    type; an error record needs its message; a done line is read in one place (protocol.read_done), whichever handle
    reads it; the controller's stdin tokens are their bytes."""
    split = protocol.StepSplit(0.25, 0.5, 0.125, 0.0625, cpus=4)
    assert protocol.Progress(step=3, total=10, loss=0.5, split=split).encode() == (
        '{"phase":"train","step":3,"total":10,"loss":0.5,"split":{"input":0.25,"compute":0.5,"comm":0.125,'
        '"optim":0.0625,"cpus":4}}')
    assert protocol.Progress.read('{"phase": 3, "step": true, "total": 2.5, "loss": "x", "busy_seconds": 1, '
                                  '"split": {"input": -1}, "other": 1}') == protocol.Progress(busy_seconds=1.0)
    assert protocol.Progress.read("[]") is None and protocol.WorkerError.read('{"traceback": []}') is None
    assert protocol.WorkerError.read('{"message": "m", "traceback": ["a", 2], "file": 3}') == \
        protocol.WorkerError("m", ("a",))
    assert protocol.read_done("@podrun 3 1 done 7") == (3, 1, protocol.Done(7))
    assert protocol.read_done("@podrun 3 - done x") == (3, None, None)
    assert protocol.read_done("@podrun 3 - exit 0") is None and protocol.read_done("done 0") is None
    assert [t.value for t in protocol.Token] == [b".", b"S", b"G"]
    assert not {t.value for t in protocol.Token} & set(protocol.STOP_TOKENS)
    assert Ask.parse(Ask(STACKS).to_line()) == Ask(STACKS) and Ask(STACKS).to_line() == b'{"ask": "stacks"}\n'
    for bad in (b"[]", b'{"ask": 3}', b"", b"{"):
        with pytest.raises(ValueError):
            Ask.parse(bad)
