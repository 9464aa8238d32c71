"""Host names and the host lists given by the user: the one host-name rule, --hosts h1,h2 and hostfiles."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from podrun.errors import HostError
from podrun.specs.limits import MAX_HOSTS, MAX_PER_HOST
from podrun.specs.textfile import read_bounded_text

# A host name, an IPv4 or an IPv6 address: letters, digits, '-', '.', '_' and ':' (IPv6), no
# leading '-' (it would read as an option to mpirun, srun or ssh), at most 253 characters (DNS).
MAX_HOST_NAME = 253
_HOSTNAME = re.compile(r"[A-Za-z0-9_.:\-]+")
HOST_NAME_RULE = (f"a host name is letters, digits, '.', '-', '_' (':' in an IPv6 address), "
                  f"does not start with '-', and has at most {MAX_HOST_NAME} characters")

# Files podrun reads host names from are small; a bigger one is not a host list.
MAX_HOSTFILE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class HostEntry:
    name: str
    slots: int | None = None         # devices on that host, when the source says


def check_name(name: str, where: str) -> str:
    """The one host-name check: every host name podrun reads passes here (or HostError naming ``where``)."""
    if isinstance(name, str) and name.startswith("[") and len(name) <= MAX_HOST_NAME:
        raise HostError(f"{where}: {name!r}: write an IPv6 address without brackets or a port (e.g. fd00::2)",
                        hint="the ssh port comes from the ssh config (Port), the rendezvous port from --master-port")
    if not isinstance(name, str) or not name or len(name) > MAX_HOST_NAME or name.startswith("-") \
            or not _HOSTNAME.fullmatch(name):
        shown = repr(name) if len(repr(name)) <= 80 else repr(name)[:77] + "..."
        raise HostError(f"{where}: {shown} is not a valid host name", hint=HOST_NAME_RULE)
    return name


def shown_path(path: str | Path, limit: int = 160) -> str:
    """A user-given path or name for a message: quoted when odd, cut in the middle when long."""
    text = str(path)
    if len(text) > limit:
        text = text[: limit // 2] + "..." + text[-limit // 4:]
    return text if text.isprintable() else repr(text)[1:-1]


def read_text(path: str | Path, what: str) -> str:
    """A host file's text: bounded in size, UTF-8, no control characters; HostError naming ``what``."""
    text = read_bounded_text(path, what=what, limit=MAX_HOSTFILE_BYTES, error=HostError, too_big="not a host list",
                             not_utf8_hint="a host list is plain text, one host per line")
    m = _CONTROL.search(text)
    if m:
        raise HostError(f"{what}:{text.count(chr(10), 0, m.start()) + 1}: control character {m.group()!r} in a host list",
                        hint="a host list is plain text, one host per line")
    return text


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def iter_lines(text: str):
    """(lineno, line) of ``text`` without building a list of every line at once."""
    for lineno, m in enumerate(re.finditer(r"[^\n]*\n|[^\n]+$", text), 1):
        yield lineno, m.group().rstrip("\r\n")


def _name_slots(part: str, where: str) -> HostEntry:
    """`host` or `host:N` (N slots; MPICH's hostfile line, Horovod's -H item); an IPv6 address (several ':') is a
    name."""
    name, _, slots = part.partition(":") if part.count(":") == 1 else (part, "", "")
    return HostEntry(check_name(name, where), _slots(slots, where, part) if slots else None)


def parse_hosts_option(value: str, option: str = "--hosts") -> tuple[HostEntry, ...]:
    """`--hosts h1,h2` or `h1:4,h2:4` (name:slots, as in Horovod's -H); a host given twice has its slots added
    (merge_repeated); errors name ``option``, the option typed (--hosts, --spare-hosts)."""
    parts = [p.strip() for p in value.split(",")]
    if len(parts) > MAX_HOSTS:
        raise HostError(f"{option} lists {len(parts)} hosts, more than {MAX_HOSTS}")
    entries = []
    for part in parts:
        if not part:
            raise HostError(f"{option} {value[:80]!r}: empty host name", hint="give hosts as h1,h2,h3")
        entries.append(_name_slots(part, option))
    return merge_repeated(entries, option)


def parse_hostfile(path: str | Path) -> tuple[HostEntry, ...]:
    """Open MPI / DeepSpeed hostfiles (`h1 slots=4`, `h1 slots=4 max_slots=8`), MPICH's (`h1:4`) and plain
    one-per-line; a host on several lines has its slots added (merge_repeated)."""
    p = Path(path)
    text = read_text(p, f"hostfile {shown_path(p)}")
    entries = []
    for lineno, raw in iter_lines(text):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"hostfile {shown_path(p)}:{lineno}"
        first, *rest = line.split()
        entry = _name_slots(first, where)
        slots = entry.slots
        for item in rest:
            key, eq, val = item.partition("=")
            if not eq:
                raise HostError(f"{where}: cannot read {item[:80]!r}",
                                hint="write 'HOST', 'HOST slots=N' or 'HOST:N' per line")
            if key == "slots" and entry.slots is None:
                slots = _slots(val, where, item)
            elif key in ("max_slots", "max-slots"):
                _slots(val, where, item)
            elif key == "slots":
                raise HostError(f"{where}: {first[:80]!r} and {item[:80]!r} both give the slots",
                                hint="write 'HOST slots=N' (Open MPI) or 'HOST:N' (MPICH), not both")
            else:
                raise HostError(f"{where}: unknown setting {key[:80]!r}", hint="only slots=N (and max_slots=N) are understood")
        entries.append(HostEntry(entry.name, slots))
        if len(entries) > MAX_HOSTS:
            raise HostError(f"hostfile {shown_path(p)}: lists more than {MAX_HOSTS} hosts")
    if not entries:
        raise HostError(f"hostfile {shown_path(p)}: lists no hosts")
    return merge_repeated(entries, f"hostfile {shown_path(p)}")


# slots count devices or processes on one host
MAX_SLOTS = MAX_PER_HOST


def _slots(val: str, where: str, item: str) -> int:
    if not (val.isascii() and val.isdigit()) or len(val) > 6 or not 1 <= int(val) <= MAX_SLOTS:
        raise HostError(f"{where}: slots must be an integer from 1 to {MAX_SLOTS}, got {item[:80]!r}")
    return int(val)


def merge_repeated(entries: list[HostEntry], where: str) -> tuple[HostEntry, ...]:
    """One entry per host, in order of first appearance. A host listed more than once has its slots added, as
    Open MPI adds a hostfile's repeated lines (and the schedulers' files repeat a host per slot): an entry without
    slots counts 1 there. A host listed once keeps its slots, or none (the plan's devices per host)."""
    merged: dict[str, list[HostEntry]] = {}
    for e in entries:
        merged.setdefault(e.name, []).append(e)
    out = []
    for name, same in merged.items():
        total = sum(e.slots if e.slots is not None else 1 for e in same)
        if len(same) > 1 and total > MAX_SLOTS:
            raise HostError(f"{where}: host '{name}' is listed {len(same)} times, {total} slots in all, more than "
                            f"{MAX_SLOTS}", hint="a host's slots are added over its lines (as Open MPI does)")
        out.append(same[0] if len(same) == 1 else HostEntry(name, total))
    return tuple(out)
