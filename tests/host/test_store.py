"""Rendezvous ports and the agent store (podrun.host.store), and the held agent (--hold): real sockets,
real torch TCPStores, real agents, real concurrent launches."""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from podrun.wire import protocol
from podrun.host.store import ENV, StoreHost
from podrun.launch.options import LaunchOptions, TransportOptions
from podrun.wire.probe import Facts, listen
from podrun.wire.probe import ephemeral_low
from tests.launch.helpers import ALLREDUCE, local_pids, marker, podrun, podrun_popen, run_dir, summary, wait_until
from tests.host.test_agent import _request
from tests.ports import free_port

pytestmark = pytest.mark.timeout(120)

# A torch TCPStore client made before its server exists; torch's trace log (TORCH_DISTRIBUTED_DEBUG=DETAIL)
# says "is not yet listening ... will retry" for every refused connect, i.e. for every backoff.
_CLIENT = r"""
import datetime, sys
from torch.distributed import TCPStore
print("ready", flush=True)
s = TCPStore("127.0.0.1", int(sys.argv[1]), None, False, timeout=datetime.timedelta(seconds=30))
print("got", s.get("k").decode(), flush=True)
"""
_TRACE = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL", "TORCH_CPP_LOG_LEVEL": "INFO"}
_REFUSED = "is not yet listening"
_ROOT_ON_PATH = {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}   # podrun for a python of its own


def _established_to(port: int) -> int:
    """Connections from this machine's clients to 127.0.0.1:port that the kernel has established."""
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()                  # remote 127.0.0.1:port (or ::ffff:127.0.0.1:port), ESTABLISHED
            if f[2].endswith(f"0100007F:{port:04X}") and f[3] == "01":
                n += 1
    return n


def _early_clients(port: int, tmp_path: Path, n: int = 2, *, held: bool) -> list[tuple[subprocess.Popen, Path]]:
    """n clients (with the stderr file each writes), returned once every one of them is connecting: on a held
    port, n connections established; on a free one, a refused connect logged by each."""
    clients = []
    for i in range(n):
        err = tmp_path / f"client-{i}.err"
        with open(err, "w") as f:
            clients.append((subprocess.Popen([sys.executable, "-c", _CLIENT, str(port)], stdout=subprocess.PIPE,
                                             stderr=f, text=True, env={**os.environ, **_TRACE}), err))
    for c, err in clients:
        assert c.stdout.readline().strip() == "ready", (c.communicate(timeout=30), err.read_text())
    if held:
        assert wait_until(lambda: _established_to(port) >= n, 60), _established_to(port)
    else:
        assert wait_until(lambda: all(_REFUSED in e.read_text() for _, e in clients), 60), \
            [e.read_text()[-500:] for _, e in clients]
    return clients


def _outcome(clients) -> list[tuple[int, str, str]]:
    out = []
    for c, err in clients:
        o, _ = c.communicate(timeout=60)
        out.append((c.returncode, o, err.read_text()))
    return out


def _serve_and_set(sock: socket.socket) -> StoreHost:
    host = StoreHost(sock)
    assert host.up.wait(60) and host.state == "up", host.state
    import datetime

    from torch.distributed import TCPStore

    TCPStore("127.0.0.1", sock.getsockname()[1], None, False, timeout=datetime.timedelta(seconds=10)).set("k", "v")
    return host


@pytest.mark.torch
def test_early_clients_wait_for_the_agent_store_without_backoff(tmp_path):
    """Clients that connect while the store is not up yet (it is still importing torch) are accepted by the
    held socket and served once it is: torch never sees a refused connect, so never backs off."""
    sock = listen(0)
    # connected (established in the held socket's backlog) before the store host starts importing torch
    clients = _early_clients(sock.getsockname()[1], tmp_path, held=True)
    host = _serve_and_set(sock)
    try:
        outs = _outcome(clients)
        assert all(rc == 0 for rc, _, _ in outs), outs
        assert all(o.strip() == "got v" for _, o, _ in outs), outs
        assert not [e for _, _, e in outs if _REFUSED in e], [e[-500:] for _, _, e in outs]
    finally:
        host.close()
        sock.close()


