"""torchrun's options mapped onto podrun launch's own, pure: reconcile, OwnOptions (in the user's words), refusals."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping

from podrun.errors import LaunchError
from podrun.launch.instance_logs import RankFiles
from podrun.launch.torchrun_cli import TorchrunOptions, pet_name

RDZV_DEFAULT_PORT = 29400          # torchrun's port for an --rdzv-endpoint given without one
# torchrun's options that podrun takes with a meaning of its own or none needed (the table in docs/launch.md)
RDZV_BACKENDS = ("c10d", "static")
START_METHODS = ("spawn", "fork", "forkserver")
# torchrun's --numa-binding modes (torch.numa.binding.AffinityMode) -> the nearest --cpu-bind: podrun's auto gives
# each local rank its own contiguous share of the cores of its NUMA domain (torchrun's exclusive); node, socket and
# core-complex, which let a domain's ranks share its cores, are bound to those shares too (docs/launch.md)
NUMA_BINDING_MODES = {"node": "auto", "socket": "auto", "exclusive": "auto", "core-complex": "auto"}


def pet_own_options(pet: Mapping[str, str], spelled: Mapping[str, str]) -> "OwnOptions":
    """podrun's own options that torchrun reads from PET_ too (--max-restarts, --master-addr, --master-port)."""
    out = {}
    for name, text in pet.items():
        if name == "master_addr":
            out[name] = text
            continue
        number = _number(int, text, lambda n: n >= 0 and (name != "master_port" or n <= 65535))
        if number is None:
            what = "a TCP port" if name == "master_port" else "a number of restarts"
            raise LaunchError(f"{spelled.get(name, pet_name(name))}={text!r} is not {what}",
                              hint=f"fix or unset {pet_name(name)} (torchrun's --{name.replace('_', '-')} from the "
                                   "environment)")
        out[name] = number
    return OwnOptions(**out)


@dataclass(frozen=True)
class OwnOptions:
    """podrun launch's own options that torchrun's map onto (None: not given). ``words``: (podrun's option, its
    value, what the user wrote) for each mapped value, so that a later error speaks in the user's words."""

    devices_per_host: int | None = None
    nodes: int | None = None
    elastic_min: int | None = None
    max_restarts: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    run_id: str | None = None
    runs_dir: str | None = None
    grace: float | None = None
    heartbeat: float | None = None
    heartbeat_misses: int | None = None
    local_ranks: frozenset[int] | None = None   # --local-ranks-filter: the console shows these local ranks only
    rdzv_id: str | None = None                  # every worker's TORCHELASTIC_RUN_ID (None: the run id)
    role: str | None = None                     # every worker's ROLE_NAME (None: torchrun's "default")
    cpu_bind: str | None = None                 # --cpu-bind as given (None: none), or torchrun's --numa-binding's
    rank_files: RankFiles = RankFiles()         # torchrun's --tee and --redirects
    words: tuple[tuple[str, str, str], ...] = field(default=(), compare=False)

    def in_user_words(self, exc):
        """``exc`` (a PodrunError) with podrun's option names replaced by what the user wrote: ``--nodes 2`` by
        ``--nnodes 1:2``, a bare ``--nodes`` by ``--nnodes``."""
        if not self.words:
            return exc
        import re

        def fix(text):
            if text is None:
                return None
            first = {theirs: ours for ours, _, theirs in reversed(self.words)}     # the first option each maps
            for ours, value, theirs in self.words:
                text = text.replace(f"{ours} {value}", theirs)
                name = theirs.split("=")[0].split(" ")[0]
                if name.startswith("PET_") and first[theirs] == ours:   # a variable: NAME=VALUE, not --nodes N
                    text = re.sub(re.escape(ours) + r" (\S+)", name + r"=\1", text)
                if name.startswith(("-", "PET_")) and first[theirs] == ours:   # a bare name: the option it maps
                    text = re.sub(re.escape(ours) + r"(?![\w-])", name, text)     # onto first
            return text

        new = type(exc).__new__(type(exc))
        new.__dict__.update(exc.__dict__)
        new.message, new.hint = fix(exc.message), fix(exc.hint)
        new.args = (new.message,)
        return new


def not_supported(option: str, why: str, use: str) -> LaunchError:
    """torchrun's option podrun does not take: one line, exit 2."""
    return LaunchError(f"torchrun's {option} is not supported by podrun: {why}, use {use}")


