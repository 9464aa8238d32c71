"""The instance agent and its line protocol, as the transports use them (real processes, no mocks)."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from podrun.cli.options import resolve_plan
from podrun.wire import protocol
from podrun.wire.liveness import Liveness
from podrun.launch.run import build_request
from podrun.rundir.layout import write_plan
from tests.launch.helpers import local_pids, marker, wait_until

pytestmark = pytest.mark.timeout(60)


def test_protocol_round_trip_and_raw_lines():
    line = protocol.encode(3, 1, "out", "hello @podrun 1 2 out x")
    assert protocol.parse(line) == protocol.Event(3, 1, "out", "hello @podrun 1 2 out x")
    assert protocol.parse(protocol.encode(0, None, "hb", "1.5")) == protocol.Event(0, None, "hb", "1.5")
    assert protocol.parse("@podrun x y out z") == protocol.Event(None, None, "out", "@podrun x y out z")
    assert protocol.parse("mpirun noise", "err") == protocol.Event(None, None, "err", "mpirun noise")
    assert protocol.exit_code_from_returncode(-9) == 137 and protocol.exit_code_from_returncode(3) == 3


def _request(tmp_path, command, master_port: int | None = None, grace: float = 5.0, **kw):
    plan, *_ = resolve_plan(None, devices_per_host=2, instances_per_host=2)   # 2 instances x 1 worker
    req = build_request(plan, command, transport="local", runs_dir=str(tmp_path / "runs"), run_id="a",
                        master_port=master_port, grace=grace, **kw)
    write_plan(req.run_dir, plan)
    return req


def test_index_from_env_for_mpirun_and_srun(tmp_path):
    """--index-from-env: the rank variable of Open MPI / PMI / Slurm picks the instance and its env."""
    req = _request(tmp_path, ["sh", "-c", "echo $RANK/$WORLD_SIZE/$PODRUN_INSTANCE_INDEX/$GROUP_RANK"])
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        cp = subprocess.run(req.agent_argv(None, stdin_watch=False), capture_output=True, text=True, timeout=30,
                            env={**{k: v for k, v in os.environ.items() if k not in ("OMPI_COMM_WORLD_RANK",
                                 "PMI_RANK", "SLURM_PROCID", "PMIX_RANK")}, var: "1"}, stdin=subprocess.DEVNULL)
        assert cp.returncode == 0, cp.stderr
        events = [protocol.parse(l) for l in cp.stdout.splitlines()]
        assert protocol.Event(1, 0, "out", "1/2/1/1") in events
        assert events[-1] == protocol.Event(1, None, "done", "0")
        assert any(e.kind == "ready" for e in events) and all(e.instance == 1 for e in events)


def test_the_agent_leaves_without_the_interpreters_finalization_and_keeps_its_last_line_and_code(tmp_path):
    """The agent's last act is os._exit once its last line is out: the interpreter's finalization (module teardown
    and collection) is skipped, which at a teardown that ends every host at once cost the machine about 2 CPU-s
    over 64 hosts (bench scale: 2.9-3.7 -> 1.2-1.7 CPU-s). An atexit callback that a sitecustomize registers in the
    agent's process shows it (the same file in a plain interpreter does run it); the worker's exit code and the
    agent's ``done`` line stand."""
    site, flag = tmp_path / "site", tmp_path / "finalized"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"import atexit\natexit.register(lambda: open({str(flag)!r}, 'w').close())\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True, timeout=30)
    assert flag.exists()                             # the hook works in a plain interpreter's exit
    flag.unlink()
    req = _request(tmp_path, ["sh", "-c", "echo bye; exit 3"])
    p = subprocess.Popen(req.agent_argv(0), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    out = p.stdout.read()                            # stdin stays open: the worker's exit ends the agent
    assert p.wait(timeout=30) == 3, out
    p.stdin.close()
    events = [protocol.parse(line) for line in out.splitlines()]
    assert protocol.Event(0, 0, "out", "bye") in events and events[-1] == protocol.Event(0, None, "done", "3"), out
    assert not flag.exists()


def test_agent_ends_workers_when_stdin_closes(tmp_path):
    m = marker()
    req = _request(tmp_path, ["sh", "-c", f"echo up; sleep 60 # {m}"])
    p = subprocess.Popen(req.agent_argv(0), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert "@podrun 0 - ready" in p.stdout.readline()
    assert wait_until(lambda: local_pids(m), 10)
    p.stdin.close()
    assert p.wait(timeout=10) == 128 + signal.SIGTERM
    assert "lost the controller (stdin closed)" in p.stdout.read()
    assert local_pids(m) == []


def test_agent_ends_workers_when_stdin_is_silent(tmp_path):
    """A cut link gives no EOF: silence on stdin for --stdin-timeout seconds ends the workers."""
    m = marker()
    req = _request(tmp_path, ["sh", "-c", f"sleep 60 # {m}"], liveness=Liveness(0.25, 1.0))
    p = subprocess.Popen(req.agent_argv(0), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert "@podrun 0 - ready" in p.stdout.readline()
    assert wait_until(lambda: local_pids(m), 10)     # the workers are up: the timeout has something to end
    p.stdin.write(".")          # the first heartbeat; from then on, silence counts
    p.stdin.flush()
    t0 = time.monotonic()
    assert p.wait(timeout=60) == 143                 # a hang guard, not a promise: a loaded machine is slow
    assert time.monotonic() - t0 > 0.9               # never before the second of silence it was given
    out = p.stdout.read()
    assert "no heartbeat on stdin for 1 s" in out
    # the typed line the controller decides on: why, when, and the silence it heard
    stops = [protocol.parse(line) for line in out.splitlines() if " stop " in line]
    assert [(e.kind, e.text.split()[0], e.text.split()[2]) for e in stops] == [("stop", "controller-lost", "1")], out
    assert local_pids(m) == []


def test_agent_heartbeats_at_the_period_it_is_given(tmp_path):
    """--heartbeat 0.1: the agent's hb lines (each stamped with its wall clock) come ten a second."""
    m = marker()
    req = _request(tmp_path, ["sh", "-c", f"sleep 60 # {m}"], liveness=Liveness(0.1, 30.0))
    assert "--heartbeat 0.1 " in " ".join(req.agent_argv(0))
    p = subprocess.Popen(req.agent_argv(0), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        stamps = []
        while len(stamps) < 11:
            ev = protocol.parse(p.stdout.readline())
            if ev.kind == "hb":
                stamps.append(float(ev.text))
        gaps = sorted(b - a for a, b in zip(stamps, stamps[1:]))
        # the shortest gap: a loaded machine delays some beats (longer gaps), it cannot make a 0.5 s or 1 s
        # period give a gap under 0.3 s
        assert gaps[0] < 0.3, gaps
    finally:
        p.stdin.close()
        p.wait(timeout=10)
    assert local_pids(m) == []


def test_workers_die_with_a_killed_agent(tmp_path):
    """PR_SET_PDEATHSIG: SIGKILL to the agent takes its workers with it."""
    m = marker()
    req = _request(tmp_path, ["sh", "-c", f"exec sleep 60 # {m}"])
    p = subprocess.Popen(req.agent_argv(0), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert wait_until(lambda: local_pids(m), 10)
    p.kill()
    p.wait(timeout=30)
    # a hang guard (wait_until returns when they are gone): without PDEATHSIG the sleep would live 60 s
    assert wait_until(lambda: local_pids(m) == [], 30), local_pids(m)


def test_agent_forwards_sigint_then_kills_after_grace(tmp_path):
    m = marker()
    req = _request(tmp_path, ["sh", "-c", f"trap 'echo got-int; exit 0' INT; echo up; while :; do sleep 0.1; done # {m}"],
                   grace=1)
    p = subprocess.Popen(req.agent_argv(0, stdin_watch=False), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         text=True)
    while "up" not in p.stdout.readline():
        pass
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=10) == 130
    assert "got-int" in p.stdout.read()
    assert wait_until(lambda: local_pids(m) == [], 3)


def _events(cp) -> list[protocol.Event]:
    return [protocol.parse(line) for line in cp.stdout.splitlines()]


def _clean_env(**extra) -> dict[str, str]:
    drop = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "PMIX_RANK", "OMP_NUM_THREADS",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


def test_rank_from_env_runs_the_one_worker_of_that_rank(tmp_path):
    """--rank-from-env (mpirun, one MPI rank per worker): rank 3 of 2 instances x 2 workers is instance 1,
    local rank 1; the agent runs only it and tags its own lines with that local rank."""
    plan, *_ = resolve_plan(None, devices_per_host=4, instances_per_host=2)
    req = build_request(plan, ["sh", "-c", "echo $RANK/$LOCAL_RANK/$PODRUN_INSTANCE_INDEX/$WORLD_SIZE"],
                        transport="local", runs_dir=str(tmp_path / "runs"), run_id="a")
    write_plan(req.run_dir, plan)
    argv = req.agent_argv(None, stdin_watch=False, per_worker=True)
    assert "--rank-from-env" in argv
    cp = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=_clean_env(OMPI_COMM_WORLD_RANK="3"),
                        stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stderr
    events = _events(cp)
    assert [e for e in events if e.kind == "out"] == [protocol.Event(1, 1, "out", "3/1/1/4")]
    assert events[0].kind == "ready" and events[0].local_rank == 1 and events[0].text.endswith(" 1")
    assert events[-1] == protocol.Event(1, 1, "done", "0")
    bad = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=_clean_env(OMPI_COMM_WORLD_RANK="4"),
                         stdin=subprocess.DEVNULL)
    assert bad.returncode != 0 and "rank 4 out of range for a world of 4 workers" in bad.stderr


def test_torchrun_names_and_host_defaults(tmp_path):
    """torchrun's names (role, group world, restarts, run id, error file) and the host defaults: OMP_NUM_THREADS
    is the agent's cores shared by the host's workers unless the host or --env sets it."""
    names = ["ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT",
             "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "OMP_NUM_THREADS",
             "TORCH_NCCL_ASYNC_ERROR_HANDLING"]
    req = _request(tmp_path, ["sh", "-c", "echo " + " ".join(f"${n}" for n in names)], max_restarts=2)
    cores = len(os.sched_getaffinity(0))
    for extra, omp, nccl in (({}, str(max(1, cores // 2)), "1"),
                             ({"OMP_NUM_THREADS": "3", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, "3", "0")):
        cp = subprocess.run(req.agent_argv(1, stdin_watch=False), capture_output=True, text=True, timeout=30,
                            env=_clean_env(**extra), stdin=subprocess.DEVNULL)
        assert cp.returncode == 0, cp.stderr
        (out,) = [e.text for e in _events(cp) if e.kind == "out"]
        error_file = os.path.join(req.run_dir, "errors", "worker-1-0.json")
        assert out.split(" ") == ["1", "default", "2", "2", "0", "2", "a", error_file, omp, nccl], out
    # --dry-run / env.json show the same contract, less OMP_NUM_THREADS (each agent counts its host's cores)
    env = req.worker_envs(1)[0]
    assert [env.get(n) for n in names[:-2]] == ["1", "default", "2", "2", "0", "2", "a", error_file]
    assert "OMP_NUM_THREADS" not in env


def test_pmi_fd_reaches_the_worker(tmp_path):
    """MPICH's hydra gives each rank its PMI connection as an inherited descriptor (PMI_FD): under
    --rank-from-env the worker is the rank, so the agent passes that descriptor on."""
    r, w = os.pipe()
    try:
        req = _request(tmp_path, [sys.executable, "-c", "import os; os.write(int(os.environ['PMI_FD']), b'pmi-ok')"])
        cp = subprocess.run(req.agent_argv(None, stdin_watch=False, per_worker=True), capture_output=True, text=True,
                            timeout=30, env=_clean_env(PMI_RANK="1", PMI_FD=str(w)), pass_fds=(w,),
                            stdin=subprocess.DEVNULL)
        assert cp.returncode == 0, cp.stdout + cp.stderr
        os.close(w)
        w = -1
        assert os.read(r, 100) == b"pmi-ok"
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def test_env_message_frames_values_that_hold_the_control_letters():
    """The env message on a real pipe: values holding every stdin token (. S T G), a newline and non-ASCII come back
    whole, and the controller's bytes that follow it stay in the pipe for the stdin watch."""
    from podrun.wire.envchannel import EnvMessageError, encode, read

    pairs = [("HF_TOKEN", "hf_" + "x" * 30), ("ODD", ".STG\n.é S T G"), ("EMPTY", "")]
    r, w = os.pipe()
    try:
        os.write(w, encode(pairs) + b".SG")
        assert read(r, 5.0) == pairs
        assert os.read(r, 16) == b".SG"
        for bad, why in [(b".", "does not start with an env message"), (b"PODRUN-ENV x\n", "is not a number"),
                         (b"PODRUN-ENV 3\n[1]", "not a JSON list")]:
            os.write(w, bad)
            with pytest.raises(EnvMessageError, match=why):
                read(r, 1.0)
        with pytest.raises(EnvMessageError, match="no env message on stdin within"):
            read(r, 0.2)
    finally:
        os.close(w)
        os.close(r)


def test_held_agent_reads_its_env_from_stdin_before_the_probe_and_the_go(tmp_path):
    """--env-stdin with --hold (the ssh transports' start): the agent takes the message, reports its probe, starts
    its worker only on G, and the worker has the values; the command line holds none of them."""
    req = _request(tmp_path, [sys.executable, "-c", "import os; print('GOT', os.environ['HF_TOKEN'], "
                                                    "os.environ['PODRUN_TEST_PLAIN'])"],
                   env=(("HF_TOKEN", "hf_" + "a" * 30), ("PODRUN_TEST_PLAIN", "S3CRET-T.G")))
    argv = req.agent_argv(0, hold=True, env_stdin=True)
    assert "--env-stdin" in argv and not any("S3CRET" in a or "hf_a" in a for a in argv)
    assert "S3CRET" not in req.shell_command(0, hold=True, env_stdin=True)
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=False,
                         env={k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "PODRUN_TEST_PLAIN")})
    p.stdin.write(req.env_message() + b".")
    p.stdin.flush()
    lines = []
    while not any(b" probe " in l for l in lines):
        lines.append(p.stdout.readline())
        assert lines[-1], lines
    assert not any(b" start " in l for l in lines)     # held: nothing runs before the go
    p.stdin.write(b"G.")
    p.stdin.flush()
    out = p.stdout.read().decode()
    p.stdin.close()
    assert p.wait(timeout=30) == 0, out
    assert f"GOT {'hf_' + 'a' * 30} S3CRET-T.G" in out


def test_agent_without_its_env_message_ends_with_a_message(tmp_path):
    """--env-stdin and stdin closed before the message: exit with one line saying so, nothing started."""
    req = _request(tmp_path, ["true"], env=(("A", "1"),))
    cp = subprocess.run(req.agent_argv(0, env_stdin=True), input=b"", capture_output=True, timeout=30)
    assert cp.returncode == 1 and b"podrun agent: --env-stdin: stdin closed before the env message" in cp.stderr
    assert b"Traceback" not in cp.stderr and b" start " not in cp.stdout


@pytest.mark.torch
def test_a_launchers_agent_forks_a_later_attempts_workers_from_a_zygote_it_starts(tmp_path):
    """--index-from-env (srun, mpirun: each attempt is a new job step, whose end may have ended an earlier step's
    zygote): at a later attempt too (restart 1 of 2) the agent of a host with 2 workers of a torch program starts
    the host's zygote when none listens, waits for it and forks both workers from it (an agent given its --instance
    starts them cold then, and a zygote for the next attempt)."""
    from dataclasses import replace

    from podrun.host import zygote_client

    plan, *_ = resolve_plan(None, devices_per_host=2)           # 1 instance x 2 workers
    code = "import os\nif os.environ.get('NEVER'):\n    import torch\nprint('warm', os.environ.get('PODRUN_WARM'))"
    req = build_request(plan, [sys.executable, "-c", code], transport="local", runs_dir=str(tmp_path / "runs"),
                        run_id="a", max_restarts=2)
    req = replace(req.for_restart(1, req.master_port), warm=True)
    write_plan(req.run_dir, plan)
    try:
        cp = subprocess.run(req.agent_argv(None, stdin_watch=False), capture_output=True, text=True, timeout=50,
                            env=_clean_env(SLURM_PROCID="0"), stdin=subprocess.DEVNULL)
        assert cp.returncode == 0, cp.stderr
        outs = sorted(e.text for e in _events(cp) if e.kind == "out")
        assert len(outs) == 2 and "warm None" not in outs and len(set(outs)) == 1, cp.stdout
        assert zygote_client.alive(req.run_dir, socket.gethostname())     # it holds its lock (/proc/locks)
    finally:
        shutil.rmtree(zygote_client.zygote_dir(req.run_dir), ignore_errors=True)   # every zygote of the run ends
    assert wait_until(lambda: local_pids(zygote_client.zygote_dir(req.run_dir)) == [], 15)     # the zygote ended
    assert not zygote_client.alive(req.run_dir, socket.gethostname())
