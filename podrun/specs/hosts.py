"""Host lists given by the user: --hosts h1,h2 and hostfiles (Open MPI / DeepSpeed `host slots=N`, or plain)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from podrun.errors import HostError

_HOSTNAME = re.compile(r"^[A-Za-z0-9_.:\-\[\]]+$")


@dataclass(frozen=True)
class HostEntry:
    name: str
    slots: int | None = None         # devices on that host, when the source says


def check_name(name: str, where: str) -> str:
    if not name or not _HOSTNAME.match(name) or name.startswith("-"):
        raise HostError(f"{where}: '{name}' is not a valid host name", hint="host names are letters, digits, '.', '-', '_' (or an IP address)")
    return name


def parse_hosts_option(value: str) -> tuple[HostEntry, ...]:
    """`--hosts h1,h2` or `h1:4,h2:4` (name:slots, as in Horovod's -H)."""
    entries = []
    for part in [p.strip() for p in value.split(",")]:
        if not part:
            raise HostError(f"--hosts {value!r}: empty host name", hint="give hosts as h1,h2,h3")
        name, _, slots = part.partition(":") if part.count(":") == 1 else (part, "", "")
        entries.append(HostEntry(check_name(name, "--hosts"), _slots(slots, "--hosts", part) if slots else None))
    return _no_duplicates(entries, "--hosts")


def parse_hostfile(path: str | Path) -> tuple[HostEntry, ...]:
    """Open MPI / DeepSpeed hostfiles (`h1 slots=4`, `h1 slots=4 max_slots=8`) and plain one-per-line."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise HostError(f"hostfile {p}: cannot read it ({exc.strerror})") from None
    entries = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"hostfile {p}:{lineno}"
        name, *rest = line.split()
        slots = None
        for item in rest:
            key, eq, val = item.partition("=")
            if not eq:
                raise HostError(f"{where}: cannot read {item!r}", hint="write 'HOST' or 'HOST slots=N' per line")
            if key == "slots":
                slots = _slots(val, where, item)
            elif key not in ("max_slots", "max-slots"):
                raise HostError(f"{where}: unknown setting {key!r}", hint="only slots=N (and max_slots=N) are understood")
        entries.append(HostEntry(check_name(name, where), slots))
    if not entries:
        raise HostError(f"hostfile {p}: lists no hosts")
    return _no_duplicates(entries, f"hostfile {p}")


def _slots(val: str, where: str, item: str) -> int:
    if not val.isdigit() or int(val) < 1:
        raise HostError(f"{where}: slots must be a positive integer, got {item!r}")
    return int(val)


def _no_duplicates(entries: list[HostEntry], where: str) -> tuple[HostEntry, ...]:
    seen = set()
    for e in entries:
        if e.name in seen:
            raise HostError(f"{where}: host '{e.name}' is listed twice", hint="list each host once; use slots=N for devices")
        seen.add(e.name)
    return tuple(entries)