@pytest.mark.torch
def test_without_a_held_port_early_clients_are_refused_and_back_off(tmp_path):
    """The same clients against a port nobody holds until the store binds it (rank 0 hosting its own store,
    as without the agent store): torch logs refused connects and retries (what the agent store avoids)."""
    port = free_port()
    clients = _early_clients(port, tmp_path, held=False)      # each has been refused at least once
    sock = listen(port)
    host = _serve_and_set(sock)
    try:
        outs = _outcome(clients)
        assert all(rc == 0 for rc, _, _ in outs), outs
        assert all(o.strip() == "got v" for _, o, _ in outs), outs
    finally:
        host.close()
        sock.close()


def test_store_host_without_torch_reports_failure(tmp_path):
    """A python without torch: the store host says why it cannot serve, and the agent is told."""
    py = _python_without_torch(tmp_path)
    sock = listen(0)
    got = []
    host = StoreHost(sock, on_failure=got.append, python=py)
    try:
        assert host.up.wait(30)
        assert host.state.startswith("failed: ModuleNotFoundError") and got == [host.state], host.state
    finally:
        host.close()
        sock.close()


def _python_without_torch(tmp_path) -> str:
    """A real virtualenv without torch (no system site-packages); podrun comes from PYTHONPATH."""
    d = tmp_path / "venv-no-torch"
    venv.create(d, with_pip=False, system_site_packages=False)
    py = str(d / "bin" / "python")
    check = "import podrun.host.agent\ntry:\n import torch\nexcept ImportError: print('none')"
    cp = subprocess.run([py, "-c", check],
                        capture_output=True, text=True, env={**os.environ, **_ROOT_ON_PATH})
    assert cp.stdout.strip() == "none", cp.stderr
    return py


# -- the env contract: one MASTER_PORT for every worker ------------------------------------------------------

@pytest.mark.torch
@pytest.mark.parametrize("how", ["script", "through sh"])
def test_every_worker_sees_the_same_master_port_and_rank0_is_a_store_client(tmp_path, how):
    """Regression (rank 0 saw --master-port + 1 behind the relay): 3 local workers of a torchrun script see
    the same MASTER_PORT (the one asked for) and TORCHELASTIC_USE_AGENT_STORE=True; the all_reduce works.
    ``through sh``: a program that shows no import of torch (a shell line) gets the store all the same: its store
    host starts at the first connection to the port, while the client waits in the accept queue."""
    dump = tmp_path / "env"
    dump.mkdir()
    p = free_port()
    program = [sys.executable, ALLREDUCE, "--dump", str(dump)]
    program = program if how == "script" else ["sh", "-c", f"exec {' '.join(program)}"]
    cp = podrun("launch", "--devices-per-host", "3", "--master-port", str(p), "--runs-dir", str(tmp_path / "runs"),
                "--", *program)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.count("sum=6") == 3, cp.stdout
    envs = [json.loads((dump / f"env-{r}.json").read_text()) for r in range(3)]
    assert [e["MASTER_PORT"] for e in envs] == [str(p)] * 3
    assert [e.get(ENV) for e in envs] == ["True"] * 3
    assert not [e for e in envs if "PODRUN_STORE_RELAY" in e]


_STORE_HOSTS = """import os
agent = os.getppid()
def parent(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
def hosts_store(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"TCP" + b"Store" in f.read()        # split: the workers' own command lines hold this code
    except OSError:
        return False
print("store hosts", sum(1 for p in os.listdir("/proc") if p.isdigit() and parent(p) == agent and hosts_store(p)))
"""


def test_a_program_that_never_connects_costs_no_store_host(tmp_path):
    """A program that shows no import of torch and never connects to MASTER_PORT (a plain command, a launch
    benchmark's worker): rank 0's agent starts no store host (no torch import on the first host), though its python
    has torch; the workers still see TORCHELASTIC_USE_AGENT_STORE, the port held for a store should one connect."""
    cp = podrun("launch", "--devices-per-host", "2", "--master-port", str(free_port()), "--runs-dir",
                str(tmp_path / "r"), "--", sys.executable, "-c", _STORE_HOSTS)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.count("store hosts 0") == 2, cp.stdout


