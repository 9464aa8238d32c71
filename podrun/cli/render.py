"""Rendering shared by the commands: errors, JSON, tables (the only place besides cli/ commands that uses rich)."""
from __future__ import annotations

import json
import sys


def print_error(exc) -> None:
    """One paragraph on stderr: 'podrun: error: ...' then the hint."""
    msg = f"podrun: error: {exc.message}"
    if getattr(exc, "hint", None):
        msg += f"\n  hint: {exc.hint}"
    print(msg, file=sys.stderr)


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


def console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)