def reconcile(tr: TorchrunOptions, own: OwnOptions, *, cpu_count: int, pet_own: OwnOptions = OwnOptions()
              ) -> OwnOptions:
    """podrun's options with torchrun's mapped in (the table in docs/launch.md). A torchrun option and
    podrun's own option of the same meaning must agree, unless the torchrun one came from a PET_ variable (then
    the command line wins, as under torchrun); one podrun has no meaning for is refused, saying why.
    ``pet_own``: podrun's own options that torchrun also has, read from PET_ (--max-restarts, --master-addr,
    --master-port): they fill what is still unset at the end."""
    out = own
    _refuse_unsupported(tr)
    if tr.nproc_per_node is not None:
        out = _set(out, "devices_per_host", _nproc(tr, cpu_count), tr, "nproc_per_node", "--devices-per-host")
    if tr.nnodes is not None and not (tr.from_env("nnodes") and out.nodes is not None):
        low, high = _nnodes(tr)
        out = _set(out, "nodes", high, tr, "nnodes", "--nodes")
        if low != high:
            out = _set(out, "elastic_min", low, tr, "nnodes", "--elastic")
    backend = _backend(tr)
    if tr.standalone:
        if out.nodes is not None and out.nodes != 1:
            raise LaunchError(f"{tr.said('standalone', True)} runs one node, and {_own_said(tr, out, 'nodes')} "
                              f"asks for {out.nodes}", hint=f"drop {tr.said('standalone')} to run on several hosts")
        if tr.rdzv_endpoint is not None and not tr.from_env("rdzv_endpoint"):
            raise LaunchError(f"{tr.said('standalone', True)} picks its own rendezvous port on this machine, and "
                              f"{tr.said('rdzv_endpoint', tr.rdzv_endpoint)} names one",
                              hint=f"drop {tr.said('rdzv_endpoint')} (torchrun ignores it with --standalone), or "
                                   f"drop {tr.said('standalone')} to meet at {tr.rdzv_endpoint}")
        if own.master_port is not None and own.master_port != 0:
            raise LaunchError(f"{tr.said('standalone', True)} picks a free rendezvous port on this machine, and "
                              f"{tr.said('master_port', own.master_port)} names one",
                              hint=f"drop {tr.said('master_port')} (torchrun ignores it with --standalone), or drop "
                                   f"{tr.said('standalone')} to use port {own.master_port}")
        said = tr.said("standalone", True)
        out = replace(out, nodes=1, master_port=0,
                      words=(*out.words, ("--nodes", "1", said), ("--master-port", "0", said)))
    if tr.rdzv_endpoint is not None and not tr.standalone:
        host, port = parse_endpoint(tr.rdzv_endpoint, tr.said("rdzv_endpoint"))
        out = _set(out, "master_addr", host, tr, "rdzv_endpoint", "--master-addr")
        out = _set(out, "master_port", port, tr, "rdzv_endpoint", "--master-port")
    if tr.rdzv_id is not None and not tr.standalone:    # --standalone: torchrun's own id, here the run id
        out = replace(out, rdzv_id=tr.rdzv_id)
    if tr.log_dir is not None:
        out = _set(out, "runs_dir", tr.log_dir, tr, "log_dir", "--runs-dir")
    if tr.redirects is not None or tr.tee is not None:     # each rank's streams to attempt_<N>/<rank>/*.log
        for name in ("redirects", "tee"):
            if getattr(tr, name) is not None:
                _check_streams(tr.said(name), getattr(tr, name))
        out = replace(out, rank_files=RankFiles(tee=tr.tee, redirects=tr.redirects))
    if tr.rdzv_conf is not None:
        out = _rdzv_conf(tr, out, backend)
    if tr.monitor_interval is not None:
        _seconds(tr, "monitor_interval")
    if tr.start_method is not None and tr.start_method not in START_METHODS:
        raise LaunchError(f"{tr.said('start_method', tr.start_method)}: torchrun's start methods are "
                          f"{', '.join(START_METHODS)}")
    if tr.numa_binding is not None:
        if tr.numa_binding not in NUMA_BINDING_MODES:
            raise LaunchError(f"{tr.said('numa_binding', tr.numa_binding)}: torchrun's modes are "
                              f"{', '.join(NUMA_BINDING_MODES)}", hint="or podrun's --cpu-bind auto|none|LIST")
        out = _set(out, "cpu_bind", NUMA_BINDING_MODES[tr.numa_binding], tr, "numa_binding", "--cpu-bind")
    if tr.role is not None:
        if not tr.role:
            raise LaunchError(f"{tr.said('role', repr(tr.role))} names no role")
        out = replace(out, role=tr.role)
    if tr.local_ranks_filter is not None:
        out = replace(out, local_ranks=_local_ranks(tr))
    if tr.signals_to_handle is not None:
        _check_signals(tr)
    if tr.shutdown_timeout is not None:
        out = _set(out, "grace", float(_seconds(tr, "shutdown_timeout", integer=True)), tr, "shutdown_timeout",
                   "--grace")
    for name, value in (("max_restarts", pet_own.max_restarts), ("master_addr", pet_own.master_addr),
                        ("master_port", pet_own.master_port)):
        if value is not None and getattr(out, name) is None:
            out = replace(out, **{name: value})
    return out


