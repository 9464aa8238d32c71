"""Where a run's hosts come from: --hosts, --hostfile, the scheduler allocation (Slurm nodelists,
PBS_NODEFILE, PE_HOSTFILE, SGE_JOB_HOSTLIST), else the cluster spec; the one Slurm nodelist parser."""
from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass
from typing import Mapping

from podrun.errors import HostError
from podrun.specs.hosts import (
    HOST_NAME_RULE, HostEntry, check_name, iter_lines, parse_hostfile, parse_hosts_option, read_text, shown_path,
)
from podrun.specs.limits import MAX_HOSTS


# digits in one bound of a nodelist range: 18 holds any real node number and stays far from the
# interpreter's limit on int() of long digit strings
MAX_RANGE_DIGITS = 18
# a nodelist longer than this is not one a scheduler wrote
MAX_NODELIST_CHARS = 1024 * 1024

_NAME_CHARS = re.compile(r"^[A-Za-z0-9_.:\-]+$")


@dataclass(frozen=True)
class Discovered:
    """The hosts a scheduler allocated to this job, and where podrun read them."""

    hosts: tuple[HostEntry, ...]
    source: str          # the variable read: SLURM_JOB_NODELIST, PBS_NODEFILE, PE_HOSTFILE, SGE_JOB_HOSTLIST
    scheduler: str       # slurm | pbs | uge
    path: str | None = None   # the file the variable named (PBS/UGE), None for Slurm
    # the scheduler's process slots per host (PBS_NODEFILE lines, PE_HOSTFILE slots), for display.
    # They count CPU cores or MPI ranks, not devices, so hosts[i].slots stays None: the devices per
    # host come from the cluster spec or --devices-per-host.
    scheduler_slots: tuple[int | None, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.hosts)

    def to_dict(self) -> dict:
        slots = self.scheduler_slots or (None,) * len(self.hosts)
        return {
            "source": self.source,
            "scheduler": self.scheduler,
            "path": self.path,
            "hosts": [{"name": h.name, "slots": h.slots, "scheduler_slots": s} for h, s in zip(self.hosts, slots)],
        }


def _from_counted(entries: tuple[HostEntry, ...], source: str, scheduler: str, path: str) -> Discovered:
    return Discovered(tuple(HostEntry(e.name, None) for e in entries), source, scheduler, path,
                      tuple(e.slots for e in entries))


# ---------------------------------------------------------------------------------------------
# Slurm hostlist syntax


_ITEMS = re.compile(r"(?:[^,\[\]]+|\[[^\[\],]*(?:,[^\[\],]*)*\])+(?:,|$)")


def _split_top(s: str, where: str) -> list[str]:
    """Split on commas outside brackets; brackets must balance and not nest."""
    if not s:
        return [""]
    parts, pos = [], 0
    while pos < len(s):                      # fast path: one regex match per item
        m = _ITEMS.match(s, pos)
        if not m:
            break
        parts.append(m.group().rstrip(",") if m.group().endswith(",") else m.group())
        pos = m.end()
    else:
        if s.endswith(","):
            parts.append("")
        return parts
    return _split_top_slow(s, where)


_NODELIST_HINT = "Slurm hostlists look like g[0001-0003,0007],h5"


