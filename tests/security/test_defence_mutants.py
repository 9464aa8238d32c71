"""Tests that kill the defences' mutants which their other tests let survive (`python -m bench mutate`).

By module: the env message's bounds, the planner's argument checks and host counts, the hang policy's numbers
(docs/hangs.md), the agent's link after link_close, the local transport's start (no --env value on any agent's
command line); and bench_mutate's table of those modules and the tests that guard them.
"""
from __future__ import annotations

import ast
import fcntl
import glob
import json
import os
import random
import sys
import termios
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from bench.bench_mutate import GUARDS, SCOPES
from podrun.errors import LaunchError, PlanError
from podrun.launch import hangs
from podrun.launch.hangs import RankSample, WatchOptions
from podrun.plan.decompose import decompose, feasible, host_counts
from podrun.wire import envchannel
from podrun.wire.envchannel import EnvMessageError

pytestmark = pytest.mark.timeout(60)


# -- podrun.wire.envchannel: the message's bounds --------------------------------------------------------------

def _read(data: bytes, timeout: float = 1.0, close: bool = False):
    r, w = os.pipe()
    try:
        os.write(w, data)
        if close:
            os.close(w)
            w = -1
        return envchannel.read(r, timeout)
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


@pytest.mark.parametrize("data,why", [
    (b"PODRUN-ENV 000000000009\n", "header is too long"),                   # 12 digits: one past the bound
    (b"PODRUN-ENV 16777217\n", "is not a number up to 16777216"),            # 16 MiB and one byte
    (b"PODRUN-ENV 11\n" + b'[["A=B","1"]]'[:11], "not a JSON list"),
    (b'PODRUN-ENV 13\n[["A=B","1"]]', "no environment can hold"),           # a name holding "="
    (b'PODRUN-ENV 10\n[["","1"]]', "no environment can hold"),               # an empty name
    (b'PODRUN-ENV 17\n[["A","1\\u0000"]]', "no environment can hold"),       # a NUL in a value
    (b'PODRUN-ENV 16\n[["A","1"]', "stdin closed before the env message was complete"),
])
def test_the_env_message_is_refused_past_each_bound(data, why):
    with pytest.raises(EnvMessageError, match=why):
        _read(data, close=True)


def test_the_env_message_at_its_bounds_and_in_pieces():
    """11 digits and exactly 16 MiB are lengths the reader accepts (it then waits for the body, up to its
    timeout, not less); a body that comes in two writes is read to its length and not a byte further."""
    assert envchannel.encode([("A", "1")]) == b'PODRUN-ENV 11\n[["A","1"]]'
    for header in (b"PODRUN-ENV 00000000011\n", b"PODRUN-ENV 16777216\n"):
        t0 = time.monotonic()
        with pytest.raises(EnvMessageError, match="no env message on stdin within"):
            _read(header + b"[", timeout=0.3)
        assert time.monotonic() - t0 >= 0.3
    message = envchannel.encode([("TOKEN", "x" * 100)])
    r, w = os.pipe()
    try:
        os.write(w, message[:40])

        def rest():   # once the reader took the first piece, the rest and the controller's tokens after it
            while fcntl.ioctl(r, termios.FIONREAD, b"\0\0\0\0") != b"\0\0\0\0":
                time.sleep(0.001)
            os.write(w, message[40:] + b".SG")
        writer = threading.Thread(target=rest)
        writer.start()
        assert envchannel.read(r, 10.0) == [("TOKEN", "x" * 100)]
        writer.join()
        assert os.read(r, 16) == b".SG"
    finally:
        os.close(r)
        os.close(w)


# -- podrun.plan.decompose: argument checks and the host counts that reach a batch -------------------------------

def test_the_planners_argument_checks_and_its_default_minimum_ga():
    kw = dict(devices=4, devices_per_replica=1, instances=1, max_local_batch=8)
    assert decompose(**kw, global_batch=16) == decompose(**kw, global_batch=16, min_grad_accum=1)
    for name, over in (("--local-batch", dict(local_batch=0, grad_accum=1)),
                       ("--grad-accum", dict(local_batch=1, grad_accum=0)),
                       ("--global-batch", dict(global_batch=0))):
        with pytest.raises(PlanError, match=f"{name} must be at least 1, got 0"):
            decompose(**kw, **{"global_batch": None, **over})
    with pytest.raises(PlanError, match="with 4 replicas and local batch 3 "):
        decompose(**kw, global_batch=16, local_batch=3)


