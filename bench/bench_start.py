"""A host's start, measured: the agent's CPU up to its Ready line, started safe (``python -c`` with podrun.pystart's
boot: site, not the working directory) and lean (``python -I -S -c`` with podrun's directory, as every transport
starts it with the controller's python; and on a host where podrun is not at that path, where the lean boot becomes
the safe start),
beside the bare interpreter (``python -c pass``, ``python -I -S -c pass``); interleaved, the median of N runs of
each. Each agent is given a real plan (one worker, ``python -c pass``) and read until its ``ready`` line: its
CPU time (every thread's /proc schedstat) are taken then. Also the file-system metadata
system calls (strace -f -c -e trace=%file, where strace is installed) of a cold local launch whose workers import
torch, at 1, 4 and 8 workers: launch to every rank running, per host and per rank.
Also the whole launch under the real Slurm harness, agents that join through srun, cold vs once per host.
`python -m bench.bench_start agent [N]`, `metadata [1,4,8]`, `wall [N]` or `srun [N [NODES]]` (the Slurm
harness); with BENCH_START_BASE=DIR (a checkout of another commit) the agent of that checkout too, started as before."""
from __future__ import annotations

import json
import os
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _cpu_ms(pid: int) -> float:
    """The CPU time of every thread of ``pid`` (schedstat's nanoseconds: /proc/<pid>/stat counts 10 ms ticks)."""
    return sum(int((d / "schedstat").read_text().split()[0]) for d in Path(f"/proc/{pid}/task").iterdir()) / 1e6


def _bare_ms(argv: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000.0


def _agent_ms(argv: list[str]) -> float:
    """The agent's CPU when its ready line is read (then it is ended: its worker is ``python -c pass``)."""
    from podrun import pystart

    p = pystart.popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                      cwd=tempfile.gettempdir(), start_new_session=True)
    try:
        for line in p.stdout:
            if b" ready " in line or line.split(b" ", 2)[1:2] == [b"ready"]:
                return _cpu_ms(p.pid)
        raise RuntimeError(f"no ready line from {argv[:4]}")
    finally:
        p.kill()
        p.wait()