def _split_top_slow(s: str, where: str) -> list[str]:
    """Character by character, to name the exact problem."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(s):
        if ch == "[":
            if depth:
                raise HostError(f"{where}: nested '[' at position {i + 1} in {s!r}", hint=_NODELIST_HINT)
            depth = 1
        elif ch == "]":
            if not depth:
                raise HostError(f"{where}: ']' without '[' at position {i + 1} in {s!r}", hint=_NODELIST_HINT)
            depth = 0
        elif ch == "," and not depth:
            parts.append(s[start:i])
            start = i + 1
    if depth:
        raise HostError(f"{where}: '[' is never closed in {s!r}", hint=_NODELIST_HINT)
    parts.append(s[start:])
    return parts


def _expand_range_list(body: str, item: str, where: str) -> list[str]:
    """'0001-0003,0007' -> ['0001', '0002', '0003', '0007'] (width of the lower bound kept)."""
    out: list[str] = []
    for rng in body.split(","):
        lo, dash, hi = rng.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()) or not lo.isascii() or not hi.isascii():
            raise HostError(f"{where}: bad range {_short(rng)} in {_short(item)}",
                            hint="a bracket holds numbers and ranges: [1-4,7] or [0001-0003]")
        if len(lo) > MAX_RANGE_DIGITS or len(hi) > MAX_RANGE_DIGITS:
            raise HostError(f"{where}: a number in {_short(item)} has more than {MAX_RANGE_DIGITS} digits",
                            hint="node numbers are short: g[0001-0128]")
        if not dash:
            out.append(lo)
            continue
        a, b = int(lo), int(hi)
        if b < a:
            raise HostError(f"{where}: range {rng!r} in {item!r} runs backwards", hint=f"write [{hi}-{lo}]")
        if b - a + 1 + len(out) > MAX_HOSTS:
            raise HostError(f"{where}: range {rng!r} in {item!r} expands to more than {MAX_HOSTS} hosts")
        width = len(lo)
        out.extend(str(n).zfill(width) for n in range(a, b + 1))
    return out


def _expand_item(item: str, where: str) -> list[str]:
    """One top-level item: literal text and bracket groups; groups multiply, the first varies slowest."""
    pieces = re.split(r"(\[[^\]]*\])", item)
    names = [""]
    for piece in pieces:
        if not piece:
            continue
        if piece.startswith("["):
            body = piece[1:-1]
            if not body:
                raise HostError(f"{where}: empty brackets in {item!r}")
            choices = _expand_range_list(body, item, where)
            if len(names) * len(choices) > MAX_HOSTS:
                raise HostError(f"{where}: {item!r} expands to more than {MAX_HOSTS} hosts")
            names = [n + c for n in names for c in choices]
        else:
            if not _NAME_CHARS.match(piece):
                bad = next(ch for ch in piece if not _NAME_CHARS.match(ch))
                raise HostError(f"{where}: character {bad!r} is not allowed in host name {_short(item)}",
                                hint=HOST_NAME_RULE)
            names = [n + piece for n in names]
    for name in names:
        check_name(name, where)
    return names


def _short(text: str, limit: int = 80) -> str:
    """repr of user text, cut so that an error stays one paragraph."""
    r = repr(text)
    return r if len(r) <= limit else r[: limit - 3] + "..."


def expand_nodelist(s: str, source: str = "nodelist") -> list[str]:
    """Expand Slurm's hostlist syntax: 'g[0001-0003,0007],h5' -> g0001 g0002 g0003 g0007 h5.

    Zero padding follows the lower bound; several bracket groups multiply (rack[1-2]-n[01-02]
    gives rack1-n01, rack1-n02, rack2-n01, rack2-n02); order is never changed and duplicates are
    kept. Text after the last bracket (gpu[1-2].ib) is accepted too, a superset of what Slurm
    22.05 itself accepts. A malformed list raises HostError naming ``source`` and the bad part.
    """
    text = s.strip()
    if not text:
        raise HostError(f"{source} is empty", hint="expected a Slurm hostlist such as g[0001-0003],h5")
    if len(text) > MAX_NODELIST_CHARS:
        raise HostError(f"{source}: {len(text)} characters, longer than any nodelist a scheduler writes")
    out: list[str] = []
    for item in _split_top(text, source):
        item = item.strip()
        if not item:
            raise HostError(f"{source}: empty host name in {_short(s)}", hint="remove the doubled or trailing comma")
        out.extend(_expand_item(item, source))
        if len(out) > MAX_HOSTS:
            raise HostError(f"{source}: expands to more than {MAX_HOSTS} hosts")
    return out


# only a trailing number is bracketed: Slurm (22.05) rejects text after the last bracket group
_TAIL_NUM = re.compile(r"^(.*?)([0-9]+)$")


def compress_hostlist(hosts: list[str] | tuple[str, ...]) -> str:
    """The inverse of expand_nodelist: adjacent hosts differing only in a trailing number of the same
    width share a bracket group ('g0001,g0002,g0003,h5' -> 'g[0001-0003],h5'). Order is kept, so
    expand_nodelist(compress_hostlist(x)) == list(x) for any list of plain host names, and the
    result is a hostlist Slurm itself accepts (scontrol show hostnames)."""
    groups: list[tuple[str, int, list[int]] | str] = []
    for h in hosts:
        m = _TAIL_NUM.match(h)
        if not m:
            groups.append(h)
            continue
        pre, digits = m.groups()
        n, w = int(digits), len(digits)
        last = groups[-1] if groups else None
        if isinstance(last, tuple) and last[:2] == (pre, w) and n > last[2][-1]:
            last[2].append(n)
        else:
            groups.append((pre, w, [n]))
    out = []
    for g in groups:
        if isinstance(g, str):
            out.append(g)
            continue
        pre, w, nums = g
        if len(nums) == 1:
            out.append(f"{pre}{str(nums[0]).zfill(w)}")
            continue
        ranges = []     # runs of consecutive numbers: each number less its place is the same along a run
        for _, run in itertools.groupby(enumerate(nums), lambda p: p[1] - p[0]):
            first, *rest = (str(n).zfill(w) for _, n in run)
            ranges.append(f"{first}-{rest[-1]}" if rest else first)
        out.append(f"{pre}[{','.join(ranges)}]")
    return ",".join(out)


# ---------------------------------------------------------------------------------------------
# host files


def _lines(path: str, source: str):
    """(where, line) for each non-blank line of an allocation file; where = 'SOURCE=path:lineno'."""
    try:
        text = read_text(path, f"{source}={shown_path(path)}")
    except HostError as exc:
        raise HostError(exc.message, hint=exc.hint or "run inside the job the scheduler started, "
                                                      "or unset the variable") from None
    for lineno, raw in iter_lines(text):
        line = raw.strip()
        if line:
            yield f"{source}={shown_path(path)}:{lineno}", line


def _one_host(line: str, where: str) -> tuple[str, int]:
    """A line naming one host: (host, one slot)."""
    if len(line.split()) != 1:
        raise HostError(f"{where}: expected one host name per line, got {_short(line)}")
    return check_name(line, where), 1


def _count_hosts(path: str, source: str, parse) -> dict[str, int]:
    """{host: slots} of an allocation file, in order of first appearance; ``parse(line, where)`` gives a line's
    (host, slots), and a host on several lines has its slots added."""
    counts: dict[str, int] = {}
    for where, line in _lines(path, source):
        name, slots = parse(line, where)
        counts[name] = counts.get(name, 0) + slots
        if len(counts) > MAX_HOSTS:
            raise HostError(f"{source}={shown_path(path)} lists more than {MAX_HOSTS} hosts")
    if not counts:
        raise HostError(f"{source}={shown_path(path)} lists no hosts")
    return counts


def read_pbs_nodefile(path: str, source: str = "PBS_NODEFILE") -> tuple[HostEntry, ...]:
    """PBS_NODEFILE: one line per slot (a host repeats once per MPI process); hosts deduplicated
    in order of first appearance, slots = the number of lines naming each host."""
    return tuple(HostEntry(n, c) for n, c in _count_hosts(path, source, _one_host).items())


def _pe_line(line: str, where: str) -> tuple[str, int]:
    fields = line.split()
    if len(fields) < 2 or not (fields[1].isascii() and fields[1].isdigit()) or len(fields[1]) > 9 \
            or int(fields[1]) < 1:
        raise HostError(f"{where}: expected 'HOST SLOTS QUEUE PROCESSORS', got {_short(line)}",
                        hint="Grid Engine writes e.g. 'g0001.abci.local 40 gpu@g0001 UNDEFINED'")
    return check_name(fields[0], where), int(fields[1])


def read_pe_hostfile(path: str, source: str = "PE_HOSTFILE") -> tuple[HostEntry, ...]:
    """Grid Engine PE_HOSTFILE: 'host slots queue processor-range' per line; a host on several
    lines (several queues) has its slots added."""
    return tuple(HostEntry(n, c) for n, c in _count_hosts(path, source, _pe_line).items())


def read_sge_hostlist(path: str, source: str = "SGE_JOB_HOSTLIST") -> tuple[HostEntry, ...]:
    """ABCI's SGE_JOB_HOSTLIST: a file with one host per line (repeats are dropped, order kept)."""
    return tuple(HostEntry(n, None) for n in _count_hosts(path, source, _one_host))


