"""The Supervisor's parts, each driven alone: the instances and their statuses, the failures and the root cause,
the live watch, the listener; and the Supervisor as a holder of parts, not a mixin."""
from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import pytest

from podrun.launch import hangs
from podrun.launch.instance_logs import RankFiles
from podrun.launch.live_watch import LiveWatch
from podrun.launch.outcome import (Failure, FailureKind, Failures, Instances, InstanceState, InstanceStatus,
                                   RunStatus)
from podrun.launch.listener import Listener
from podrun.wire.liveness import Liveness
from podrun.launch.supervisor import Supervisor

STACK = 'Current thread 0x00007f00 (most recent call first):\n  File "/work/train.py", line 12 in step\n'


def request(tmp_path, n: int = 2, wpi: int = 2):
    return SimpleNamespace(instances=tuple(SimpleNamespace(index=i, host=f"host{i}") for i in range(n)),
                           worker_envs=lambda i: [{"RANK": str(i * wpi + lr)} for lr in range(wpi)],
                           run_dir=str(tmp_path), run_id="run", liveness=Liveness(5.0, 20.0), rank_files=RankFiles(),
                           restart_count=0)


def test_an_instance_status_is_an_enum_and_a_string_is_refused(tmp_path):
    insts = Instances(request(tmp_path), 2)
    st = insts[1]
    assert st.status is InstanceStatus.STARTING
    with pytest.raises(TypeError):
        st.status = "running"
    with pytest.raises(TypeError):
        insts.end(st, "lost", 255)
    with pytest.raises(TypeError):
        InstanceState(0, "h", status="ok")
    st.status = InstanceStatus.RUNNING
    assert insts.running() == [(1, 0), (1, 1)]
    st.workers[0] = 0
    assert insts.running() == [(1, 1)] and insts.running(starting=True) == [(0, 0), (0, 1), (1, 1)]
    insts.end(st, InstanceStatus.LOST, 255)
    assert (st.status, st.exit_code) == (InstanceStatus.LOST, 255) and st.ended_s is not None
    assert insts.rank(1, 1) == 3 and insts.rank(1, 7) == -1
    # the strings summary.json has always had
    assert [s.value for s in InstanceStatus] == ["starting", "running", "ok", "failed", "terminated", "lost"]
    assert {s.value for s in RunStatus} == {"ok", "failed", "lost", "hung", "interrupted", "preflight_failed",
                                            "start_failed"}
    assert FailureKind.LOST.status is RunStatus.LOST and FailureKind.EXITED.status is RunStatus.FAILED


def test_the_failures_name_the_earliest_as_root_cause_with_its_lines_and_followers(tmp_path):
    insts = Instances(request(tmp_path), 2)
    insts.heard(0, 1, "[1] boom", "boom")
    insts.heard(1, 0, "[0] waiting", "waiting")
    insts[0].workers.update({0: 143, 1: 1})
    insts[1].workers.update({0: 143, 1: 0})
    failures = Failures()
    assert failures.root_cause(insts) is None
    failures.append(Failure(1, "host1", 0, 143, FailureKind.EXITED, "late", at=20.0))
    failures.append(Failure(0, "host0", 1, 1, FailureKind.EXITED, "first", at=10.0))
    failures.errors[(0, 1)] = {"message": "ValueError"}
    root = failures.root_cause(insts)
    assert root is failures[1] and root.reason == "first"          # the earliest, not the first found
    assert root.last_lines == ["boom"] and root.error == {"message": "ValueError"}
    assert [o["local_rank"] for o in root.others] == [0] and root.others[0]["instance"] == 1
    assert root.followers == {"count": 2, "hosts": 2, "by_code": [{"exit_code": 143, "ranks": [0, 2]}]}
    assert root.rank == 1 and root.others[0]["rank"] == 2 and root.to_dict()["rank"] == 1   # each one's global rank


def test_the_root_cause_groups_lines_that_differ_only_in_the_writers_own_rank():
    """"said the same": a rank number is masked only where it is the writer's own rank; "peer rank 0" from rank 1
    and "peer rank 1" from rank 0 differ in what they say (the old rule masked every "rank N" and grouped them), and
    torch's own "[rank1]:" prefix is the writer's rank (the old rule left it and grouped nothing)."""
    from podrun.cli.console import said_the_same

    def w(rank, *lines):
        return {"instance": rank, "host": f"h{rank}", "local_rank": 0, "rank": rank, "last_lines": list(lines)}

    root = w(0, "[rank0]: RuntimeError: peer rank 1 closed the connection")
    said, others = said_the_same(root, [w(1, "[rank1]: RuntimeError: peer rank 0 closed the connection")])
    assert (said, len(others)) == ("", 1)
    root = w(0, "[rank0]: RuntimeError: bad shard", "train.py (rank 0): error: no data")
    said, others = said_the_same(root, [w(1, "[rank1]: RuntimeError: bad shard", "train.py (rank 1): error: no data"),
                                         w(2, "[rank2]: RuntimeError: bad shard", "train.py (rank 1): error: no data")])
    assert said == "instance 1 on h1, local rank 0" and [o["rank"] for o in others] == [2], (said, others)


@pytest.mark.parametrize("transport,means", [("ssh", "sshd or agent killed"), ("srun", "its srun task or agent killed"),
                                             ("mpirun", "its Open MPI daemon (prted) or agent killed")])
