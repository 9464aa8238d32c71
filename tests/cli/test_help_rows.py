"""Every command's --help, as the installed click renders it: each row of every section has text (click 8.5 gives
an argument a help record, its metavar with the text ".", which a command's own sections must leave out), and at 80
columns no line is wider (an example the terminal would break mid-word)."""
from __future__ import annotations

import re

import click
from click.testing import CliRunner

from podrun.cli.main import COMMANDS, cli


class RecordingFormatter(click.HelpFormatter):
    """click's own formatter, keeping each (term, text) row it is given under the section it is in."""

    rows: list[tuple[str, str, str]] = []

    def section(self, name):
        self._section = name
        return super().section(name)

    def write_dl(self, rows, *args, **kw):
        rows = list(rows)
        RecordingFormatter.rows.extend((getattr(self, "_section", ""), term, text) for term, text in rows)
        return super().write_dl(rows, *args, **kw)


def test_every_help_row_of_every_command_has_text(monkeypatch):
    monkeypatch.setattr(click.Context, "formatter_class", RecordingFormatter)
    RecordingFormatter.rows = []
    runs = [[], *([name] for name in COMMANDS), ["launch", "--help-all"], ["resume"]]
    for words in runs:
        argv = words if "--help-all" in words else [*words, "--help"]
        result = CliRunner().invoke(cli, argv, terminal_width=80)
        assert result.exit_code == 0, (argv, result.output)
        wide = [line for line in result.output.splitlines() if len(line) > 80]
        assert not wide, (argv, wide)
    seen = {(s, term) for s, term, _ in RecordingFormatter.rows}
    assert ("Help", "-h, --help") in seen and any(s == "Commands" for s, _ in seen), sorted(seen)[:20]
    empty = [(s, term, text) for s, term, text in RecordingFormatter.rows if not re.search(r"[A-Za-z]{2}", text or "")]
    assert not empty, empty
