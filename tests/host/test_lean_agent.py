"""The agent's start stays lean: what it imports up to its first worker, and how the local transport starts it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.launch.helpers import podrun

ROOT = Path(__file__).resolve().parents[2]
# modules the agent must never load: the planner and the specs it reads, the controller's side, the CLI's
# libraries, ssh, torch (only its workers and rank 0's store host, separate processes, import torch)
FORBIDDEN = ("podrun.plan.decompose", "podrun.plan.placement", "podrun.plan.estimate", "podrun.plan.lr",
             "podrun.specs", "podrun.launch", "podrun.cli", "podrun.runtime", "yaml", "click", "rich", "paramiko",
             "torch", "numpy")
# run in the lean agent's interpreter (-I -S): the agent's main up to its first worker, then its modules
PROBE = """
import json, os, sys
sys.path.insert(0, sys.argv.pop(1))
from podrun.host import agent

def spawn(self):
    print(json.dumps(sorted(sys.modules)), flush=True)
    os._exit(0)
agent.Agent.spawn = spawn
agent.main(sys.argv[1:])
"""


def test_the_agent_starts_without_the_planner_torch_or_the_cli_libraries(tmp_path):
    """The agent's real start (its options parsed, the plan read, its workers' env made, its Ready line sent) under
    ``python -I -S``, as the local transport starts it, loads none of FORBIDDEN; the run itself (local transport,
    hence a lean agent) works."""
    from podrun.wire.agent_args import AgentArgs, RunAttempt

    cp = podrun("launch", "--nproc-per-node", "1", "--runs-dir", str(tmp_path), "--run-id", "r", "--",
                sys.executable, "-c", "pass")
    assert cp.returncode == 0, cp.stderr
    run_dir = tmp_path / "r"
    args = AgentArgs(RunAttempt("r", str(run_dir), str(run_dir / "plan.json"), "127.0.0.1", 1), 0,
                     (sys.executable, "-c", "pass"), stdin_timeout=None)
    out = subprocess.run([sys.executable, "-I", "-S", "-c", PROBE, str(ROOT), *args.to_argv()], capture_output=True,
                         text=True, timeout=60, cwd=tmp_path)
    lines = [l for l in out.stdout.splitlines() if l.startswith("[")]
    assert lines, (out.stdout, out.stderr)
    loaded = json.loads(lines[-1])
    assert "podrun.plan.model" in loaded and "podrun.wire.worker_env" in loaded
    assert len(loaded) > 100, loaded
    bad = [m for m in loaded if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]
    assert bad == [], bad


def test_the_progress_variable_the_agent_names_is_the_workers():
    from podrun.host.agent import PROGRESS_ENV
    from podrun.runtime.progress import FD_ENV

    assert PROGRESS_ENV == FD_ENV


def test_a_lean_agent_is_started_isolated_without_site_only_with_this_python():
    """``agent_argv(lean=True)``: with this python, ``-I -S`` and this podrun's directory first on its path (the same
    options after it); with another python (a remote host's), as before."""
    from podrun.launch.request import LaunchRequest
    from podrun.wire.agent_args import AGENT_MODULE

    base = dict(run_id="r1", run_dir="/runs/r1", plan=None, plan_path="/runs/r1/plan.json", command=("python", "t.py"),
                python=sys.executable, workdir="/w", master_addr="10.0.0.1", master_port=29500)
    plain = LaunchRequest(**base).agent_argv(0)
    lean = LaunchRequest(**base).agent_argv(0, lean=True)
    assert plain[:3] == [sys.executable, "-m", AGENT_MODULE]
    assert lean[:4] == [sys.executable, "-I", "-S", "-c"] and lean[5:] == plain[3:]
    assert f"sys.path.insert(0, {str(ROOT)!r})" in lean[4] and AGENT_MODULE in lean[4]
    other = LaunchRequest(**dict(base, python="/usr/bin/python3")).agent_argv(0, lean=True)
    assert other[:3] == ["/usr/bin/python3", "-m", AGENT_MODULE]
