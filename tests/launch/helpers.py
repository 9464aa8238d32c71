"""Helpers for the launch tests: find processes by a marker, read runs, watch command lines (podrun's process
itself: tests/harness/podrun_proc.py)."""
from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
import uuid
from pathlib import Path

# PODRUN and end: imported from here by the launch tests
from tests.harness.podrun_proc import PODRUN, end, run_podrun, start_podrun, with_env  # noqa: F401

HERE = Path(__file__).parent
SCRIPTS = HERE / "scripts"
ALLREDUCE = str(SCRIPTS / "torchrun_allreduce.py")


def marker() -> str:
    """A unique word to put in a command line, so its processes can be found (and proven gone)."""
    return "podrun-test-" + uuid.uuid4().hex[:10]


def podrun(*args: str, timeout: float = 90, cwd: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_podrun(*args, timeout=timeout, cwd=cwd, env=with_env(**(env or {})))


def copies_args(args, rank: int, nnodes: int, port: int, run_id: str, at: str = "127.0.0.1") -> list[str]:
    """``podrun launch ARGS`` as copy ``rank`` of one podrun per node: the copies meet on ``at``:``port`` (node rank
    0's address; this machine's loopback by default) and share the run id."""
    assert args[0] == "launch"
    return ["launch", "--nnodes", str(nnodes), "--node-rank", str(rank), "--master-addr", at,
            "--run-id", run_id, "--join-address", f"{at}:{port}", *args[1:]]


def start_copies(*args: str, nnodes: int = 2, hosts=None, env: dict | None = None
                 ) -> tuple[subprocess.Popen, list[subprocess.Popen]]:
    """``podrun launch ARGS`` as one podrun per node, started: node rank 0 (the controller, its stdout and stderr
    piped as text) and node ranks 1.. (they join it); the copies share a fresh PODRUN_JOIN_KEY. On this machine,
    or with ``hosts`` (tests/harness/netns.py) copy r in host r's namespaces, as a user's pdsh would start it;
    ``env``: more variables for every copy."""
    import secrets

    from tests.ports import free_port

    port, run_id = free_port(), marker()
    env = with_env(**(env or {}), PODRUN_JOIN_KEY=secrets.token_hex(32))
    at = "127.0.0.1" if hosts is None else hosts.address(hosts.hosts[0])

    def start(r):
        argv = copies_args(args, r, nnodes, port, run_id, at)
        if hosts is None:
            return start_podrun(*argv, env=env)
        return hosts.popen(hosts.hosts[r], [*PODRUN, *argv], env=env, text=True, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
    others = [start(r) for r in range(1, nnodes)]
    return start(0), others


def podrun_copies(*args: str, nnodes: int = 2, timeout: float = 90) -> subprocess.CompletedProcess:
    """start_copies, node rank 0 run to its end: its CompletedProcess (the others ended too)."""
    ctl, others = start_copies(*args, nnodes=nnodes)
    try:
        out, err = ctl.communicate(timeout=timeout)
        for p in others:
            p.communicate(timeout=10)
        return subprocess.CompletedProcess(ctl.args, ctl.returncode, out, err)
    finally:
        for p in (ctl, *others):
            end(p)


def podrun_popen(*args: str, cwd: str | None = None) -> subprocess.Popen:
    return start_podrun(*args, cwd=cwd)


def local_pids(word: str) -> list[int]:
    """Pids on this machine whose command line contains word (zombies excluded)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if word in cmd and state != "Z":
            out.append(int(d))
    return out


def wait_until(pred, timeout: float, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    return pred()


def wait_output(proc: subprocess.Popen, text: str, timeout: float) -> str:
    """Read proc's stdout until a line contains text; returns what was read (fails the test on timeout).

    Reads the pipe's fd itself (select + os.read), keeping lines that arrived together for the next call:
    select() on a buffered file object misses lines already pulled into its buffer."""
    import select

    fd = proc.stdout.fileno()
    pending: list[str] = proc.__dict__.setdefault("_wait_output_lines", [])
    partial = proc.__dict__.get("_wait_output_partial", b"")
    seen = ""
    deadline = time.monotonic() + timeout
    while True:
        while pending:
            line = pending.pop(0)
            seen += line
            if text in line:
                return seen
        if time.monotonic() >= deadline:
            break
        r, _, _ = select.select([fd], [], [], 0.1)
        if not r:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        partial += chunk
        *complete, partial = partial.split(b"\n")
        proc.__dict__["_wait_output_partial"] = partial
        pending.extend(c.decode(errors="replace") + "\n" for c in complete)
    raise AssertionError(f"no line with {text!r} within {timeout} s; got:\n{seen}")


def run_dir(runs: Path) -> Path:
    dirs = [d for d in runs.iterdir() if d.is_dir()]
    assert len(dirs) == 1, f"expected one run dir in {runs}, found {dirs}"
    return dirs[0]


def summary(runs: Path) -> dict:
    return json.loads((run_dir(runs) / "summary.json").read_text())


def run_on_terminal(argv: list[str], *, env: dict | None = None, cwd=None, timeout: float = 120.0,
                    answer: tuple[bytes, bytes] | None = None) -> tuple[int, str]:
    """Run argv with stdin, stdout and stderr on a real pseudo-terminal; (exit code, everything it showed).
    answer=(question, reply): write reply once the question has been shown."""
    leader, follower = pty.openpty()
    p = subprocess.Popen(argv, stdin=follower, stdout=follower, stderr=follower, env=env, cwd=cwd, close_fds=True)
    os.close(follower)
    seen, answered, end = b"", answer is None, time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            ready, _, _ = select.select([leader], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:       # EIO: every writer closed the terminal
                    break
                if not chunk:
                    break
                seen += chunk
                if not answered and answer[0] in seen:
                    os.write(leader, answer[1])
                    answered = True
            elif p.poll() is not None:
                break
        return p.wait(timeout=max(30.0, end - time.monotonic())), seen.decode(errors="replace")
    finally:
        if p.poll() is None:
            p.kill()
        os.close(leader)


ENV_UNTIL = str(SCRIPTS / "env_until.py")
SNAPSHOT_KEY = "PODRUN_SNAPSHOT_KEY"


def secret_values() -> dict[str, str]:
    """--env values for the secrets tests, new for each test: a Hugging Face-shaped token and a plain value."""
    return {"HF_TOKEN": "hf_" + uuid.uuid4().hex[:30], "PODRUN_TEST_PLAIN": "S3CRET-" + uuid.uuid4().hex}


class ArgvWatch:
    """Reads /proc/*/cmdline of every process on this machine, again and again in a thread, from ``start()`` to
    ``stop()``, and keeps each distinct (pid, command line) seen. The namespace hosts of tests/harness (network,
    UTS and mount namespaces) and the Slurm nodes share this machine's PID namespace: their processes are here too,
    the remote shells and agents as well as the ssh clients, launchers and workers."""

    def __init__(self):
        import threading

        self.seen: set[tuple[int, bytes]] = set()
        self.scans = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def scan(self) -> None:
        me = os.getpid()
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) == me:
                continue
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if cmd:
                self.seen.add((int(d), cmd))
        self.scans += 1

    def _loop(self) -> None:
        while not self._stop.wait(0.002):     # a pause, for the other tests' CPU
            self.scan()

    def start(self) -> "ArgvWatch":
        self.scan()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.scan()

    def holding(self, values) -> list[str]:
        """The command lines seen that hold any of ``values`` (NULs shown as spaces)."""
        vals = [v.encode() for v in values if v]
        return sorted({f"pid {pid}: " + cmd.replace(b"\0", b" ").decode(errors="replace")
                       for pid, cmd in self.seen if any(v in cmd for v in vals)})


def worker_saw(dump: Path, n: int, timeout: float, proc: subprocess.Popen | None = None) -> list[dict]:
    """The env dumps of ``n`` env_until.py workers (ranks 0..n-1), waited for (not past the end of ``proc``)."""
    files = [dump / f"{r}.json" for r in range(n)]
    wait_until(lambda: all(f.exists() for f in files) or (proc is not None and proc.poll() is not None), timeout)
    if not all(f.exists() for f in files):
        err = proc.stderr.read() if proc is not None and proc.poll() is not None else ""
        raise AssertionError(f"the workers did not all write their env: {sorted(p.name for p in dump.iterdir())} {err}")
    return [json.loads(f.read_text()) for f in files]


def assert_env_off_argv(watch: ArgvWatch, secrets: dict[str, str], saw: list[dict]) -> None:
    """Every worker saw each --env value (and the run's snapshot key, when it has one), and no command line
    on the machine held any of them."""
    for got in saw:
        assert {k: got.get(k) for k in secrets} == secrets, got
    keys = {got.get(SNAPSHOT_KEY) for got in saw} - {None}
    leaked = watch.holding([*secrets.values(), *keys])
    assert watch.scans > 10 and not leaked, "\n".join(leaked)


def run_and_watch(args: list[str], secrets: dict[str, str], dump: Path, workers: int, cwd=None) -> None:
    """Run `podrun launch ARGS --env NAME... -- env_until.py`, the values only in podrun's environment; while every
    worker waits, with the whole run up, assert what assert_env_off_argv says; then let the workers end."""
    env_args = [a for name in secrets for a in ("--env", name)]
    watch = ArgvWatch().start()
    p = subprocess.Popen([*PODRUN, "launch", *args, *env_args, "--", sys.executable, ENV_UNTIL, str(dump),
                          *secrets, SNAPSHOT_KEY], env={**os.environ, **secrets}, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=cwd)
    try:
        saw = worker_saw(dump, workers, 90, p)
        watch.scan()
    finally:
        (dump / "go").touch()
        out, err = p.communicate(timeout=90)
        watch.stop()
    assert p.returncode == 0, out + err
    assert_env_off_argv(watch, secrets, saw)
