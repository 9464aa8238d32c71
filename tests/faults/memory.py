"""Peak memory of a launcher and its agent while a worker writes a lot of output (shared by the test and
bench/bench_output.py): the worker (scripts/output.py) waits at the end, so VmHWM can be read live."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from tests.harness.podrun_proc import PODRUN

OUTPUT = str(Path(__file__).parent / "scripts" / "output.py")


def vm_hwm_mb(pid: int) -> float:
    """Peak resident memory of a live process in MB (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                out.append(int(d))
    return out


def _tail_has(path: Path, text: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 256))
            return text in f.read()
    except OSError:
        return False


CONSOLE_MB_S = 50        # the pace at which the "terminal" reads podrun's stdout


def _slow_console(fd: int) -> None:
    """Read podrun's stdout as a terminal would, slower than podrun can produce it (so nothing but
    podrun's own bounds keeps its memory flat)."""
    while chunk := os.read(fd, 1 << 20):
        time.sleep(len(chunk) / (CONSOLE_MB_S * 2**20))


@contextmanager
def on_slow_console(argv: list[str], go: Path, **kw):
    """Start argv, its stdout read by a console slower than it can write (_slow_console), for a with block; when
    the block leaves, the worker's go file is there (it may end) and argv's process is ended."""
    import threading

    p = subprocess.Popen(argv, stdout=subprocess.PIPE, **kw)
    threading.Thread(target=_slow_console, args=(p.stdout.fileno(),), daemon=True).start()
    try:
        yield p
    finally:
        go.touch()
        if p.poll() is None:
            p.kill()
            p.wait()


def finish(p: subprocess.Popen, go: Path) -> int:
    """Let the waiting worker end (its go file) and wait for p's exit code."""
    go.touch()
    return p.wait(timeout=60)


def until_written(p: subprocess.Popen, written, who: str, timeout: float = 600) -> None:
    """Wait until written() says the worker's output is all written; AssertionError when p (who) ended first
    or timeout seconds passed, with the end of p's stderr when it is piped."""
    deadline = time.perf_counter() + timeout
    while not written():
        if p.poll() is not None or time.perf_counter() > deadline:
            err = p.stderr.read().decode(errors="replace") if p.stderr and p.poll() is not None else ""   # ended
            said = "\n".join(ln[:300] for ln in err.splitlines() if ln.startswith("podrun"))   # not the x's
            raise AssertionError(f"{who} ended (exit {p.returncode}) or took over {timeout} s before the output was "
                                 f"written: {said}\n{err[-500:]}")
        time.sleep(0.02)


def podrun_output(tmp: Path, mb: int, mode: str, port: int, timeout: float = 600) -> dict:
    """Run `podrun launch` with one worker writing ``mb`` MB, its stdout read at CONSOLE_MB_S; returns wall
    seconds until every byte was logged, and the peak RSS (MB) of podrun and of its agent."""
    go = tmp / f"go-{mode}-{mb}"
    runs = tmp / f"runs-{mode}-{mb}"
    t0 = time.perf_counter()
    with on_slow_console([*PODRUN, "launch", "--devices-per-host", "1", "--runs-dir", str(runs), "--master-port",
                          str(port), "--run-id", "out", "--", sys.executable, OUTPUT, str(mb), mode, str(go)], go,
                         stderr=subprocess.PIPE) as p:
        log = runs / "out" / "instance-0.log"
        until_written(p, lambda: _tail_has(log, b"output-end\n"), "podrun", timeout)
        wall = time.perf_counter() - t0
        agents = [c for c in _children(p.pid) if b"podrun.host.agent" in Path(f"/proc/{c}/cmdline").read_bytes()]
        assert len(agents) == 1, agents
        rss = {"wall_s": wall, "podrun_mb": vm_hwm_mb(p.pid), "agent_mb": vm_hwm_mb(agents[0])}
        assert finish(p, go) == 0, p.stderr.read().decode()[-2000:]
        rss["log"] = log
        return rss