def test_no_agent_store_gives_rank0_the_port_to_host_itself(tmp_path):
    """--no-agent-store: every worker has the same MASTER_PORT and no TORCHELASTIC_USE_AGENT_STORE, and
    nothing holds the port, so rank 0 of a program that serves its own rendezvous can bind it."""
    p = free_port()
    script = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "scripts", "socket_allreduce.py")
    cp = podrun("launch", "--devices-per-host", "2", "--master-port", str(p), "--no-agent-store", "--runs-dir",
                str(tmp_path / "r"), "--", "sh", "-c",
                f'echo "port=$MASTER_PORT store=${{{ENV}:-none}}"; exec {sys.executable} {script}')
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.count(f"port={p} store=none") == 2 and cp.stdout.count("sum=3") == 2, cp.stdout
    cp = podrun("launch", "--devices-per-host", "2", "--master-port", "0", "--no-agent-store", "--runs-dir",
                str(tmp_path / "r"), "--", "sh", "-c", f'echo "port=$MASTER_PORT"; exec {sys.executable} {script}')
    assert cp.returncode == 0, cp.stderr
    ports = {l.split("port=")[1] for l in cp.stdout.splitlines() if "port=" in l}
    assert len(ports) == 1 and 0 < int(ports.pop()) < ephemeral_low(), cp.stdout    # picked below the range
    assert cp.stdout.count("sum=3") == 2, cp.stdout


def test_agent_without_torch_lets_the_port_go_before_its_workers_start(tmp_path):
    """The agent's python has no torch (plain commands): no store is hosted, the agent's workers get no
    TORCHELASTIC_USE_AGENT_STORE, and the port is free by the time they start (rank 0 may bind it)."""
    py = _python_without_torch(tmp_path)
    p = free_port()
    script = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "scripts", "socket_allreduce.py")
    cp = podrun("launch", "--devices-per-host", "2", "--master-port", str(p), "--python", py, "--runs-dir",
                str(tmp_path / "r"), "--", "sh", "-c",
                f'echo "port=$MASTER_PORT store=${{{ENV}:-none}}"; exec {sys.executable} {script}', env=_ROOT_ON_PATH)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.count(f"port={p} store=none") == 2 and cp.stdout.count("sum=3") == 2, cp.stdout
    assert "cannot" not in cp.stdout + cp.stderr
    # --dry-run says the same before anything runs: what is printed is what runs
    dry = podrun("launch", "--devices-per-host", "2", "--master-port", str(p), "--python", py, "--dry-run", "--json",
                 "--", "true", env=_ROOT_ON_PATH)
    workers = [e for i in json.loads(dry.stdout)["instances"] for e in i["workers"]]
    assert len(workers) == 2 and not any(ENV in e for e in workers), workers


# -- port 0 and the range ---------------------------------------------------------------------------------

@pytest.mark.torch
@pytest.mark.timeout(90)
def test_master_port_0_picks_one_free_port_for_every_worker(tmp_path):
    """Regression (--master-port 0 hung forever: rank 0 got 1, rank 1 got 0): 0 means podrun picks a free
    port; both workers see it and the torchrun script's all_reduce completes."""
    dump = tmp_path / "env"
    dump.mkdir()
    cp = podrun("launch", "--devices-per-host", "2", "--master-port", "0", "--runs-dir", str(tmp_path / "runs"),
                "--", sys.executable, ALLREDUCE, "--dump", str(dump), timeout=60)
    assert cp.returncode == 0, cp.stderr
    ports = {json.loads((dump / f"env-{r}.json").read_text())["MASTER_PORT"] for r in range(2)}
    assert len(ports) == 1 and 0 < int(ports.pop()) < 65536
    assert cp.stdout.count("sum=3") == 2


def test_default_port_on_this_machine_is_picked_and_recorded(tmp_path):
    cp = podrun("launch", "--devices-per-host", "2", "--runs-dir", str(tmp_path / "runs"), "--", "sh", "-c",
                "echo port=$MASTER_PORT")
    assert cp.returncode == 0, cp.stderr
    ports = {l.split("port=")[1] for l in cp.stdout.splitlines() if "port=" in l}
    assert len(ports) == 1
    port = int(ports.pop())
    assert port not in (0, 29500)
    assert f"--master-port {port} " in (run_dir(tmp_path / "runs") / "command").read_text()


@pytest.mark.parametrize("port", ["70000", "-1", "65536"])
def test_ports_outside_the_range_are_refused(tmp_path, port):
    cp = podrun("launch", "--devices-per-host", "1", "--master-port", port, "--runs-dir", str(tmp_path / "r"),
                "--", "echo", "never")
    assert cp.returncode == 2 and "never" not in cp.stdout, cp.stdout + cp.stderr
    assert "Traceback" not in cp.stderr and port in cp.stderr


