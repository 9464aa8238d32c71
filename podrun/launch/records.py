"""What a launch writes in its run directory each attempt: ``command`` and env.json (redacted), via rundir.layout."""
from __future__ import annotations

from pathlib import Path

from podrun.launch.request import LaunchRequest
from podrun.redaction import redact
from podrun.rundir import layout


def env_record(request: LaunchRequest) -> dict:
    """What env.json holds: per instance, the --env given to the agent and each worker's variables."""
    return {
        "note": "set on top of each host's environment; secrets redacted by name and by value shape "
                "(see docs/launch.md)",
        "restart_count": request.restart_count,
        "instances": [
            {"index": inst.index, "host": inst.host, "agent_env": redact(dict(request.env)),
             "workers": [redact(e) for e in request.worker_envs(inst.index)]}
            for inst in request.instances
        ],
    }


def write_launch_files(request: LaunchRequest, described: list[tuple[str, str]], env_route: str = "") -> None:
    """command and env.json for this attempt (rewritten on each restart). The command lines hold no --env
    value; ``command`` names the --env and how it reaches the agents (``env_route``), env.json holds it redacted."""
    d = Path(request.run_dir)
    lines = [f"# podrun run {request.run_id} (transport {request.transport}, restart {request.restart_count})"]
    if request.env:
        lines.append(f"# --env {' '.join(request.env_names())}: through {env_route} (redacted in env.json)")
    lines += [f"# {host}\n{cmd}" for host, cmd in described]
    layout.write_record(d / layout.COMMAND, "\n".join(lines) + "\n")
    layout.write_json(d / layout.ENV, env_record(request))