# ---------------------------------------------------------------------------------------------


def discover(environ: Mapping[str, str]) -> Discovered | None:
    """The hosts of the scheduler allocation this process runs in, or None outside one.

    Looked for in this order: SLURM_JOB_NODELIST (or the older SLURM_NODELIST), PBS_NODEFILE,
    PE_HOSTFILE, SGE_JOB_HOSTLIST. An empty variable counts as unset; a malformed one is a
    HostError naming it. Host slots are left None (scheduler slots are cores or ranks, not
    devices); the counted slots are in Discovered.scheduler_slots.
    """
    for var in ("SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        value = environ.get(var, "").strip()
        if value:
            names = expand_nodelist(value, var)
            return Discovered(tuple(HostEntry(n, None) for n in dict.fromkeys(names)), var, "slurm")
    for var, read, scheduler in (("PBS_NODEFILE", read_pbs_nodefile, "pbs"), ("PE_HOSTFILE", read_pe_hostfile, "uge")):
        value = environ.get(var, "").strip()
        if value:
            return _from_counted(read(value), var, scheduler, value)
    value = environ.get("SGE_JOB_HOSTLIST", "").strip()
    if value:
        return Discovered(read_sge_hostlist(value), "SGE_JOB_HOSTLIST", "uge", value)
    return None


# ---------------------------------------------------------------------------------------------
# host resolution: which source wins, and the cluster spec with those hosts


@dataclass(frozen=True)
class HostSource:
    """The hosts of a run and where they were found."""

    hosts: tuple[HostEntry, ...]
    source: str             # "--hosts", "--hostfile FILE", "SLURM_JOB_NODELIST", "cluster spec NAME"
    scheduler: str = "none"
    discovered: Discovered | None = None    # the allocation, when the hosts came from one

    @property
    def explicit(self) -> bool:
        """True unless the hosts are the cluster spec's own."""
        return not self.source.startswith("cluster spec ")


def host_source(cluster, hosts_opt: str | None = None, hostfile: str | None = None,
                environ: Mapping[str, str] | None = None, discovered: Discovered | None = None) -> HostSource:
    """Where the hosts come from: --hosts, --hostfile, the scheduler's allocation, else the cluster spec.

    The allocation is discovered here, once per command (or given as ``discovered`` by a caller that
    already looked); callers read it from HostSource.discovered.
    """
    if hosts_opt is not None and hostfile is not None:
        raise HostError("give either --hosts or --hostfile, not both")
    if hosts_opt is not None:
        return HostSource(parse_hosts_option(hosts_opt), "--hosts")
    if hostfile is not None:
        return HostSource(parse_hostfile(hostfile), f"--hostfile {hostfile}")
    found = discovered if discovered is not None else discover(os.environ if environ is None else environ)
    if found is not None:
        return HostSource(found.hosts, found.source, found.scheduler, found)
    return HostSource(tuple(HostEntry(h) for h in cluster.hosts), f"cluster spec {cluster.name}")


def hosts_for_cluster(spec, src: HostSource, *, devices_per_host: int | None, nodes: int | None,
                      spec_named: bool):
    """The cluster spec with the hosts of ``src`` and the devices per host they imply.

    Returns (spec, devices_per_host or None). A hostfile's or --hosts' slots give the devices per
    host when no cluster spec was named (``spec_named`` False) and --devices-per-host is not given;
    otherwise they must agree with it.
    """
    if not src.explicit:
        return spec, devices_per_host
    slots = {e.slots for e in src.hosts if e.slots is not None}
    if len(slots) > 1:
        raise HostError(f"{src.source}: hosts have different slot counts {sorted(slots)}",
                        hint="podrun places the same number of devices on every host")
    dph = spec.devices_per_host if devices_per_host is None else devices_per_host
    if slots and devices_per_host is None and not spec_named:
        dph = slots.pop()          # an allocation or hostfile with no cluster spec: trust its slots
    elif slots and slots != {dph}:
        raise HostError(
            f"{src.source} gives {sorted(slots)[0]} slots per host but the plan needs {dph} devices per host "
            f"(cluster {spec.name})",
            hint="fix the slots in the hostfile, or pass --devices-per-host to match it",
        )
    hosts = tuple(e.name for e in src.hosts)
    if nodes is not None and nodes > len(hosts):
        raise HostError(
            f"the plan asks for {nodes} hosts but {src.source} gives only {len(hosts)}",
            hint=f"use --nodes {len(hosts)} or fewer",
        )
    return spec.with_hosts(hosts, dph), dph