def test_port_0_with_hosts_elsewhere_is_refused_with_a_hint(tmp_path):
    cp = podrun("launch", "--hosts", "node1,node2", "--devices-per-host", "1", "--master-port", "0", "--dry-run",
                "--runs-dir", str(tmp_path / "r"), "--", "python", "train.py")
    assert cp.returncode == 2 and "Traceback" not in cp.stderr, cp.stderr
    assert "--master-port 0" in cp.stderr and "--master-port 29500" in cp.stderr
    cp = podrun("launch", "--hosts", "node1,node2", "--devices-per-host", "1", "--dry-run", "--json",
                "--runs-dir", str(tmp_path / "r"), "--", "python", "train.py")
    assert cp.returncode == 0, cp.stderr
    workers = [w for i in json.loads(cp.stdout)["instances"] for w in i["workers"]]
    assert {w["MASTER_PORT"] for w in workers} == {"29500"} and {w[ENV] for w in workers} == {"True"}


# -- two runs at once --------------------------------------------------------------------------------------

def _launch_torch(tmp_path, name, *extra):
    dump = tmp_path / f"env-{name}"
    dump.mkdir()
    return podrun_popen("launch", "--devices-per-host", "2", "--runs-dir", str(tmp_path / f"runs-{name}"), *extra,
                        "--", sys.executable, ALLREDUCE, "--dump", str(dump))


@pytest.mark.torch
def test_a_second_run_on_the_next_port_does_not_kill_the_first(tmp_path):
    """Regression (A died with EADDRINUSE): run A on port P, run B 0.5 s later on P + 1, the port the busy-port
    hint suggested. A's rank 0 used to bind its store on P + 1 only after `import torch`, after B took it."""
    p = free_port(2)
    a = _launch_torch(tmp_path, "a", "--master-port", str(p))
    assert wait_until(lambda: not _bindable(p) or a.poll() is not None, 60)     # A has started: it holds P
    assert a.poll() is None, a.communicate()
    b = _launch_torch(tmp_path, "b", "--master-port", str(p + 1))
    (oa, ea), (ob, eb) = a.communicate(timeout=90), b.communicate(timeout=90)
    assert a.returncode == 0, ea[-3000:]
    assert b.returncode == 0, eb[-3000:]
    assert oa.count("sum=3") == 2 and ob.count("sum=3") == 2


@pytest.mark.torch
def test_two_concurrent_runs_with_default_options_both_succeed(tmp_path):
    a = _launch_torch(tmp_path, "a")
    # A has planned (its run dir holds the plan) before B starts
    assert wait_until(lambda: list((tmp_path / "runs-a").glob("*/plan.json")) or a.poll() is not None, 60)
    b = _launch_torch(tmp_path, "b")
    (oa, ea), (ob, eb) = a.communicate(timeout=90), b.communicate(timeout=90)
    assert a.returncode == 0 and b.returncode == 0, (ea[-2000:], eb[-2000:])
    assert oa.count("sum=3") == 2 and ob.count("sum=3") == 2
    ta, tb = summary(tmp_path / "runs-a")["timings"], summary(tmp_path / "runs-b")["timings"]
    assert tb["started"] < ta["ended"] and ta["started"] < tb["ended"], (ta, tb)     # they did run side by side
    pa = json.loads((tmp_path / "env-a" / "env-0.json").read_text())["MASTER_PORT"]
    pb = json.loads((tmp_path / "env-b" / "env-0.json").read_text())["MASTER_PORT"]
    assert pa != pb


def test_a_second_run_on_the_same_port_is_refused_at_once_and_the_first_goes_on(tmp_path):
    """The port is held from the check on: B on A's port fails its preflight (exit 2, nothing started),
    whatever A's workers are doing; A ends normally."""
    p = free_port()
    m = marker()
    go = tmp_path / "go"           # A's workers go on only once B has been refused
    a = podrun_popen("launch", "--devices-per-host", "2", "--master-port", str(p), "--runs-dir", str(tmp_path / "a"),
                     "--", "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done; echo done-$RANK # {m}")
    assert wait_until(lambda: len(local_pids(m)) >= 2, 20)
    cp = podrun("launch", "--devices-per-host", "1", "--master-port", str(p), "--runs-dir", str(tmp_path / "b"),
                "--", "echo", "never")
    assert cp.returncode == 2 and "never" not in cp.stdout, cp.stderr
    assert f"rendezvous port {p} is in use" in cp.stderr and "Traceback" not in cp.stderr
    assert a.poll() is None                            # A was running all along
    go.touch()
    oa, ea = a.communicate(timeout=60)
    assert a.returncode == 0 and oa.count("done-") == 2, ea


