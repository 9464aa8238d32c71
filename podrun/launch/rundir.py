"""The run directory runs/<run-id>/: plan.json, command, env.json, instance-<i>.log, summary.json."""
from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path

from podrun.launch.request import LaunchRequest, redact


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def _write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def write_plan(run_dir: str | Path, plan, name: str = "plan.json") -> Path:
    d = Path(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    p = d / name
    _write_json(p, plan.to_dict())
    return p


def env_record(request: LaunchRequest) -> dict:
    """What env.json holds: per instance, the --env given to the agent and each worker's variables."""
    return {
        "note": "set on top of each host's environment; secret-looking names redacted",
        "restart_count": request.restart_count,
        "instances": [
            {"index": inst.index, "host": inst.host, "agent_env": redact(dict(request.env)),
             "workers": [redact(e) for e in request.worker_envs(inst.index)]}
            for inst in request.instances
        ],
    }


def write_launch_files(request: LaunchRequest, described: list[tuple[str, str]]) -> None:
    """command and env.json for this attempt (rewritten on each restart)."""
    d = Path(request.run_dir)
    lines = [f"# podrun run {request.run_id} (transport {request.transport}, restart {request.restart_count})"]
    lines += [f"# {host}\n{cmd}" for host, cmd in described]
    (d / "command").write_text("\n".join(lines) + "\n")
    _write_json(d / "env.json", env_record(request))


def write_summary(run_dir: str | Path, summary: dict) -> Path:
    p = Path(run_dir) / "summary.json"
    _write_json(p, summary)
    return p