def test_a_lost_hosts_cause_says_what_may_have_ended_it_under_its_transport(tmp_path, transport, means):
    """An instance whose handle ends (FAKE handle: the end of its agent's connection) before it reported: the root
    cause names what may have ended it under the run's transport; no sshd under srun or mpirun."""
    from podrun.launch.transports import TRANSPORTS

    sup = Supervisor(SimpleNamespace(**vars(request(tmp_path)), kind=TRANSPORTS[transport]),
                     SimpleNamespace(merged=False), workers_per_instance=2)
    fake_handle = SimpleNamespace(instances=[1], label="host1", lost_why=None, wait=lambda timeout=None: None)
    sup._handle_eof(fake_handle, {})
    (lost,) = sup.failures
    assert lost.kind is FailureKind.LOST and f"before it reported (host crashed, {means}" in lost.reason or \
        f"before it reported (node down, {means}" in lost.reason, lost.reason
    assert ("sshd" in lost.reason) == (transport == "ssh"), lost.reason


def test_the_live_watch_alone_finds_a_hang_and_hands_it_over(tmp_path):
    insts = Instances(request(tmp_path, n=1, wpi=1), 1)
    insts[0].status = InstanceStatus.RUNNING
    notices, hung, asked = [], [], []
    handle = SimpleNamespace(request_stacks=lambda: asked.append(1))
    live = LiveWatch(request(tmp_path, n=1, wpi=1), insts, notices.append, False, hung.append,
                     hangs.WatchOptions(hang_timeout=1.0))
    live.progress_report(insts[0], 0, json.dumps({"step": 1, "phase": "train"}), 100.0)
    live.tick(100.5, [handle], stopping=False)
    assert not asked                                  # within the window
    live.tick(101.5, [handle], stopping=False)
    assert asked == [1]                               # past it: every agent is asked for its stacks
    live.got_stacks(0, 0, json.dumps({"procs": [{"pid": 7, "text": STACK}]}))
    live.tick(101.6, [handle], stopping=False)
    assert len(hung) == 1 and hung[0].kind is FailureKind.HUNG and hung[0].exit_code == hangs.HANG_EXIT
    assert "step (train.py:12)" in hung[0].reason and live.hang["groups"][0]["ranks"] == [0]
    assert (tmp_path / "stacks" / "rank-0.txt").exists()


def test_the_listener_beats_to_its_handles_until_the_loop_ends():
    beats = threading.Semaphore(0)
    handle = SimpleNamespace(push=lambda take: True, heartbeat=beats.release, instances=(0,))
    listener = Listener(Liveness(0.01, 0.04))
    listener.start([handle])
    assert beats.acquire(timeout=5) and beats.acquire(timeout=5)
    listener.done.set()


def test_a_silent_local_agent_that_is_busy_is_starved_not_lost():
    """A local agent's silence past the bound is a lost host only while its process is stopped or asleep: one with a
    thread running (a machine loaded past a second of heartbeats: 256 workers ending at once on 2 cores) is not
    lost. Real processes: a busy loop, the same stopped, and one asleep."""
    import signal
    import subprocess
    import sys
    import time

    from podrun.launch.transports.local import LocalHandle
    from tests.launch.helpers import wait_until

    procs = {name: subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)
             for name, code in (("busy", "while True: pass"), ("asleep", "import time; time.sleep(60)"))}
    handles = {name: LocalHandle(i, "localhost", p) for i, (name, p) in enumerate(procs.items())}
    try:
        listener = Listener(Liveness(0.01, 0.04))
        for h in handles.values():
            listener.hearing.heard(h, h.instances[0])
        carrier = {h.instances[0]: h for h in handles.values()}

        def lost(now):
            listener.scan = SimpleNamespace(due=lambda _: True)
            return sorted(s.instance for s in listener.silent(now, [0, 1], carrier))

        time.sleep(0.1)                                      # past the 0.04 s bound for both
        assert wait_until(lambda: lost(time.monotonic()) == [1], 10)     # asleep: lost; busy: starved
        procs["busy"].send_signal(signal.SIGSTOP)
        assert wait_until(lambda: lost(time.monotonic()) == [0, 1], 10)  # stopped: lost
    finally:
        for name, p in procs.items():
            p.kill()
            p.wait(10)
            handles[name].close()


def test_the_supervisor_holds_parts_and_is_no_mixin(tmp_path):
    assert Supervisor.__bases__ == (object,)
    sup = Supervisor(request(tmp_path), SimpleNamespace(merged=False), workers_per_instance=2)
    assert len(vars(sup)) <= 13, sorted(vars(sup))      # 13: the in-place recovery, a part of its own


def test_host_busy_keeps_each_hosts_mean_busy_per_step_bounded():
    """A host's point at a step is the mean of its ranks' latest busy times; a long run keeps at most ``points``
    per host (every other one dropped, the stride doubled), first step kept, in step order."""
    from podrun.launch.slow_ranks import HostBusy

    hb = HostBusy(points=8)
    for step in range(1, 101):
        hb.add(0, "h0", 0.1, step)
        hb.add(1, "h0", 0.3, step)          # the same step: the host's point is the mean of both ranks
        hb.add(2, "h1", 0.1 if step < 50 else 0.5, step)
    h0, h1 = hb.series["h0"], hb.series["h1"]
    assert 4 <= len(h0) <= 8 and h0[0][0] == 1 and all(v == pytest.approx(0.2) for _, v in h0), h0
    assert [s for s, _ in h1] == sorted(s for s, _ in h1) and h1[-1][1] == 0.5 and h1[0][1] == 0.1


def test_every_protocol_kind_has_a_handler_or_a_reason_not_to():
    """A new message kind fails here until the supervisor routes it (or says why its loop does not read it)."""
    from podrun.launch.supervisor import HANDLERS, UNHANDLED
    from podrun.wire import protocol

    assert set(HANDLERS) | set(UNHANDLED) == protocol.KINDS and not set(HANDLERS) & set(UNHANDLED)
    assert all(callable(getattr(Supervisor, name, None)) for name in HANDLERS.values()), HANDLERS