def test_host_counts_are_the_largest_counts_on_which_a_plan_exists():
    """host_counts, counted host by host: every n up to the bound whose devices (n x per host) split into
    replicas that its instances (n x per host) share evenly, each instance's devices a whole number of replicas,
    with a feasible decomposition (for overrides decompose accepts: it asks host_counts after its checks)."""
    def reachable(g, n, dph, p, iph, max_local, min_ga, lb, ga):
        replicas, split = divmod(n * dph, p)
        return (dph // iph) % p == 0 and split == 0 and replicas % (n * iph) == 0 and \
            feasible(g, replicas, max_local, min_ga, lb, ga) is not None

    rng = random.Random(38)
    for _ in range(400):
        g, dph, p, iph = rng.randint(1, 96), rng.choice((1, 2, 4, 8)), rng.choice((1, 2, 4)), rng.choice((1, 2))
        max_local, min_ga = rng.choice((1, 4, 8)), rng.choice((1, 2))
        lb, ga = rng.choice((None, 1, min(2, max_local))), rng.choice((None, min_ga, 3))
        expected = [n for n in range(8, 0, -1) if reachable(g, n, dph, p, iph, max_local, min_ga, lb, ga)][:3]
        got = host_counts(g, max_hosts=8, devices_per_host=dph, devices_per_replica=p, instances_per_host=iph,
                          max_local_batch=max_local, min_grad_accum=min_ga, local_batch=lb, grad_accum=ga)
        assert got == expected, (g, dph, p, iph, max_local, min_ga, lb, ga)
    assert feasible(12, 4, 8, 1, None, None).local_batch == 3


# -- podrun.launch.hangs: the policy docs/hangs.md states ---------------------------------------------------------

def test_the_hang_policy_is_the_documented_one():
    """auto: 600 s before any step time; then 20 x the median of the last 20 step times, at least 120 s; a fixed
    window is at least 60 s before the first progress; a hung run exits 125, a returning one gets 5 windows; a
    plain script's rank moved when it used more than 0.03 s of CPU and more than 5 % of the time between its
    samples, taken 1 s (at most half the window) apart."""
    auto = WatchOptions()
    assert auto.window([]) == 600.0 and auto.window([1.0] * 3) == 120.0 and auto.progress is True
    rng = random.Random(38)
    for n in range(1, 45):
        steps = [rng.choice((5.0, 6.0, 7.0, 8.0, 9.0, 11.0)) for _ in range(n)]
        assert auto.window(steps) == max(120.0, 20 * sorted(steps[-20:])[len(steps[-20:]) // 2]), steps
    assert WatchOptions(hang_timeout=4.0).window([], started=False) == 60.0
    assert WatchOptions(hang_timeout=90.0).window([], started=False) == 90.0
    assert WatchOptions(hang_timeout=4.0).window([]) == 4.0
    assert (hangs.HANG_EXIT, hangs.EXIT_WINDOWS) == (125, 5)
    assert hangs.probe_gap(3.0) == 1.0 and hangs.probe_gap(1.5) == 0.75
    stack = (("f", 1),)
    before = RankSample(stack, False, 1.0, 100.0)
    for dt, used, busy in ((10.0, 0.49, False), (10.0, 0.51, True), (0.2, 0.029, False), (0.2, 0.031, True)):
        assert (RankSample(stack, False, 1.0 + used, 100.0 + dt).busy_since(before) is not None) is busy, (dt, used)


# -- podrun.host.link: nothing is written once the link is closed ----------------------------------------------

class _Out:
    """The agent's stdout: keeps what is written; ``fail`` makes write and flush raise it."""

    def __init__(self, fail: Exception | None = None):
        self.data, self.fail = bytearray(), fail

    def write(self, b):
        if self.fail is not None:
            raise self.fail
        self.data += b
        return len(b)           # as a file's write: what it took (the link writes until the whole line is out)

    def flush(self):
        if self.fail is not None:
            raise self.fail


def _link(out):
    from podrun.host.link import ControllerLink

    class Agent(ControllerLink):
        index, local_ranks, agent_rank, run_dir = 0, [0], 0, None
        stops: list = []

        def request_stop(self, kind, why, *a, **kw):
            self.stops.append(why)

    a = Agent()
    a.link_init(out, 1.0, True, 600.0)
    return a


def test_the_link_writes_nothing_once_closed_or_lost():
    out = _Out()
    a = _link(out)
    a.emit(None, "note", "one")
    assert a.link_close(1.0) is True and not a.lock.locked()
    a.emit(None, "note", "two")
    assert out.data.decode().splitlines() == ["@podrun 0 0 note one"]
    blocked = _link(_Out())
    blocked.lock.acquire()                      # a writer blocked on a full pipe holds the lock
    assert blocked.link_close(0.05) is False and blocked.lock.locked()   # left held: that writer still owns it
    assert _link(_Out(OSError("gone"))).link_close(1.0) is True           # a flush that fails does not raise
    lost = _link(_Out(BrokenPipeError()))
    lost.emit(None, "note", "x")
    lost.out.fail = None
    lost.emit(None, "note", "y")
    assert lost.controller_lost and lost.stops == ["lost the controller (stdout closed)"] and not lost.out.data


# -- podrun.launch.transports.local: the agents' start ----------------------------------------------------------

from tests.host.test_agent import _request  # noqa: E402 - one home for a small local request


def test_the_local_transport_starts_agents_with_the_env_in_their_environment_never_their_argv(tmp_path):
    """Two agents, each the leader of its own session; the worker sees the --env value, no agent's command line
    holds it (neither the argv executed nor /proc/PID/cmdline); only instance 0 gets a copy of podrun's stdin, and
    that copy is closed here once handed over. A python that cannot start is one LaunchError naming it."""
    from podrun.launch.transports.local import LocalTransport

    secret = f"v4lue-{os.getpid()}-{time.monotonic_ns()}"
    go = tmp_path / "go"          # the workers (so their agents) live until the command lines are read
    req = _request(tmp_path, [sys.executable, "-c", "import os, time; print('GOT', os.environ['PODRUN_T_VALUE'], "
                              f"flush=True)\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)"],
                   env=(("PODRUN_T_VALUE", secret),))

    def stdin_copies() -> int:
        fds = os.listdir("/proc/self/fd")
        return sum(1 for fd in fds if os.path.realpath(f"/proc/self/fd/{fd}") == os.path.realpath("/proc/self/fd/0"))

    copies = stdin_copies()
    handles = LocalTransport(req).start()
    try:
        assert stdin_copies() == copies
        argvs = []
        for h in handles:     # what this process executed, and what runs now
            with open(f"/proc/{h.proc.pid}/cmdline", "rb") as f:
                argvs += [[os.fsencode(a) for a in h.proc.args], f.read().split(b"\0")]
            assert os.getsid(h.proc.pid) == h.proc.pid
        assert not any(secret.encode() in a for argv in argvs for a in argv), argvs
        assert [b"--worker-stdin-fd" in argv for argv in argvs] == [True, True, False, False]
        go.touch()
        got = [line for h in handles for _, line in h.lines() if "GOT" in line]
        assert len(got) == 2 and all(line.endswith(f"GOT {secret}") for line in got), got
        assert [h.proc.wait(timeout=30) for h in handles] == [0, 0]
    finally:
        for h in handles:
            h.kill()
            h.close()
    with pytest.raises(LaunchError, match="cannot start the instance agent with /nonexistent/python"):
        LocalTransport(replace(req, python="/nonexistent/python")).start()


def test_an_agent_that_cannot_start_ends_the_agents_started_before_it(tmp_path, monkeypatch):
    """A fault injected into the second agent's start (the kernel refusing the fork, EAGAIN): the first agent,
    already running, is ended before the LaunchError, so nothing of the launch is left behind."""
    import subprocess

    from podrun.launch.transports import local

    req = _request(tmp_path, [sys.executable, "-c", "import time; time.sleep(60)"])
    started, real = [], subprocess.Popen

    def popen(*a, **kw):
        if started:
            raise OSError(11, "Resource temporarily unavailable")
        started.append(real(*a, **kw))
        return started[-1]

    monkeypatch.setattr(local.subprocess, "Popen", popen)
    try:
        with pytest.raises(LaunchError, match="cannot start the instance agent"):
            local.LocalTransport(req).start()
        assert started[0].wait(timeout=10) is not None     # left alone, it would wait 60 s for its controller
    finally:
        started[0].kill()


# -- podrun.rundir.lock: who holds a directory -----------------------------------------------------------------

def test_a_lock_holder_is_alive_while_its_process_lives_and_another_hosts_is_assumed_alive(tmp_path):
    import socket
    import subprocess

    from podrun.rundir import lock

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert lock.writer_alive(None, os.getpid()) and lock.writer_alive(socket.gethostname(), os.getpid())
    assert not lock.writer_alive(None, gone.pid) and not lock.writer_alive(socket.gethostname(), gone.pid)
    for other in ("0-another-host", "zz-another-host"):                  # its pid means nothing here
        assert lock.writer_alive(other, gone.pid)
    assert lock.holder(tmp_path) is None                             # no lock file: no holder
    with pytest.raises(lock.LockError, match="cannot be written: No such file"):
        lock.DirLock(tmp_path / "missing", "r1", "run directory").acquire()
    held = lock.DirLock(tmp_path, "r1", "run directory").acquire()
    try:
        who = lock.holder(tmp_path)
        assert who["run"] == "r1" and who["pid"] == os.getpid(), who
        os.pwrite(held.fd, b"not json", 0)                            # a description torn or garbled: held all the same
        assert lock.holder(tmp_path) == {}
        os.ftruncate(held.fd, 0)
        os.pwrite(held.fd, json.dumps(who).encode(), 0)
        with pytest.raises(lock.LockError, match=f"in use by run r1 on host .* \\(pid {os.getpid()}\\)"):
            lock.DirLock(tmp_path, "r2", "run directory").acquire()
        t0 = time.monotonic()            # the same run waits for its earlier attempt, then is refused all the same
        with pytest.raises(lock.LockError, match="in use by run r1"):
            lock.DirLock(tmp_path, "r1", "run directory").acquire(same_run_wait=0.3)
        assert time.monotonic() - t0 >= 0.3
    finally:
        held.release()
    assert lock.holder(tmp_path) is None


# -- podrun.train.checkpoint: the digest a checkpoint carries --------------------------------------------------

def _sealed(state: dict) -> bytes:
    """``state`` as a checkpoint file holds it: torch.save through the checkpoint's digesting writer, sealed."""
    import io

    import torch

    from podrun.train import checkpoint as ck

    buf = io.BytesIO()
    w = ck._Digesting(buf)
    torch.save(state, w)
    w.seal()
    return buf.getvalue()


def test_a_checkpoints_digest_finds_every_change_and_accepts_the_shortest_sealed_file():
    import hashlib
    import io
    import shutil
    import struct
    import tempfile

    import torch

    from podrun.train import checkpoint as ck

    data = _sealed({"w": torch.arange(4.0)})
    assert ck.verify(data) is None
    assert ck.verify(b"") == "empty (0 bytes)"
    tail = ck._EOCD + ck._COMMENT
    for cut, why in ((data[:-1], "no digest at its end"), (data[-tail + 1:], "no digest at its end"),
                     (data[:10] + bytes([data[10] ^ 1]) + data[11:], "digest mismatch"),
                     (data[:-tail] + b"XXXX" + data[-tail + 4:], "its end is damaged")):
        assert ck.verify(cut).startswith(why), (why, ck.verify(cut))
    want = data[-64:].decode()
    flipped = data[:-64] + ("0" if want[0] != "0" else "1").encode() + data[-63:]
    assert f"recorded {flipped[-64:-52].decode()}.." in ck.verify(flipped)
    got = hashlib.sha256(flipped[:-ck._COMMENT - 2] + bytes(2)).hexdigest()
    assert f"(sha256 {got[:12]}.., recorded" in ck.verify(flipped)
    for bad in (b"x" * 40 + b"\0\0", ck._EOCD_SIG + b"\0" * 16 + b"\1\0"):   # no end record; one with a comment
        w = ck._Digesting(io.BytesIO())
        w.write(bad)
        with pytest.raises(ck.CheckpointError, match="no zip archive ending in an empty comment"):
            w.seal()
    for keep in (-1, True, 1.5):
        with pytest.raises(ck.CheckpointError, match="--keep-checkpoints"):
            ck.check_keep(keep)
    assert ck.check_keep(0) == 0
    import datetime

    sealed = _sealed({"when": datetime.datetime(2026, 1, 1)})   # sealed, but not what weights_only loads
    try:
        torch.load(io.BytesIO(sealed), weights_only=True)
    except Exception as exc:  # noqa: BLE001 - whatever torch says, decode says its first line
        first = f"does not load: {type(exc).__name__}: {str(exc).splitlines()[0]}"
    d = Path(tempfile.mkdtemp())
    try:
        (d / "ckpt-000000001.pt").write_bytes(sealed)
        assert ck.decode(d / "ckpt-000000001.pt") == (None, first) and len(first) > 40, first
    finally:
        shutil.rmtree(d)
    head = ck._EOCD_SIG + b"\0" * 16            # the shortest file a seal makes: an empty archive's end record
    digest = hashlib.sha256(head + b"\0\0").hexdigest().encode()
    shortest = head + struct.pack("<H", ck._COMMENT) + ck._MARK + digest
    assert len(shortest) == tail and ck.verify(shortest) is None


def test_a_checkpoint_write_that_fails_is_an_error_with_a_failing_exit_and_leaves_no_file(tmp_path, monkeypatch):
    """An I/O error in the middle of a save (injected: EIO from the disk) fails the run (exit 1), never exit 0,
    and leaves neither the checkpoint nor its temporary file."""
    import errno

    import torch

    from podrun.train import checkpoint as ck

    def eio(self, b):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(ck._Digesting, "write", eio)
    with pytest.raises(ck.CheckpointError, match="cannot write checkpoint .*Input/output error") as got:
        ck.save({"w": torch.zeros(4)}, tmp_path / "ck", 1, keep=1)
    assert got.value.exit_code == 1 and os.listdir(tmp_path / "ck") == []


def test_checkpoints_none_of_them_good_are_an_error_naming_each_and_none_at_all_is_a_fresh_start(tmp_path):
    import torch

    from podrun.train import checkpoint as ck

    d = tmp_path / "ck"
    assert ck.load_latest(tmp_path) is None                        # no checkpoint: a fresh start
    ck.save({"w": torch.zeros(2)}, d, 1, keep=2)
    assert ck.load_latest(d)[0].name == "ckpt-000000001.pt"
    (d / "ckpt-000000001.pt").write_bytes(b"torn")
    with pytest.raises(ck.CheckpointError, match="ckpt-000000001.pt") as got:
        ck.load_latest(d)
    assert got.value.exit_code == 2


def test_only_kernel_interface_files_are_written_in_place(tmp_path):
    from podrun import safefs

    victim = tmp_path / "f"
    victim.write_text("x")
    with pytest.raises(ValueError, match="not a kernel interface file"):
        safefs.write_kernel(str(victim), "5")
    assert victim.read_text() == "x"


# -- podrun.redaction: secrets by value ----------------------------------------------------------------------------

def test_a_known_secret_of_4_characters_is_hidden_and_one_of_3_is_not():
    """MIN_SECRET_CHARS as docs/security.md gives it; each line of a multi-line value is hidden on its own."""
    from podrun import redaction

    try:
        for value in ("q7x9", "abc", "line-one\nline-two"):
            redaction.remember_secret(value)
        assert redaction.redact_text("pw q7x9 abc line-two") == "pw <redacted> abc <redacted>"
        redaction.remember_secret("q7x9-and-more")     # a value holding a shorter one is hidden whole
        assert redaction.redact_text("pw q7x9-and-more") == "pw <redacted>"
    finally:
        redaction.forget_secrets()
    assert redaction.redact_text("pw q7x9") == "pw q7x9"


# -- bench/bench_mutate.py's table: what `python -m bench mutate` mutates and runs is there --------------------

def test_the_mutation_checks_table_names_modules_tests_and_functions_that_exist():
    root = Path(__file__).resolve().parents[2]
    missing = []
    for module, guards in GUARDS.items():
        if not (root / module).is_file():
            missing.append(module)
        for guard in guards:
            path, _, test = guard.partition("::")
            files = glob.glob(str(root / path))
            if not files or (test and f"def {test.split('[')[0]}(" not in Path(files[0]).read_text()):    # [a case]
                missing.append(f"{module}: guard {guard}")
    for module, names in SCOPES.items():
        defined = {n.name for n in ast.walk(ast.parse((root / module).read_text()))
                   if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        missing += [f"{module}: scope {n}" for n in names if n not in defined]
    assert not missing, "bench_mutate.GUARDS/SCOPES name what the tree does not hold:\n" + "\n".join(missing)