def agent_argvs(tmp: str) -> dict[str, list[str]]:
    """The agent's command lines, before and lean (podrun here, and not at the lean boot's path: ``tmp``), for a
    one-worker plan written under ``tmp``."""
    from podrun.plan.model import Placement, Plan  # noqa: F401 - the plan comes from a real dry launch instead
    from podrun.wire.agent_args import AgentArgs, RunAttempt

    runs = Path(tmp) / "runs"
    subprocess.run([sys.executable, "-m", "podrun", "launch", "--nproc-per-node", "1", "--runs-dir", str(runs),
                    "--run-id", "plan", "--", sys.executable, "-c", "pass"], check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    run_dir = runs / "plan"
    args = AgentArgs(RunAttempt("plan", str(run_dir), str(run_dir / "plan.json"), "127.0.0.1", 1), 0,
                     (sys.executable, "-c", "pass"), stdin_timeout=None)
    from podrun import pystart

    return {"agent (safe: python -c, site)": pystart.agent(sys.executable, args.to_argv(), lean=False),
            "agent lean (-I -S)": pystart.agent(sys.executable, args.to_argv(), lean=True),
            "agent lean, podrun elsewhere (-I -S, then safe)": pystart.isolated(sys.executable, args.to_argv(),
                                                                                 root=tmp)}


def agent(n: int = 15) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        runs = {"python -c pass": ([sys.executable, "-c", "pass"], _bare_ms),
                "python -I -S -c pass": ([sys.executable, "-I", "-S", "-c", "pass"], _bare_ms),
                **{k: (v, _agent_ms) for k, v in agent_argvs(tmp).items()}}
        base = os.environ.get("BENCH_START_BASE")       # another checkout (the base commit): its agent, as before
        if base:
            from podrun import pystart

            options = runs["agent (safe: python -c, site)"][0][3:]
            runs["agent at BENCH_START_BASE (safe, that podrun first)"] = (
                pystart.safe(sys.executable, *options, module=pystart.AGENT_MODULE, root=base), _agent_ms)
        got: dict[str, list[float]] = {k: [] for k in runs}
        os.environ["PYTHONPATH"] = str(ROOT)         # the agent started as before finds this podrun
        for _ in range(n):
            for name, (argv, how) in runs.items():
                got[name].append(how(argv))
    return {k: {"median_ms": round(statistics.median(v), 1), "min_ms": round(min(v), 1)} for k, v in got.items()}


SCRIPT = str(ROOT / "bench" / "scripts" / "import_torch_once.py")


def _calls(path: Path) -> int:
    """The system calls one process made (strace -ff's file of it), its exit and signals left out."""
    return sum(1 for line in path.read_text(errors="replace").splitlines() if not line.startswith(("+++", "---")))


def _launch(runs: Path, n: int, warm: bool) -> list[str]:
    return [sys.executable, "-m", "podrun", "launch", "--nproc-per-node", str(n), "--runs-dir", str(runs), "--run-id",
            "r", *([] if warm else ["--no-warm"]), "--", sys.executable, SCRIPT]


def _cpu_s(n: int) -> float:
    """The CPU seconds of a whole cold launch (untraced): the controller, the agent, the store host, every rank."""
    with tempfile.TemporaryDirectory() as tmp:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(_launch(Path(tmp) / "runs", n, False), check=True, capture_output=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 2)


def _traced(tmp: str, n: int, warm: bool) -> dict:
    """One local launch of ``n`` workers importing torch under ``strace -ff -e trace=%file``: the calls of each kind
    of process. Cold (--no-warm): the workers each import torch. Warm (the default): with several workers, the first
    attempt's workers are forked by the host's zygote, which imported torch (and the recipes' modules) once; one
    worker starts cold."""
    runs = Path(tmp) / "runs"
    cp = subprocess.run(["strace", "-ff", "-s", "300", "-e", "trace=%file", "-o", f"{tmp}/s",
                         *_launch(runs, n, warm)], capture_output=True, text=True,
                        env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    if cp.returncode != 0:
        raise RuntimeError(f"the launch failed (exit {cp.returncode}): {cp.stderr[-2000:]}")
    log = (runs / "r" / "instance-0.log").read_text() if (runs / "r" / "instance-0.log").exists() else ""
    forked = {int(p) for p in re.findall(r"local rank \d+ forked by the zygote \(pid \d+\) as pid (\d+)", log)}
    store = {int(p) for p in re.findall(r"store host forked by the zygote \(pid \d+\) as pid (\d+)", log)}
    zygote = {int(p) for p in re.findall(r"forked by the zygote \(pid (\d+)\)", log)}
    kinds = {"controller": 0, "agent": 0, "store host": 0, "cold rank": 0, "zygote": 0, "forked store host": 0,
             "forked rank": 0, "other": 0}
    agents = 0
    for f in Path(tmp).glob("s.*"):
        pid, text = int(f.suffix[1:]), f.read_text(errors="replace")
        first = next((l for l in text.splitlines() if l.startswith("execve(")), "")   # what it became
        kind = ("forked rank" if pid in forked else "forked store host" if pid in store else
                "zygote" if pid in zygote or "podrun.host.zygote" in first else
                "agent" if "podrun.host.agent" in first else "controller" if '"launch"' in first else
                "store host" if "TCPStore" in first else "cold rank" if SCRIPT in first else "other")
        kinds[kind] += _calls(f)
        agents += kind == "agent"
    return {"exit": cp.returncode, **kinds, "agents": agents}


def metadata(counts=(1, 4, 8)) -> dict:
    """Cold vs once per host (the zygote), at each worker count: file-system metadata calls (strace's %file class:
    open, stat, access, readlink, ...) by kind of process, and a host's total from launch to every rank running."""
    if shutil.which("strace") is None:
        return {"skipped": "strace is not installed"}
    out = {}
    for n in counts:
        for warm in (False, True):
            with tempfile.TemporaryDirectory() as tmp:
                got = _traced(tmp, n, warm)
            # a host's calls: its agent, rank 0's store host, its ranks, and the zygote where one forked them
            ranks = got["forked rank"] + got["cold rank"]
            got["host"] = (round(got["agent"] / max(1, got["agents"])) + ranks + got["zygote"]
                           + got["forked store host"] + got["store host"])
            got["per rank"] = round(ranks / n)
            if not warm:      # the zygote is detached (not this launch's child): its CPU is not counted here
                got["launch CPU s (untraced)"] = _cpu_s(n)
            out[f"{n} {'once per host' if warm else 'cold'}"] = got
    return out


def wall(n: int = 4, rounds: int = 5) -> dict:
    """Cold (--no-warm) vs once per host (the default), ``n`` workers importing torch, interleaved: the whole
    launch's wall seconds (from podrun's start to its exit: every rank imported torch and ended), medians."""
    got: dict[str, list[float]] = {"cold": [], "once per host": []}
    for _ in range(rounds):
        for name, warm in (("cold", False), ("once per host", True)):
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.monotonic()
                subprocess.run(_launch(Path(tmp) / "runs", n, warm), check=True, capture_output=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
                got[name].append(time.monotonic() - t0)
    med = {k: round(statistics.median(v), 2) for k, v in got.items()}
    return {"workers": n, "rounds": rounds, "median_s": med, "ratio": round(med["once per host"] / med["cold"], 3)}


def srun(n: int = 4, rounds: int = 3, nodes: int = 2) -> dict:
    """Agents that join, cold (--no-warm) vs once per host (the default), beside srun starting the same workers
    directly (the peer), interleaved: `podrun launch --transport srun` in a job of ``nodes`` nodes of the real Slurm
    harness, ``n`` workers a node importing torch; the launch's wall seconds inside the job (the launcher's start to
    its exit: every rank imported torch and ended), medians."""
    from tests.harness.slurm import SlurmCluster

    got: dict[str, list[float]] = {"cold": [], "once per host": [], "srun": []}
    timed = ("import subprocess, sys, time; t = time.monotonic(); rc = subprocess.run(sys.argv[1:]).returncode; "
             "print('WALL', time.monotonic() - t); sys.exit(rc)")
    # the nodes declare a CPU for each of their n tasks (srun lays out n a node), as the scale bench's do
    cpus = max(n, os.cpu_count() or 1)
    with SlurmCluster(nodes=nodes, cpus_per_node=cpus) as sl, tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            podrun = [sys.executable, "-m", "podrun", "launch", "--transport", "srun", "--nodes", str(nodes),
                      "--devices-per-host", str(n), "--runs-dir", f"{tmp}/runs"]
            peer = ["srun", f"--nodes={nodes}", f"--ntasks-per-node={n}", f"--ntasks={nodes * n}"]
            for name, first in (("cold", [*podrun, "--no-warm", "--"]), ("once per host", [*podrun, "--"]),
                                ("srun", peer)):
                out = Path(tmp) / f"{r}-{name}.out"
                launch = [sys.executable, "-c", timed, *first, sys.executable, SCRIPT]
                # one allocation for each subject: n tasks a node (srun's step needs n CPUs a node; podrun's, 1)
                job = sl.run(["sbatch", "--wait", f"-N{nodes}", f"--ntasks-per-node={n}", f"--output={out}",
                              f"--chdir={tmp}", "--wrap", shlex.join(launch)], env={"PYTHONPATH": str(ROOT)},
                             timeout=600, check=False)
                wall = re.search(r"^WALL (\S+)$", out.read_text(), re.MULTILINE)
                if job.returncode != 0 or wall is None:
                    raise RuntimeError(f"the {name} job failed (sbatch exit {job.returncode}): "
                                       f"{out.read_text()[-2000:]}")
                got[name].append(float(wall[1]))
    med = {k: round(statistics.median(v), 2) for k, v in got.items()}
    return {"nodes": nodes, "workers": n, "rounds": rounds, "median_s": med,
            "ratio": round(med["once per host"] / med["cold"], 3),
            "ratio_to_srun": {k: round(med[k] / med["srun"], 3) for k in ("cold", "once per host")}}


def main(argv: list[str]) -> int:
    what = argv[0] if argv else "agent"
    if what == "agent":
        print(json.dumps(agent(int(argv[1]) if len(argv) > 1 else 15), indent=1))
    elif what == "wall":
        print(json.dumps(wall(int(argv[1]) if len(argv) > 1 else 4), indent=1))
    elif what == "srun":
        print(json.dumps(srun(int(argv[1]) if len(argv) > 1 else 4, nodes=int(argv[2]) if len(argv) > 2 else 2),
                         indent=1))
    else:
        print(json.dumps(metadata(tuple(int(x) for x in argv[1].split(",")) if len(argv) > 1 else (1, 4, 8)),
                         indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