def _given(value) -> bool:
    return value is not None


# torchrun's options podrun has no meaning for: (the option, whether its value is refused, why, what to use instead)
REFUSED = (
    *((name, lambda v: v is not None and v != "",
       "podrun writes every line of every worker to the run directory (instance-N.log) and duplicates none to "
       "another file", "grep on runs/RUN_ID/instance-N.log")
      for name in ("duplicate_stdout_filters", "duplicate_stderr_filters")),
    ("logs_specs", _given, "podrun's logs are the run directory's files, not a torchrun.logs_specs plugin",
     "--runs-dir DIR (logs in DIR/RUN_ID/instance-N.log)"),
    ("node_rank", _given, "podrun places the instances itself; one podrun launch on one machine starts every "
     "host's instance and gives each its GROUP_RANK, or one podrun per node meets with --nnodes N (N > 1)",
     "one podrun launch naming the hosts with --hosts h1,h2 or --hostfile, or one per node with --nnodes N "
     "--node-rank R --master-addr A (docs/launch.md)"),
)


def _refuse_unsupported(tr: TorchrunOptions) -> None:
    """torchrun's options podrun has no meaning for (REFUSED), each with why and what to use instead."""
    for name, refused, why, use in REFUSED:
        value = getattr(tr, name)
        if refused(value):
            raise not_supported(tr.said(name, value), why, use)


def _backend(tr: TorchrunOptions) -> str | None:
    if tr.rdzv_backend is None:
        return None
    if tr.rdzv_backend not in RDZV_BACKENDS:
        raise not_supported(tr.said("rdzv_backend", tr.rdzv_backend),
                            "podrun's workers meet at a TCP store that instance 0's agent serves (what c10d does), "
                            "not at another rendezvous service",
                            "--rdzv-backend c10d (or leave it out) with --rdzv-endpoint HOST:PORT")
    return tr.rdzv_backend


# --rdzv-conf's keys (torch.distributed.elastic.rendezvous: c10d's dynamic rendezvous and its store, static's):
# podrun's option, or None for a key that is taken and means nothing more under podrun (why), or a refusal
RDZV_CONF_HEARTBEAT = {"keep_alive_interval": ("heartbeat", "--heartbeat", float),
                       "keep_alive_max_attempt": ("heartbeat_misses", "--heartbeat-misses", int)}
RDZV_CONF_TAKEN = {
    "join_timeout": "podrun starts every host itself and waits for none to join",
    "timeout": "podrun starts every host itself and waits for none to join",
    "last_call_timeout": "podrun starts exactly the plan's hosts, with no last call for more",
    "close_timeout": "podrun ends every host's agent itself",
    "heartbeat_timeout": "a heartbeat is a line on the agent's connection, bounded by --keepalive",
    "read_timeout": "podrun's agents are told the rendezvous by the controller, not by reading the store",
    "store_type": "tcp only",
}
RDZV_CONF_REFUSED = {
    "is_host": ("the store is always served by instance 0's agent, at --master-addr",
                "--master-addr to say where instance 0 runs, or --no-agent-store for rank 0 to host it"),
    "rank": ("podrun places the instances itself", "one podrun launch naming the hosts with --hosts"),
}


