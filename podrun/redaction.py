"""Redaction, the one home: what podrun writes out of a run (summary.json, --json, --dry-run, env.json, command,
the console lines podrun writes itself, stacks/, `podrun stack`) passes through here, secrets hidden by name,
by value shape and by value (the secret values this process was given: remember_secret), and control characters
escaped for a terminal. Torch-free."""
from __future__ import annotations

import re

REDACTED = "<redacted>"
SECRET_RE = re.compile(   # a substring of the name (case-insensitive)
    r"TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|KEY|CREDENTIAL|PRIVATE|SIGNATURE|COOKIE|DSN", re.IGNORECASE)
SECRET_WORD_RE = re.compile(  # a whole word of the name (words split at _ - .)
    r"(?:^|[_.-])(?:PASS|PWD|PW|PAT|AUTH|OAUTH|AUTHORIZATION|BEARER|APIKEY|SALT)(?:$|[_.-])", re.IGNORECASE)
URL_PASSWORD_RE = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^:/?#@\s]*:)[^@/?#\s]+(?=@)")
URL_USER_RE = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://)[^:/?#@\s]+(?=@)")
TOKEN_SHAPE_RE = re.compile(   # well-known token formats (GitHub, GitLab, Hugging Face, OpenAI, Slack, AWS, JWT)
    r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{20,}|hf_[A-Za-z0-9]{20,}"
    r"|sk-[A-Za-z0-9_-]{20,}|xox[abposr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})")
KEYLIKE_USER_RE = re.compile(r"^[A-Za-z0-9]{16,}$")   # a DSN's key in the user part (Sentry: https://KEY@host/1)
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")   # C0 and C1 controls but tab and newline
# A known secret value shorter than this is not hidden by value: 'on', '1' or 'abc' would wreck every line they
# occur in, and are no secret to guess (the name rule still hides them under their own name).
MIN_SECRET_CHARS = 4
_known: set[str] = set()
_known_re: re.Pattern | None = None


def remember_secret(value: str) -> None:
    """Hide ``value`` (and each line of it, for a multi-line key) wherever redact_text sees it from now on in this
    process: the values of secret-named --env variables, those taken from podrun's environment, the run's keys."""
    global _known_re
    new = {v for v in (value, *(line.strip() for line in value.splitlines())) if len(v) >= MIN_SECRET_CHARS} - _known
    if new:
        _known.update(new)
        _known_re = re.compile("|".join(re.escape(v) for v in sorted(_known, key=len, reverse=True)))


def forget_secrets() -> None:
    """Forget every value remember_secret was given (a process that runs several launches, the tests)."""
    global _known_re
    _known.clear()
    _known_re = None


def secret_name(name: str) -> bool:
    """Whether a variable or option name looks like it holds a secret (DB_PASS, GITHUB_PAT, HF_TOKEN, AUTH)."""
    name = name.lstrip("-")
    return bool(SECRET_RE.search(name) or SECRET_WORD_RE.search(name))


def redact_text(text: str) -> str:
    """``text`` with credential-shaped parts hidden: the known secret values (remember_secret; the longest first,
    so that a value holding another is hidden whole), URL passwords (scheme://user:PW@host), key-like URL users
    (DSNs: https://KEY@host), and well-known token formats (ghp_..., hf_..., AKIA..., JWTs)."""
    if _known_re is not None:
        text = _known_re.sub(REDACTED, text)
    text = URL_PASSWORD_RE.sub(lambda m: m["head"] + REDACTED, text)
    text = URL_USER_RE.sub(lambda m: m["head"] + (REDACTED if KEYLIKE_USER_RE.match(m[0][len(m["head"]):])
                                                  else m[0][len(m["head"]):]), text)
    return TOKEN_SHAPE_RE.sub(REDACTED, text)


def redact_value(name: str, value: str) -> str:
    return REDACTED if secret_name(name) else redact_text(value)


def redact(env: dict[str, str]) -> dict[str, str]:
    """A copy of ``env`` with secrets hidden, by name and by value shape (redact_value)."""
    return {k: redact_value(k, v) for k, v in env.items()}


def redact_assignment(word: str) -> str:
    """NAME=VALUE with VALUE redacted as redact_value would; any other word as redact_text."""
    name, sep, value = word.partition("=")
    if sep and ENV_NAME_RE.match(name):
        return f"{name}={redact_value(name, value)}"
    return redact_text(word)


def redact_argv(argv) -> list[str]:
    """A command line with secrets hidden: ``--token=V`` / ``--password V`` (options with secret names),
    NAME=VALUE words, and credential-shaped text anywhere."""
    out: list[str] = []
    hide_next = False
    for word in argv:
        opt, sep, _ = word.partition("=")
        if hide_next and not word.startswith("-"):
            out.append(REDACTED)
            hide_next = False
        elif word.startswith("-") and len(word) > 1 and secret_name(opt):
            out.append(f"{opt}={REDACTED}" if sep else word)
            hide_next = not sep
        else:
            out.append(redact_assignment(word))
            hide_next = False
    return out


def redact_record(obj):
    """A JSON-like record (summary.json, --json, a control-socket reply) with every string redact_text'ed
    and the value of every key that names a secret hidden; a new object, the input left as it is."""
    if isinstance(obj, str):
        return redact_text(obj)
    if isinstance(obj, dict):
        return {k: REDACTED if isinstance(k, str) and isinstance(v, str) and secret_name(k) else redact_record(v)
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_record(v) for v in obj]
    return obj


def escape_controls(text: str) -> str:
    """``text`` safe for a terminal: control characters (escape sequences, carriage returns, bells) as
    ``\\xNN``; tab and newline kept."""
    return CONTROL_RE.sub(lambda m: f"\\x{ord(m[0]):02x}", text)


def shown(text: str) -> str:
    """A line podrun prints itself: secrets hidden, control characters escaped."""
    return escape_controls(redact_text(text))