# -- restarts ----------------------------------------------------------------------------------------------

@pytest.mark.torch
def test_restart_serves_a_fresh_store_on_the_same_port(tmp_path):
    """--max-restarts with the agent store: rank 1 fails attempt 0 before the rendezvous (rank 0 is left
    waiting in it); attempt 1 meets on the same held port, on a fresh store, and the all_reduce completes."""
    dump = tmp_path / "env"
    dump.mkdir()
    cp = podrun("launch", "--devices-per-host", "2", "--max-restarts", "1", "--runs-dir", str(tmp_path / "runs"),
                "--", "sh", "-c", f'echo "try $PODRUN_RESTART_COUNT port $MASTER_PORT"; '
                f'if [ $PODRUN_RESTART_COUNT = 0 ] && [ $RANK = 1 ]; then exit 3; fi; '
                f'exec {sys.executable} {ALLREDUCE} --dump {dump}')
    assert cp.returncode == 0, cp.stderr
    ports = {l.split("port ")[1] for l in cp.stdout.splitlines() if " try " in l}
    assert len(ports) == 1, cp.stdout
    assert "try 1" in cp.stdout and cp.stdout.count("sum=3 restart=1") == 2, cp.stdout
    assert [a["exit_code"] for a in summary(tmp_path / "runs")["attempts"]] == [3, 0]


# -- the held agent (--hold) ---------------------------------------------------------------------------------

def _held_agent(tmp_path, m, **kw):
    req = _request(tmp_path, ["sh", "-c", f"touch {tmp_path}/started-$RANK; sleep 30 # {m}"], **kw)
    return subprocess.Popen(req.agent_argv(0, hold=True), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, bufsize=1)


def _read_until(p, kind: str) -> protocol.Event:
    for line in p.stdout:
        ev = protocol.parse(line.rstrip("\n"))
        if ev.kind == kind:
            return ev
    raise AssertionError(f"the agent ended before a {kind} line")


def test_held_agent_reports_facts_and_starts_nothing_without_a_go(tmp_path):
    """--hold: the agent reports its host's facts (rank 0's agent: the rendezvous port, which it now holds),
    then ends with exit 0 and no worker started when the controller closes its stdin."""
    m = marker()
    p = free_port()
    proc = _held_agent(tmp_path, m, master_port=p)
    facts = Facts.decode(_read_until(proc, "probe").text)
    import podrun as podrun_pkg

    assert facts.podrun == podrun_pkg.__version__
    assert facts.python == ".".join(map(str, sys.version_info[:3]))
    assert facts.ports == (p,) and facts.ports_busy == ()
    with pytest.raises(OSError):                       # reserved from the check on
        socket.create_server(("", p)).close()
    assert not list(tmp_path.glob("started-*"))
    assert local_pids(m) == [proc.pid]                # the agent, and no worker
    proc.stdin.close()
    assert proc.wait(timeout=10) == 0
    assert not list(tmp_path.glob("started-*"))
    assert wait_until(lambda: _bindable(p), 5)         # and let go when it ends


def _bindable(port: int) -> bool:
    try:
        socket.create_server(("", port)).close()
        return True
    except OSError:
        return False


def test_held_agent_reports_its_port_busy_and_holds_nothing(tmp_path):
    m = marker()
    with socket.create_server(("", 0)) as taken:
        p = taken.getsockname()[1]
        proc = _held_agent(tmp_path, m, master_port=p)
        facts = Facts.decode(_read_until(proc, "probe").text)
        assert facts.ports == (p,) and facts.ports_busy == (p,)
        proc.stdin.close()
        assert proc.wait(timeout=10) == 0


def test_held_agent_starts_its_workers_on_go(tmp_path):
    m = marker()
    p = _held_agent(tmp_path, m, master_port=free_port())
    _read_until(p, "probe")
    p.stdin.write("G")
    p.stdin.flush()
    assert _read_until(p, "start").local_rank == 0
    assert wait_until(lambda: (tmp_path / "started-0").exists(), 10)
    p.stdin.write("T")
    p.stdin.flush()
    assert p.wait(timeout=10) == 128 + 15
    assert wait_until(lambda: local_pids(m) == [], 5)


