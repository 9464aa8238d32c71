"""Every podrun command and every option of it is named in README.md or docs/*.md."""
from __future__ import annotations

from pathlib import Path

import click

from podrun.cli.main import COMMANDS, cli

ROOT = Path(__file__).resolve().parents[2]


def _docs_text() -> str:
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return "\n".join(p.read_text(encoding="utf-8") for p in paths)


def _undocumented() -> list[str]:
    text = _docs_text()
    ctx = click.Context(cli)
    missing = []
    for name in COMMANDS:
        if f"podrun {name}" not in text:
            missing.append(f"command `podrun {name}`")
        command = cli.get_command(ctx, name)
        for param in command.params:
            if not isinstance(param, click.Option):
                continue
            names = [o for o in (*param.opts, *param.secondary_opts) if o.startswith("--")]
            if names and not any(o in text for o in names):
                missing.append(f"`podrun {name} {names[0]}`")
    return missing


def test_every_command_and_option_is_documented():
    missing = _undocumented()
    assert not missing, "not named in README.md or docs/*.md: " + ", ".join(missing)


def test_the_check_sees_a_missing_option(monkeypatch):
    """The check can fail: an option nobody documented is reported."""
    command = cli.get_command(click.Context(cli), "plan")
    monkeypatch.setattr(command, "params", [*command.params, click.Option(["--no-such-documented-flag"])])
    assert "`podrun plan --no-such-documented-flag`" in _undocumented()
