"""The agent's start stays lean: what it imports up to its first worker, and how every transport starts it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from podrun.wire.agent_args import AgentArgs, RunAttempt
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
    run_dir = _plan(tmp_path)
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


# a worker's view of itself: its interpreter's flags, its path, its environment and its agent's command line
VIEW = """
import json, os, sys
parent = open(f"/proc/{os.getppid()}/cmdline", "rb").read().split(b"\\0")
json.dump({"flags": {k: getattr(sys.flags, k) for k in dir(sys.flags) if not k.startswith("_") and k.islower()
                     and not callable(getattr(sys.flags, k))},
           "path": sys.path, "env": {k: v for k, v in os.environ.items() if k != "PODRUN_STACK_DIR"},
           "agent": [a.decode() for a in parent[1:4]]}, open(sys.argv[1], "w"))
"""


def test_a_lean_agent_gives_its_workers_what_the_usual_start_gives_and_falls_back_where_podrun_is_elsewhere(
        tmp_path):
    """``agent_argv(lean=True)`` with this python: ``-I -S`` and the lean boot, the same options after it (another
    python, or without lean: the safe start, podrun.pystart). Started so (on every transport), the agent runs from
    this podrun's directory; on a host where podrun is not at that path, or is another version there, it becomes
    the safe agent (the same process). Either way its worker gets the same interpreter flags, path and environment
    as under the usual start (``python -m``): the agent's ``-I -S`` reaches no worker."""
    from podrun.launch.request import LaunchRequest
    from podrun.pystart import AGENT_MODULE, lean_boot, module_code

    base = dict(run_id="r1", run_dir="/runs/r1", plan=None, plan_path="/runs/r1/plan.json", command=("python", "t.py"),
                python=sys.executable, workdir="/w", master_addr="10.0.0.1", master_port=29500)
    plain = LaunchRequest(**base).agent_argv(0)
    lean = LaunchRequest(**base).agent_argv(0, lean=True)
    safe = ["-c", module_code(AGENT_MODULE, root=None)]
    assert plain[:3] == [sys.executable, *safe]
    assert lean[:4] == [sys.executable, "-I", "-S", "-c"] and lean[5:] == plain[3:]
    assert lean[4] == lean_boot(str(ROOT), __import__("podrun").__version__)
    other = LaunchRequest(**dict(base, python="/usr/bin/python3")).agent_argv(0, lean=True)
    assert other[:3] == ["/usr/bin/python3", *safe]

    plan = _plan(tmp_path)
    version = __import__("podrun").__version__
    starts = {"usual": [sys.executable, "-m", AGENT_MODULE], "safe": [sys.executable, *safe],
              "lean": [sys.executable, "-I", "-S", "-c", lean_boot(str(ROOT), version)],
              "elsewhere": [sys.executable, "-I", "-S", "-c", lean_boot(str(tmp_path / "nothing"), version)],
              "another version": [sys.executable, "-I", "-S", "-c", lean_boot(str(ROOT), version + ".other")]}
    views = {}
    for name, start in starts.items():
        out = tmp_path / f"{name}.json"
        args = AgentArgs(RunAttempt("r", str(plan), str(plan / "plan.json"), "127.0.0.1", 1), 0,
                         (sys.executable, "-c", VIEW, str(out)), stdin_timeout=None)
        cp = subprocess.run([*start, *args.to_argv()], capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert cp.returncode == 0, (name, cp.stdout, cp.stderr)
        views[name] = json.loads(out.read_text())
    agents = {name: views[name].pop("agent") for name in views}
    assert agents["lean"] == ["-I", "-S", "-c"], agents
    assert agents["usual"] == ["-m", AGENT_MODULE, "--plan"], agents
    assert all(agents[n] == [*safe, "--plan"] for n in ("safe", "elsewhere", "another version")), agents
    assert all(views[n] == views["usual"] for n in views), views
    assert views["usual"]["flags"]["isolated"] == 0 and views["usual"]["flags"]["no_site"] == 0
    # PYTHONDONTWRITEBYTECODE, which -I ignores, holds for the lean agent as for the usual start: no __pycache__
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "podrun", copy / "podrun", ignore=shutil.ignore_patterns("__pycache__"))
    for dont, written in (("1", False), ("", True)):
        cp = subprocess.run([sys.executable, "-I", "-S", "-c", lean_boot(str(copy), version), *args.to_argv()],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path,
                            env={**os.environ, "PYTHONDONTWRITEBYTECODE": dont})
        assert cp.returncode == 0 and any(copy.rglob("__pycache__")) is written, (dont, cp.stderr)


def test_a_warm_agent_whose_zygote_cannot_start_starts_its_workers_cold_at_once(tmp_path):
    """A lean agent finds podrun at its path, but the zygote it starts (safe: site and PYTHONPATH) ends before it
    listens (a sitecustomize on PYTHONPATH ends it): the first attempt's 2 workers of a torch program start cold at
    once, with a note naming the zygote's log, instead of waiting FIRST_WAIT_S for a zygote that never listens."""
    import podrun
    from podrun.pystart import lean_boot

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "sitecustomize.py").write_text(
        "import os, sys\nif any('podrun.host.zygote' in a for a in sys.orig_argv):\n"
        "    sys.stderr.write('not this podrun\\n'); sys.stderr.flush(); os._exit(1)\n")
    plan = _plan(tmp_path, workers=2)
    code = "import os\nif os.environ.get('NEVER'):\n    import torch\nprint('started', os.environ['LOCAL_RANK'])"
    args = AgentArgs(RunAttempt("r", str(plan), str(plan / "plan.json"), "127.0.0.1", 1), 0,
                     (sys.executable, "-c", code), stdin_timeout=None, warm=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cp = subprocess.run([sys.executable, "-I", "-S", "-c", lean_boot(str(ROOT), podrun.__version__),
                         *args.to_argv()], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                        env={**env, "PYTHONPATH": str(broken)})
    assert cp.returncode == 0, (cp.stdout, cp.stderr)
    assert "cold start: this host's zygote did not start" in cp.stdout and "zygote" in cp.stdout, cp.stdout
    assert cp.stdout.count("started") == 2, cp.stdout
    assert "not this podrun" in next((plan / "zygote").glob("*.log")).read_text()


def _plan(tmp_path: Path, workers: int = 1) -> Path:
    """The run directory of a real run of ``workers`` workers on this host (its plan.json)."""
    cp = podrun("launch", "--nproc-per-node", str(workers), "--runs-dir", str(tmp_path), "--run-id", "r", "--",
                sys.executable, "-c", "pass")
    assert cp.returncode == 0, cp.stderr
    return tmp_path / "r"