def test_agent_without_torch_elsewhere_lets_the_port_go_before_its_workers_start(tmp_path):
    """The agent's own fallback (on a host elsewhere nothing checks its python first): a --agent-store agent
    whose python has no torch holds the port until it knows, then lets it go and takes
    TORCHELASTIC_USE_AGENT_STORE off its workers before they start, so rank 0 can bind the port."""
    py = _python_without_torch(tmp_path)
    p = free_port()
    req = _request(tmp_path, ["sh", "-c", f'echo "store=${{{ENV}:-none}}"; exec {sys.executable} -c '
                              f'"import socket; socket.create_server((\'\', {p})); print(\'bound\')"'],
                   master_port=p, options=LaunchOptions(transports=TransportOptions(python=py)))
    req = dataclasses.replace(req, agent_store=True)   # as for a host elsewhere: here the request decides it off
    argv = req.agent_argv(0, stdin_watch=False)
    assert "--agent-store" in argv
    cp = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={**os.environ, **_ROOT_ON_PATH})
    assert cp.returncode == 0, cp.stdout + cp.stderr
    out = [protocol.parse(l).text for l in cp.stdout.splitlines() if protocol.parse(l).kind == "out"]
    assert out == ["store=none", "bound"], cp.stdout


@pytest.mark.cluster
@pytest.mark.torch
def test_ssh_hosts_share_one_port_per_attempt_and_restart_on_the_next(ssh_hosts, tmp_path):
    """2 namespace hosts x 2 workers over ssh: every worker of an attempt sees the same MASTER_PORT (the
    master agent on h1 serves the store); rank 3 fails attempt 0 before the rendezvous, attempt 1 meets on
    the next port and its torchrun script's all_reduce completes on all 4 workers."""
    dump = tmp_path / "env"
    dump.mkdir()
    p = free_port(2)
    names = ssh_hosts.hosts[:2]
    cp = podrun("launch", "--hosts", ",".join(names), "--devices-per-host", "2", "--transport", "ssh",
                "--ssh-config", ssh_hosts.ssh_config_path, "--python", ssh_hosts.python, "--runs-dir",
                str(tmp_path / "runs"), "--master-port", str(p), "--max-restarts", "1", "--", "sh", "-c",
                f'echo "try $PODRUN_RESTART_COUNT port $MASTER_PORT store ${ENV}"; '
                f'if [ $PODRUN_RESTART_COUNT = 0 ] && [ $RANK = 3 ]; then exit 3; fi; '
                f'exec {sys.executable} {ALLREDUCE} --dump {dump}', timeout=150)
    assert cp.returncode == 0, cp.stderr[-3000:]
    tries = [l.split("] ", 1)[1] for l in cp.stdout.splitlines() if "] try 1 " in l]
    assert tries == [f"try 1 port {p + 1} store True"] * 4, cp.stdout
    assert cp.stdout.count("sum=10 restart=1") == 4, cp.stdout
    envs = [json.loads((dump / f"env-{r}.json").read_text()) for r in range(4)]
    # MASTER_ADDR: the address podrun's ssh reaches h1 by (the harness's ssh config: HostName <ip>)
    assert {e["MASTER_PORT"] for e in envs} == {str(p + 1)}
    assert {e["MASTER_ADDR"] for e in envs} == {ssh_hosts.address(names[0])}


def test_agent_that_cannot_take_the_port_says_so_and_leaves_rank0_to_host_itself(tmp_path):
    """Without a preflight (mpirun, srun, restarts) nothing checked the port: an agent that cannot bind it
    says why in a note, and its workers get no TORCHELASTIC_USE_AGENT_STORE (rank 0 then hosts the store,
    and fails on the busy port with torch's own error, as without podrun)."""
    with socket.create_server(("", 0)) as taken:
        p = taken.getsockname()[1]
        req = _request(tmp_path, ["sh", "-c", f'echo "store=${{{ENV}:-none}} port=$MASTER_PORT"'], master_port=p)
        cp = subprocess.run(req.agent_argv(0, stdin_watch=False), capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    events = [protocol.parse(l) for l in cp.stdout.splitlines()]
    assert [e.text for e in events if e.kind == "out"] == [f"store=none port={p}"]
    assert [e.text for e in events if e.kind == "note"] == [
        f"cannot listen on port {p} (Address already in use): rank 0 hosts its store there itself"]
