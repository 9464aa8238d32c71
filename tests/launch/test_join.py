"""Agents that join over loopback: the hand-shake's refusals (wrong key, another run, twice, no such instance), each
one line and counted, and an instance that never joins, named after the join window (podrun.launch.transports.join)."""
from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import pytest

from podrun.launch.transports.join import JoinServer
from tests.launch.helpers import end
from podrun.wire import join, protocol

SCRIPTS = Path(__file__).parent / "scripts"

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


def test_a_listener_out_of_descriptors_pauses_and_goes_on(server):
    """The controller's process at its descriptor limit while another process holds 60 connections to the join
    port: the accepts that fail (EMFILE) pause the listener, which goes on; once descriptors are free again an agent
    joins (the old listener's thread ended at the first EMFILE: no agent could join after it)."""
    import os
    import resource
    import sys

    from tests.launch.helpers import wait_output, wait_until

    # The crowd is started before the limit is lowered (a start needs descriptors of its own) and connects when told.
    crowd = subprocess.Popen([sys.executable, "-c", "import socket, sys\n"
                              "sys.stdin.readline()\n"
                              f"c = [socket.create_connection(('127.0.0.1', {server.port})) for _ in range(60)]\n"
                              "print('held', flush=True); sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 16, hard))
        crowd.stdin.write("go\n")
        crowd.stdin.flush()
        wait_output(crowd, "held", 30)
        wait_until(lambda: server.accept_pauses > 0, 10)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        crowd.kill()
        crowd.wait(10)
    conn, _ = join.join(server.address, KEY, "run-a", 1, 10.0)
    assert server.accept_pauses > 0 and wait_until(lambda: server.record()["joined"] == 1, 10)
    conn.close()


def test_an_agent_names_the_address_it_cannot_reach_and_a_short_key_is_no_key():
    with pytest.raises(join.JoinError, match=r"cannot join the controller at 127.0.0.1:1 within 0.5 s"):
        join.join("127.0.0.1:1", KEY, "r", 0, 0.5)
    assert join.key_problem(None) == "PODRUN_JOIN_KEY is not set"
    assert "at least 16" in join.key_problem("short") and join.key_problem(join.new_key()) is None
    assert join.parse_address("[::1]:5") == ("::1", 5) and join.parse_address("node1") == ("node1", None)
    with pytest.raises(ValueError):
        join.parse_address("node1:x")


# --- one podrun per node on this machine (podrun.launch.copies): real podrun processes --------------------------

def _copies(tmp_path, *extra, worker: str = "echo up $RANK key=${PODRUN_JOIN_KEY:-none}; sleep 1.5; echo on $RANK; "
                                           "sleep 60"):
    import secrets

    from tests.launch.helpers import copies_args, marker, with_env
    from tests.ports import free_port

    m = marker()
    worker = f"{worker} # {m}"
    args = ("launch", "--devices-per-host", "1", "--runs-dir", str(tmp_path / "runs"), "--master-port",
            str(free_port()), *extra, "--", "sh", "-c", worker)
    port, run_id = free_port(), marker()
    return m, (lambda rank: copies_args(args, rank, 2, port, run_id)), with_env(PODRUN_JOIN_KEY=secrets.token_hex(32))


def test_a_copy_that_never_joins_is_named_and_a_late_one_or_one_with_another_key_is_refused(tmp_path):
    """Copy 1 of `podrun launch --nnodes 2 --node-rank R` first comes with another key (refused, counted, its one
    line naming the address), then never: after --join-window the controller ends the run naming instance 1 (exit
    255, as for a lost host); a copy that comes after the controller has ended names the address it cannot join."""
    import os
    import secrets

    from tests.launch.helpers import local_pids, run_podrun, start_podrun, summary, wait_output

    m, argv, env = _copies(tmp_path, "--join-window", "4")
    ctl = start_podrun(*argv(0), env=env, merge=True)
    try:
        wait_output(ctl, "up 0", 30)
        wrong = run_podrun(*argv(1), env={**env, "PODRUN_JOIN_KEY": secrets.token_hex(32)}, timeout=30)
        assert wrong.returncode == 2 and "refused instance 1" in wrong.stderr and "run's key" in wrong.stderr
        assert len(wrong.stderr.strip().splitlines()) == 2, wrong.stderr          # the line and its hint
        out, _ = ctl.communicate(timeout=30)
    finally:
        end(ctl)
    assert ctl.returncode == 255, out
    assert "instance 1 (host node-rank-1) did not join within the join window of 4 s" in out
    s = summary(tmp_path / "runs")
    assert s["root_cause"]["kind"] == "lost" and s["root_cause"]["instance"] == 1
    assert s["joins"]["refused"] == {"wrong-key": 1} and s["joins"]["joined"] == 0
    late = run_podrun(*argv(1), "--join-window", "1", env=env, timeout=30)
    assert late.returncode == 2 and "cannot join the controller at 127.0.0.1:" in late.stderr, late.stderr
    assert local_pids(m) == [] and os.environ.get("PODRUN_JOIN_KEY") is None


def test_the_controllers_node_lost_ends_every_joined_agents_workers_within_the_bound(tmp_path):
    """The controller (copy 0) stops answering, as a lost node does (SIGSTOP: its connections stay open): copy 1's
    agent hears no heartbeat for the keepalive bound and ends its workers, without waiting for TCP. No worker of
    either copy has the run's key in its environment."""
    import signal

    from tests.launch.helpers import local_pids, start_podrun, wait_output, wait_until

    m, argv, env = _copies(tmp_path, "--keepalive", "2")
    ctl = start_podrun(*argv(0), env=env, merge=True)
    other = start_podrun(*argv(1), env=env, merge=True)
    try:
        said = wait_output(ctl, "on 1", 30)     # heartbeats went both ways (before the first, the bound is longer)
        assert "up 0 key=none" in said and "up 1 key=none" in said, said      # no worker has the key
        ctl.send_signal(signal.SIGSTOP)
        # the stopped controller's connections stay open, so TCP never ends them: gone at all (but the stopped
        # controller), and the agent naming the 2 s it heard nothing for, is the heartbeat bound acting; 30 s is
        # a hang guard that holds on a loaded machine, well short of the workers' own end (sleep 60)
        assert wait_until(lambda: len(local_pids(m)) <= 1, 30), local_pids(m)
        out, _ = other.communicate(timeout=30)
        assert "lost the controller (no heartbeat on its connection for 2 s)" in out and other.returncode != 0, out
    finally:
        end(ctl)
        end(other)
    assert wait_until(lambda: local_pids(m) == [], 15), local_pids(m)


_STEP = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2",
         "SLURM_STEP_NODELIST": "node[1-2]", "PODRUN_JOIN_KEY": KEY}


@pytest.mark.parametrize("env,torchrun,expect", [
    (_STEP, {}, ("srun", 1, 2, "node1:29400", "srun-7.0", ("node1", "node2"))),
    ({**_STEP, "SLURM_STEP_NUM_TASKS": None}, {}, None),            # the batch script's own step: no copy
    ({**_STEP, "SLURM_STEP_NUM_TASKS": "1"}, {}, None),             # one task: the one podrun of the run
    ({**_STEP, "SLURM_STEP_NUM_TASKS": "4"}, {}, "one podrun per node runs one copy on each node"),
    ({**_STEP, "PODRUN_JOIN_KEY": "short"}, {}, "a run key needs at least 16"),
    ({"PODRUN_JOIN_KEY": KEY}, {"node_rank": "1", "nnodes": "2", "master_addr": "h0", "run_id": "r"},
     ("--node-rank", 1, 2, "h0:29400", "r", None)),
    ({"PODRUN_JOIN_KEY": KEY}, {"node_rank": "1", "nnodes": "2", "master_addr": "h0", "run_id": "r",
                                "join_address": "[::1]:5"}, ("--node-rank", 1, 2, "[::1]:5", "r", None)),
    ({"PODRUN_JOIN_KEY": KEY}, {"node_rank": "2", "nnodes": "2", "master_addr": "h0", "run_id": "r"},
     "takes a node rank from 0 to 1"),
    ({"PODRUN_JOIN_KEY": KEY}, {"node_rank": "1", "nnodes": "2", "run_id": "r"}, "which --master-addr names"),
    ({"PODRUN_JOIN_KEY": KEY}, {"node_rank": "1", "nnodes": "2", "master_addr": "h0"}, "share its run id"),
    ({"PODRUN_JOIN_KEY": KEY}, {"node_rank": "1"}, None),            # --node-rank alone: refused later, as before
])
def test_a_podrun_knows_whether_it_is_one_of_several_copies(env, torchrun, expect):
    """podrun.launch.copies.detect: a task of an srun step of several tasks, or --node-rank with --nnodes N > 1,
    is a copy (node rank, count, where the copies meet, their run id, the step's nodes); what cannot meet is one
    paragraph, exit 2."""
    from podrun.errors import LaunchError
    from podrun.launch.copies import detect

    env = {k: v for k, v in env.items() if v is not None}
    args = [torchrun.get(k) for k in ("node_rank", "nnodes", "master_addr", "run_id", "join_address")]
    if isinstance(expect, str):
        with pytest.raises(LaunchError, match=expect) as exc:
            detect(env, *args)
        assert exc.value.exit_code == 2 and KEY not in str(exc.value)
        return
    copy = detect(env, *args)
    got = None if copy is None else (copy.source, copy.rank, copy.count, copy.address, copy.run_id, copy.hosts)
    assert got == expect


# --- the joining side trusts only a controller that proves the key (the other user holds the port first) --------

def test_a_forged_controller_holding_the_join_port_gets_nothing_run_and_no_secret(tmp_path):
    """`nobody` listens on the copies' join address before copy 0 does and answers copy 1 as a controller would, but
    with a made-up proof: ``ok``, then arguments that would write the copy's environment to a marker file. The copy
    exits non-zero with one line saying the listener cannot prove the key; the marker is never made, and no --env
    value (nor the key) reached the listener."""
    import os
    import tempfile

    from tests.attacker import NOBODY, popen_as_nobody
    from tests.launch.helpers import run_podrun, wait_output

    shared = tempfile.mkdtemp(prefix="podrun-forge-", dir="/tmp")
    try:
        os.chmod(shared, 0o1777)
        log, marker_file = os.path.join(shared, "got"), os.path.join(shared, "ran")
        code = f"import os; open({marker_file!r}, 'w').write(repr(dict(os.environ)))"
        m, argv, env = _copies(tmp_path, "--env", "HF_TOKEN")
        port = argv(1)[argv(1).index("--join-address") + 1].rsplit(":", 1)[1]
        forged = popen_as_nobody(["/usr/bin/python3", str(SCRIPTS / "hostile_joins.py"), "forge", port,
                                  str(protocol.JOIN_VERSION), log, code, shared], stdout=subprocess.PIPE, text=True)
        try:
            wait_output(forged, "listening", 30)
            secret = "hf_" + os.urandom(8).hex()
            cp = run_podrun(*argv(1), env={**env, "HF_TOKEN": secret}, timeout=60)
        finally:
            forged.kill()
            forged.wait(10)
        assert not os.path.exists(marker_file), open(marker_file).read()
        assert cp.returncode != 0, cp.stderr
        assert "cannot prove this run's key" in cp.stderr and len(cp.stderr.strip().splitlines()) == 1, cp.stderr
        sent = open(log, "rb").read()
        assert b"@podrun-join join" in sent and secret.encode() not in sent
        assert env["PODRUN_JOIN_KEY"].encode() not in sent and os.stat(log).st_uid == NOBODY
    finally:
        import shutil

        shutil.rmtree(shared, ignore_errors=True)


class _FakeController:
    """A listener in this process that speaks the controller's side with the key (FAKE: for the proofs' fields,
    each test turns one of them wrong); ``forge(nonce, agent_nonce, run_id, instance, args)`` -> (the ok's proof,
    the args' MAC)."""

    def __init__(self, forge):
        import socket

        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.forge, self.args = forge, protocol.JoinArgs(("python", "-c", "pass"), "/")
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        import time

        conn, _ = self.sock.accept()
        nonce = "ab" * 16
        conn.sendall(protocol.join_line(protocol.JoinChallenge(protocol.JOIN_VERSION, nonce)))
        msg = protocol.read_join_line(join.read_line(conn, time.monotonic() + 10), protocol.Join)
        ok, mac = self.forge(nonce, msg.nonce, msg.run_id, msg.instance, self.args)
        conn.sendall(protocol.join_line(protocol.JoinReply(True, proof=ok))
                     + protocol.join_line(protocol.JoinArgs(self.args.argv, self.args.workdir, mac)))
        self.conn = conn


def _right(on: str = "ok", key=KEY, nonce=None, agent_nonce=None, run_id=None, instance=None, argv=None,
           label=None):
    """A forge that makes the controller's proof (``on`` "ok") or the args' MAC (``on`` "args") with one field
    replaced (None: the right one), the other made right."""
    def forge(n, a, r, i, args):
        wrong = (key, nonce or n, agent_nonce or a, run_id or r, i if instance is None else instance)
        ok = (join.proof if label == "agent" else join.controller_proof)(*wrong) if on == "ok" \
            else join.controller_proof(KEY, n, a, r, i)
        signed = args if argv is None else protocol.JoinArgs(argv, args.workdir)
        return ok, join.args_mac(*wrong, signed) if on == "args" else join.args_mac(KEY, n, a, r, i, args)
    return forge


_WRONG = (dict(key="w" * 32), dict(nonce="ef" * 16), dict(agent_nonce="01" * 16), dict(run_id="run-b"),
          dict(instance=2))


def test_a_controller_that_proves_the_key_over_both_nonces_the_run_and_the_instance_is_the_only_one_believed():
    """The joining side checks the controller's proof over each of its fields, for an agent (srun's, mpirun's) and
    a copy alike: a proof made with another key, for another controller nonce, a stale agent nonce, another run or
    instance, or an agent's proof sent back, is refused (UnprovenListener: nothing used); so are a copy's arguments
    whose MAC is made so, or covers other arguments. The fake made right is believed (the check is not vacuous)."""
    fake = _FakeController(_right())
    conn, args = join.join(fake.address, KEY, "run-a", 1, 5.0, copy=True)
    assert args == protocol.JoinArgs(fake.args.argv, fake.args.workdir, args.mac)
    conn.close()
    for on, wrong, copy in [*(("ok", w, False) for w in (*_WRONG, dict(label="agent"))),
                            *(("args", w, True) for w in (*_WRONG, dict(argv=("python", "-c", "evil"))))]:
        fake = _FakeController(_right(on, **wrong))
        with pytest.raises(join.UnprovenListener, match="nothing it sent was used") as exc:
            join.join(fake.address, KEY, "run-a", 1, 5.0, copy=copy)
        assert "\n" not in str(exc.value), wrong


@pytest.mark.parametrize("field", ["instance", "run_id", "nonce", "agent_nonce"])
def test_a_join_proof_made_for_another_instance_run_or_nonce_is_the_wrong_key(server, field):
    """The controller checks an agent's proof over each field it covers: a proof made for instance 0 sent as
    instance 1 (as one who saw instance 0's join would), for another run, the controller's nonce of another
    hand-shake, or an agent nonce other than the one sent, is refused as the wrong key."""
    import socket
    import time

    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        challenge = protocol.read_join_line(join.read_line(s, time.monotonic() + 10), protocol.JoinChallenge)
        made = {"instance": 1, "run_id": "run-a", "nonce": challenge.nonce, "agent_nonce": "cd" * 16}
        made[field] = {"instance": 0, "run_id": "run-b", "nonce": "ef" * 16, "agent_nonce": "01" * 16}[field]
        sent = join.proof(KEY, made["nonce"], made["agent_nonce"], made["run_id"], made["instance"])
        s.sendall(protocol.join_line(protocol.Join("run-a", 1, "h1", 1, sent, "cd" * 16)))
        reply = protocol.read_join_line(join.read_line(s, time.monotonic() + 10), protocol.JoinReply)
    assert not reply.accepted and "does not match this run's key" in reply.reason
    assert server.record()["refused"] == {"wrong-key": 1} and server.handles[1].joined_from is None


# --- the listener under a crowd, and what another party wrote shown escaped -----------------------------------

def test_a_crowd_at_1024_descriptors_and_a_join_line_of_escapes_leave_the_copies_to_finish(tmp_path):
    """Copy 0 (the controller) held to 1,024 descriptors (prlimit on it): `nobody` sends one join whose host name
    clears the screen, sets the window title and writes a fake green line, then 2,000 connections at once, twice;
    copy 1 joins in the middle of it and the run ends 0 (the copies' key: the user's key file, no PODRUN_JOIN_KEY).
    The refused joins' lines reach the console and summary.json with their control characters shown as ``\\x1b``,
    none sent raw."""
    import subprocess as sp

    from tests.attacker import AS_NOBODY, require_second_user
    from tests.launch.helpers import start_podrun, summary, wait_output

    require_second_user()
    go = tmp_path / "go"
    m, argv, env = _copies(tmp_path, "--join-window", "40", worker=f"echo up $RANK; while [ ! -e {go} ]; do "
                                                                   "sleep 0.1; done; echo on $RANK")
    port = argv(1)[argv(1).index("--join-address") + 1].rsplit(":", 1)[1]
    run_id = argv(1)[argv(1).index("--run-id") + 1]
    env = {**{k: v for k, v in env.items() if k != "PODRUN_JOIN_KEY"}, "HOME": str(tmp_path)}   # the user's key file
    ctl = start_podrun(*argv(0), env=env, merge=True)
    crowd = other = None
    try:
        said = wait_output(ctl, "up 0", 30)
        sp.run(["prlimit", "--pid", str(ctl.pid), "--nofile=1024:1024"], check=True)
        crowd = sp.Popen(["prlimit", "--nofile=8192:8192", *AS_NOBODY, "/usr/bin/python3",
                          str(SCRIPTS / "hostile_joins.py"), "crowd", port, run_id, "2000", "2"],
                         stdout=sp.PIPE, text=True)
        waves = wait_output(crowd, "wave 0:", 60)
        other = start_podrun(*argv(1), env=env, merge=True)
        said += wait_output(ctl, "up 1", 60)
        go.touch()
        out, _ = ctl.communicate(timeout=60)
        waves += crowd.communicate(timeout=60)[0]
        assert other.wait(30) == 0, other.communicate()[0]
    finally:
        for p in (ctl, crowd, other):
            if p is not None:
                end(p)
    said += out
    assert ctl.returncode == 0 and "on 0" in said and "on 1" in said, said
    counts = [int(line.split()[2]) for line in waves.splitlines() if line.startswith("wave")]
    assert len(counts) == 2 and min(counts) > 1024, waves        # more than the controller's descriptors
    assert "\x1b" not in said and "\x07" not in said and "\r" not in said, said
    host = "\\x1b[2J\\x1b]0;pwned\\x07\\x1b[2K\\x1b[1G\\x1b[32mpodrun:finished-ok\\x1b[0m (pid 4242"
    line = "no join message: @podrun-join join \\x1b[2J\\x0d\\x1b[32mpodrun: run finished: exit 0\\x1b[0m"
    assert host in said and line in said, said
    joins = summary(tmp_path / "runs")["joins"]
    assert joins["joined"] == 1 and joins["refused"]["wrong-key"] == 1, joins
    assert host in joins["refusals"][0] and line in joins["refusals"][1], joins
    assert not any(c in json.dumps(joins, ensure_ascii=False) for c in "\x1b\x07\r"), joins
    assert (tmp_path / ".config" / "podrun" / "join.key").stat().st_mode & 0o077 == 0


# --- the per-user key: copies without PODRUN_JOIN_KEY ------------------------------------------------------------

def test_copies_without_the_variable_share_the_users_key_file_made_once_private_and_the_variable_wins(tmp_path):
    """An srun copy without PODRUN_JOIN_KEY takes the user's key from ~/.config/podrun/join.key, made on first use
    (0600, a private directory), the same key on the next copy (nodes sharing the home); set, the variable wins and
    no file is made. As the attacker: a key file another user owns, or one group or others may write or read, or a
    link, or a directory of the other user's on the way, is refused in one line naming it (exit 2)."""
    import os
    import stat

    from podrun.errors import LaunchError
    from podrun.launch.copies import detect
    from tests.attacker import NOBODY

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    step = {k: v for k, v in _STEP.items() if k != "PODRUN_JOIN_KEY"}
    first, second = {**step, "HOME": str(home)}, {**step, "HOME": str(home), "SLURM_PROCID": "0"}
    assert detect(first, None, None, None, None, None).rank == 1 and detect(second, None, None, None, None, None)
    path = home / ".config" / "podrun" / "join.key"
    key = path.read_text().strip()
    assert first["PODRUN_JOIN_KEY"] == second["PODRUN_JOIN_KEY"] == key and join.key_problem(key) is None
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    other = tmp_path / "other"
    given = {**step, "HOME": str(other), "PODRUN_JOIN_KEY": KEY}
    detect(given, None, None, None, None, None)
    assert given["PODRUN_JOIN_KEY"] == KEY and not other.exists()

    def refused(words, named=path):
        env = {**step, "HOME": str(home)}
        with pytest.raises(LaunchError) as exc:
            detect(env, None, None, None, None, None)
        assert exc.value.exit_code == 2 and "\n" not in str(exc.value) and str(named) in str(exc.value), exc.value
        assert words in str(exc.value) and key not in str(exc.value) and "PODRUN_JOIN_KEY" not in env, exc.value

    os.chown(path, NOBODY, NOBODY)                              # another user's file, 0600: they know its key
    refused("belongs to nobody")
    os.chown(path, 0, 0)
    for mode, words in ((0o620, "others may change it"), (0o644, "others may read it")):
        os.chmod(path, mode)
        refused(f"mode {mode:04o}")
    os.chmod(path, 0o600)
    path.rename(path.with_name("real"))
    path.symlink_to(path.with_name("real"))
    refused("symbolic link")
    path.unlink()
    path.with_name("real").rename(path)
    os.chown(path.parent, NOBODY, NOBODY)                       # the other user's directory on the way
    refused("belongs to nobody", path.parent)
