"""The one error hierarchy: every user-facing failure is a PodrunError caught once in the CLI."""
from __future__ import annotations


class PodrunError(Exception):
    """A failure the user can act on: one paragraph, an optional hint, an exit code.

    The CLI prints ``message`` (and ``hint``) without a traceback and exits with ``exit_code``
    (2 for bad input). ``--debug`` shows the traceback as well.
    """

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None, *, exit_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\nhint: {self.hint}"


class SpecError(PodrunError):
    """A cluster spec or recipe that cannot be loaded: names the file, line and field."""


class PlanError(PodrunError):
    """A decomposition that cannot be made (devices, batch, overrides). ``reason``: why, in a few words without
    the cluster or the alternatives (a table row); the message by default."""

    def __init__(self, message: str, hint: str | None = None, *, exit_code: int | None = None,
                 reason: str | None = None):
        super().__init__(message, hint, exit_code=exit_code)
        self.reason = message if reason is None else reason


class HostError(PodrunError):
    """A host list (hostfile, scheduler env, --hosts) that is malformed or disagrees with the plan."""


class LaunchError(PodrunError):
    """A launch that could not start or that failed; exit_code is the failing worker's code."""


class PreflightError(LaunchError):
    """Preflight found problems on one or more hosts; nothing was started. ``problems`` holds one line per problem
    (each naming its host); the message lists them under ``headline``."""

    def __init__(self, problems, hint: str | None = None, *, headline: str = "preflight failed, nothing was started"):
        if isinstance(problems, str):
            raise TypeError("PreflightError takes a list of problems, not one string")
        self.problems = tuple(str(p) for p in problems)
        super().__init__(f"{headline}:\n" + "\n".join(f"  - {p}" for p in self.problems), hint)