def _rdzv_conf(tr: TorchrunOptions, out: OwnOptions, backend: str | None) -> OwnOptions:
    said = tr.said("rdzv_conf", tr.rdzv_conf)
    for item in (p.strip() for p in tr.rdzv_conf.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise LaunchError(f"{said}: {item!r} is not KEY=VALUE", hint="torchrun's form: key1=value1,key2=value2")
        given = f"{tr.said('rdzv_conf')} {key}={value}"      # the item in the user's words
        if key in RDZV_CONF_REFUSED:
            raise not_supported(given, *RDZV_CONF_REFUSED[key])
        if key == "store_type" and value.lower() != "tcp":
            raise not_supported(given, "the store is a TCP store on instance 0's agent",
                                "store_type=tcp or leave it out")
        if key in RDZV_CONF_HEARTBEAT:
            field_name, ours, kind = RDZV_CONF_HEARTBEAT[key]
            number = _number(kind, value)
            if number is None:
                raise LaunchError(f"{said}: {key}={value!r} is not a number above 0")
            out = _set_words(out, field_name, number, given, ours)
        elif key in RDZV_CONF_TAKEN:
            if key != "store_type" and _number(float, value) is None:
                raise LaunchError(f"{said}: {key}={value!r} is not a number of seconds above 0")
        else:
            known = ", ".join(sorted((*RDZV_CONF_HEARTBEAT, *RDZV_CONF_TAKEN, *RDZV_CONF_REFUSED)))
            raise not_supported(given, f"{key!r} is none of the keys torchrun's {backend or 'c10d'} rendezvous reads",
                                f"one of {known}")
    return out


def _number(kind, text: str, ok=lambda n: n > 0):
    """``text`` as a ``kind`` (int, float) of which ``ok`` holds (default: above 0); None when it is not one."""
    try:
        number = kind(text)
    except ValueError:
        return None
    return number if ok(number) else None


def _seconds(tr: TorchrunOptions, name: str, *, integer: bool = False):
    value = getattr(tr, name)
    number = _number(int if integer else float, value,
                     lambda n: math.isfinite(n) and n >= 0 and (n != 0 or integer))
    if number is None:
        raise LaunchError(f"{tr.said(name, value)} is not a number of seconds"
                          + (" (torchrun takes a whole number)" if integer else ""))
    return number


def _local_ranks(tr: TorchrunOptions) -> frozenset[int]:
    try:
        ranks = frozenset(int(p) for p in tr.local_ranks_filter.split(","))
        if any(r < 0 for r in ranks):
            raise ValueError
    except ValueError:
        raise LaunchError(f"{tr.said('local_ranks_filter', tr.local_ranks_filter)} is not a list of local ranks",
                          hint="torchrun's form: comma-separated local ranks, e.g. --local-ranks-filter 0,1") from None
    return ranks


def _check_signals(tr: TorchrunOptions) -> None:
    """--signals-to-handle: podrun's agent forwards its own set (podrun.wire.worker_env.SIGNALS_HANDLED); a list naming
    a signal outside it is refused, a valid list within it is taken."""
    import signal

    from podrun.wire.worker_env import SIGNALS_HANDLED

    handled = set(SIGNALS_HANDLED.split(","))
    names = [p.strip() for p in tr.signals_to_handle.split(",") if p.strip()]
    for name in names:
        if not hasattr(signal, name) or not name.startswith("SIG"):
            raise LaunchError(f"{tr.said('signals_to_handle', tr.signals_to_handle)}: {name!r} is not a signal",
                              hint="torchrun's form: SIGTERM,SIGINT,...")
    extra = [n for n in names if n not in handled]
    if extra:
        raise not_supported(tr.said("signals_to_handle", tr.signals_to_handle),
                            f"podrun's agent forwards {SIGNALS_HANDLED} to the workers and no other signal "
                            f"({', '.join(extra)})", f"a list within {SIGNALS_HANDLED}, or leave it out")


def _own_said(tr: TorchrunOptions, out: OwnOptions, field_name: str) -> str:
    return next((theirs for ours, _, theirs in out.words if ours == "--" + field_name.replace("_", "-")),
                tr.said(field_name, getattr(out, field_name)))


def _set(out: OwnOptions, field_name: str, value, tr: TorchrunOptions, name: str, ours: str) -> OwnOptions:
    """``out`` with podrun's ``field_name`` set from torchrun's option ``name``; podrun's own option given too must
    agree, unless torchrun's came from a PET_ variable (the command line wins)."""
    have = getattr(out, field_name)
    if have is not None and tr.from_env(name):
        return out
    return _set_words(out, field_name, value, tr.said(name, getattr(tr, name)), ours,
                      tr.said(field_name, have) if have is not None else None)


def _set_words(out: OwnOptions, field_name: str, value, theirs: str, ours: str, have_said: str | None = None
               ) -> OwnOptions:
    have = getattr(out, field_name)
    if have is not None and have != value:
        raise LaunchError(f"{theirs} means {ours} {value}, and {have_said or f'{ours} {have}'} is given too",
                          hint=f"give one of them ({theirs.split(' ')[0].split('=')[0]} is torchrun's spelling of "
                               f"podrun's {ours})")
    return replace(out, **{field_name: value}, words=(*out.words, (ours, str(value), theirs)))


def _nproc(tr: TorchrunOptions, cpu_count: int) -> int | None:
    """--nproc-per-node: N workers; auto: the cluster spec's devices (this machine: one worker per core, as
    torchrun's auto without an accelerator); cpu: this machine's cores, as torchrun counts them; gpu: the
    cluster spec's devices, which must be GPUs (check_nproc_kind)."""
    from podrun.specs.limits import MAX_PER_HOST

    value = tr.nproc_per_node
    text = value.strip()
    if text.isascii() and text.isdigit():
        if len(text) > 12 or not 1 <= int(text) <= MAX_PER_HOST:
            raise LaunchError(f"{tr.said('nproc_per_node', text[:20] + ('...' if len(text) > 20 else ''))}: a node "
                              f"runs at least one worker and at most {MAX_PER_HOST}",
                              hint=f"give N in 1..{MAX_PER_HOST}, or auto, cpu or gpu")
        return int(text)
    if text in ("auto", "gpu"):
        return None
    if text == "cpu":
        return cpu_count
    raise LaunchError(f"{tr.said('nproc_per_node', repr(value))} is not a number of workers",
                      hint="give N (workers per host), auto (the cluster's devices per host), cpu (this machine's "
                           "cores) or gpu (the cluster's GPUs per host)")


def check_nproc_kind(tr: TorchrunOptions, device_kind: str, cluster_name: str) -> None:
    """--nproc-per-node gpu on a cluster whose devices are not GPUs is refused, as torchrun refuses it without CUDA."""
    if tr.nproc_per_node is not None and tr.nproc_per_node.strip() == "gpu" and device_kind != "gpu":
        raise LaunchError(f"{tr.said('nproc_per_node', 'gpu')}: cluster {cluster_name!r} has {device_kind} devices, "
                          "not GPUs",
                          hint="use --nproc-per-node auto (the cluster's devices) or N, or a GPU cluster (--cluster)")


def _nnodes(tr: TorchrunOptions) -> tuple[int, int]:
    value, said = tr.nnodes, tr.said("nnodes", tr.nnodes)
    parts = value.split(":")
    try:
        if len(parts) not in (1, 2) or not all(p.strip().isascii() for p in parts):
            raise ValueError
        low, high = int(parts[0]), int(parts[-1])
    except ValueError:
        raise LaunchError(f"{tr.said('nnodes', repr(value))} is neither N nor MIN:MAX",
                          hint="e.g. --nnodes 2 (two hosts) or --nnodes 1:2 (elastic: start on 2, go on down to 1)"
                          ) from None
    if low < 1 or high < low:
        raise LaunchError(f"{said}: need 1 <= MIN <= MAX", hint="e.g. --nnodes 1:2")
    return low, high


def parse_endpoint(value: str, option: str = "--rdzv-endpoint") -> tuple[str, int]:
    """HOST[:PORT] ([V6]:PORT for IPv6) -> (host, port); no port: torchrun's 29400; port 0: a free port picked at
    the start, as torchrun's c10d rendezvous binds port 0 (``option``: as the user wrote it, for the error)."""
    from podrun.wire.join import split_address

    text = value.strip()
    host, port_text, closed = split_address(text)
    if not closed:
        raise LaunchError(f"{option} {value!r} is not HOST:PORT", hint=f"e.g. {option} [fd00::1]:29400")
    if not host:
        raise LaunchError(f"{option} {value!r} names no host", hint=f"e.g. {option} node1:29400")
    if ":" in host and not text.startswith("["):
        raise LaunchError(f"{option} {value!r} is not one HOST:PORT",
                          hint=f"give one host and one port, e.g. {option} node1:29400 (an IPv6 address in "
                               "brackets: [fd00::1]:29400)")
    if port_text is None:
        return host, RDZV_DEFAULT_PORT
    if not (port_text.isascii() and port_text.isdigit()) or len(port_text) > 5 or not 0 <= int(port_text) <= 65535:
        raise LaunchError(f"{option} {value!r}: {port_text!r} is not a TCP port",
                          hint=f"give a port in 0..65535 (0: a free one, picked at the start), e.g. {option} "
                               "node1:29400")
    return host, int(port_text)


def _check_streams(option: str, value: str) -> None:
    """torchrun's stream spec: 0-3, or LOCAL_RANK:0-3 pairs separated by commas."""
    parts = [p.strip() for p in value.split(",")]
    ok = value.strip() in ("0", "1", "2", "3") or all(
        len(p.split(":")) == 2 and p.split(":")[0].isdigit() and p.split(":")[1] in ("0", "1", "2", "3")
        for p in parts)
    if not ok:
        raise LaunchError(f"{option} {value!r} is not a stream choice",
                          hint="torchrun's form: 0 none, 1 stdout, 2 stderr, 3 both, or per local rank (0:3,1:1)")
