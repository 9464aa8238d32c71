"""Hostile input against the real CLI: mutated cluster specs, recipes, hostfiles, allocation files,
nodelists and numbers. The contract: exit 0 (the input was still valid) or exit 2 with a one-paragraph
message, never a traceback, under 10 s of CPU time and 500 MB. CPU time, not wall time: a loaded machine
stretches the wall clock, not the work; the wall clock only guards against a hang (WALL_GUARD_S).

The in-process cases call podrun's own entry (podrun.cli.main.main, the function the `podrun`
script runs) so that many hundreds of inputs fit in about a minute; the bombs that once hung or ate
memory run as real subprocesses whose wall time and peak RSS (os.wait4) are measured.
PODRUN_FUZZ_EXAMPLES sets the examples per property (default 100, about a minute on a loaded CI machine).
"""
from __future__ import annotations

import contextlib
import copy
import io
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import MappingProxyType
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from podrun.cli.main import main
from podrun.specs import project_root

ROOT = project_root()
EXAMPLES = int(os.environ.get("PODRUN_FUZZ_EXAMPLES", "100"))
TIME_LIMIT_S = 10.0                 # CPU seconds (user + system) one input may cost
WALL_GUARD_S = 6 * TIME_LIMIT_S     # wall seconds after which a run counts as hung
RSS_LIMIT_MB = 500
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# variables that would make the CLI read an allocation instead of the input under test
_SCHEDULER_VARS = ("SLURM_JOB_NODELIST", "SLURM_NODELIST", "PBS_NODEFILE", "PE_HOSTFILE", "SGE_JOB_HOSTLIST")


class TookTooLong(BaseException):
    """Raised in the CLI by a timer at WALL_GUARD_S, so that a hang fails the test instead of CI."""


def _too_long(signum, frame):
    raise TookTooLong()


def run_cli(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str, float]:
    """podrun's entry in this process: (exit code, stdout, stderr, CPU seconds). An exception escaping
    main() is a violation of the contract and fails the test with the input."""
    out, err = io.StringIO(), io.StringIO()
    clean = {k: v for k, v in os.environ.items() if k not in _SCHEDULER_VARS}
    t0 = time.process_time()
    old = signal.signal(signal.SIGALRM, _too_long)
    signal.setitimer(signal.ITIMER_REAL, WALL_GUARD_S)
    try:
        with mock.patch.dict(os.environ, {**clean, **(env or {})}, clear=True), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except TookTooLong:
                raise AssertionError(f"podrun {argv} (env {env}) ran past {WALL_GUARD_S:g} s") from None
            except BaseException as exc:  # noqa: BLE001 - anything escaping main is the defect under test
                raise AssertionError(f"podrun {argv} (env {env}) raised {type(exc).__name__}: {exc}") from exc
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return rc, out.getvalue(), err.getvalue(), time.process_time() - t0


def check_contract(argv, rc, out, err, seconds, env=None) -> None:
    what = f"podrun {' '.join(map(str, argv))[:300]} (env {str(env)[:200]})"
    assert rc in (0, 2), f"{what}: exit {rc}\n{err[-2000:]}"
    assert "Traceback" not in out + err, f"{what}: traceback\n{err[-3000:]}"
    if rc == 2:
        assert err.strip(), f"{what}: exit 2 without a message"
        assert "error" in err.lower(), f"{what}: exit 2 but the message says no error: {err[:500]}"
        assert len(err) < 4000, f"{what}: a message of {len(err)} characters is not one paragraph"
    assert seconds < TIME_LIMIT_S, f"{what}: took {seconds:.1f} s of CPU"


# --- values that broke the contract before, and random ones ---------------------------------------

# A tuple, and drawn through a deep copy: the mutations put a drawn value into a document and may change it
# in place later, so a draw must never be the constant itself (tests/fuzz/test_strategies.py).
HOSTILE_SCALARS = (
    0, -1, 1, -(2 ** 63), 2 ** 63, 10 ** 29, 10 ** 400, 1e308, -1e308, 1e-308, float("nan"), float("inf"),
    float("-inf"), "", " ", "a b", "$(touch x)", "`reboot`", "-n[1-2]", "-oProxyCommand=x", "auto",
    "x" * 300, "h{i:>300000000}", "h{i}{j}", "{0}", "\x00", "\x1b[31m", "caf\u00e9", None, True, False,
    [], {}, [1, [2]], {"a": 1}, ["a", "a"],
)

hostile_scalars = st.sampled_from(HOSTILE_SCALARS).map(copy.deepcopy)
hostile = st.one_of(
    hostile_scalars,
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.lists(st.text(max_size=10), max_size=4),
)


def _leaves(data, path=()):
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _leaves(v, path + (k,))
        if data:
            yield path           # the mapping itself
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _leaves(v, path + (i,))
        yield path
    else:
        yield path


def _set(data, path, value):
    if not path:
        return value
    cur = data
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    return data


def _delete(data, path):
    if not path:
        return data
    cur = data
    for k in path[:-1]:
        cur = cur[k]
    del cur[path[-1]]
    return data


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    lines = ["a0: &a0 [" + ",".join(["x"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def deep_nesting(depth: int) -> str:
    return "x: " + "[" * depth + "]" * depth + "\n"


@st.composite
def mutated_yaml(draw, base_text: str) -> bytes:
    """A shipped spec or recipe with one to three mutations: a field set to a hostile value, a field
    deleted, an unknown key, or raw bytes (non-UTF-8, control characters, bombs) spliced in."""
    data = yaml.safe_load(base_text)
    text: str | None = None
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["set", "set", "set", "delete", "unknown", "bytes", "bomb"]))
        paths = (list(_leaves(data)) if isinstance(data, (dict, list)) else []) or [()]
        path = draw(st.sampled_from(paths))
        if kind == "set":
            data = _set(data, path, draw(hostile))
        elif kind == "delete" and path:
            data = _delete(data, path)
        elif kind == "unknown" and isinstance(data, dict):
            data[draw(st.text(min_size=1, max_size=12))] = draw(hostile)
        elif kind == "bomb":
            text = draw(st.sampled_from([alias_bomb(), deep_nesting(draw(st.integers(20, 5000)))])) + \
                yaml.safe_dump(data if isinstance(data, dict) else {"x": data})
    try:
        text = text if text is not None else yaml.safe_dump(data, allow_unicode=True)
    except (yaml.YAMLError, RecursionError, ValueError):
        text = base_text
    raw = text.encode("utf-8", "surrogatepass")
    if draw(st.integers(0, 4)) == 0:   # raw bytes spliced in somewhere
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.binary(min_size=1, max_size=8)) + raw[at:]
    return raw


CLUSTER_TEXTS = MappingProxyType({p.stem: p.read_text() for p in sorted((ROOT / "cluster_specs").glob("*.yaml"))})
RECIPE_TEXTS = MappingProxyType({p.parent.name: p.read_text()
                                 for p in sorted((ROOT / "recipes").glob("*/recipe.yaml"))})


@FUZZ
@given(st.data())
def test_mutated_cluster_specs(data):
    name = data.draw(st.sampled_from(sorted(CLUSTER_TEXTS)))
    raw = data.draw(mutated_yaml(CLUSTER_TEXTS[name]))
    with tempfile.TemporaryDirectory() as d:
        spec = Path(d) / "c.yaml"
        spec.write_bytes(raw)
        argv = ["plan", "--cluster", str(spec), str(ROOT / "recipes" / "resnet50"), "--json"]
        check_contract(argv, *run_cli(argv))


@FUZZ
@given(st.data())
def test_mutated_recipes(data):
    name = data.draw(st.sampled_from(sorted(RECIPE_TEXTS)))
    raw = data.draw(mutated_yaml(RECIPE_TEXTS[name]))
    cluster = data.draw(st.sampled_from(["ipu-pod16", "abci", "dgx-h100", "local"]))
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "r").mkdir()
        (Path(d) / "r" / "recipe.yaml").write_bytes(raw)
        argv = ["plan", "--cluster", cluster, str(Path(d) / "r"), "--json"]
        check_contract(argv, *run_cli(argv))


host_names = st.one_of(
    st.sampled_from(["h1", "h2", "g0001", "10.0.0.1", "::1", "fe80::1", "node-1.cluster", "-n1", "a b",
                     "$(touch x)", "h[1-2]", "x" * 300, "h1:4", "h1 slots=4", "h1 slots=0", "h1 slots=-1",
                     "h1 slots=99999999999", "h1 max_slots=x", "h1 slots=4 max_slots=8", "# c", ""]),
    st.text(max_size=20),
)


@FUZZ
@given(st.lists(host_names, max_size=12), st.binary(max_size=16), st.sampled_from(["hostfile", "hosts"]))
def test_hostfiles_and_hosts_option(lines, junk, how):
    if how == "hosts":
        argv = ["hosts", "--hosts", ",".join(lines), "--json"]
        check_contract(argv, *run_cli(argv))
        return
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "hf"
        f.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass") + junk)
        argv = ["hosts", "--hostfile", str(f), "--json"]
        check_contract(argv, *run_cli(argv))


nodelists = st.one_of(
    st.sampled_from(["-n[1-2]", "n[1-" + "9" * 5000 + "]", "g[1-100000000]", "g[0001-0003,0007],h5", "a[1-2]b[1-2]",
                     "g[3-1]", "g[", "g]", "g[[1]]", "g[]", ",", "g[1-2],,h", "$(touch x)", "a b", "g[1-2]-[a]",
                     "r[1-400]n[1-400]", "x" * 2000]),
    st.text(alphabet="gn0123456789[]-,. $x", max_size=40),
)


@FUZZ
@given(nodelists, st.sampled_from(["SLURM_JOB_NODELIST", "SLURM_NODELIST"]))
def test_slurm_nodelists(nodelist, var):
    env = {var: nodelist}
    argv = ["hosts", "--json"]
    check_contract(argv, *run_cli(argv, env), env=env)


@FUZZ
@given(st.lists(host_names, max_size=8), st.binary(max_size=16),
       st.sampled_from(["PBS_NODEFILE", "PE_HOSTFILE", "SGE_JOB_HOSTLIST"]))
def test_allocation_files(lines, junk, var):
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "alloc"
        f.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass") + junk)
        env = {var: str(f)}
        argv = ["hosts", "--json"]
        check_contract(argv, *run_cli(argv, env), env=env)


PLAN_NUMBERS = ("--nodes", "--global-batch", "--local-batch", "--grad-accum", "--instances-per-host",
                "--devices-per-host", "--pod")
LAUNCH_NUMBERS = ("--master-port", "--grace", "--keepalive", "--max-restarts", "--max-concurrency",
                  "--only-output-from-instance")
numbers = st.one_of(
    st.sampled_from(["0", "-1", "-5", "1", "2", "3", "70000", "65536", "nan", "inf", "-inf", "1e308", "10" + "0" * 29,
                     str(2 ** 63), "1.5", "0x10", "", " ", "1_000", "٣", "9" * 5000]),
    st.integers().map(str),
    st.floats().map(repr),
)


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(PLAN_NUMBERS), numbers), min_size=1, max_size=3),
       st.sampled_from(["efficientnet_b4", "resnet50", "vit_b16", "resnet18_cifar10"]),
       st.sampled_from([("--pod", "16"), ("--cluster", "abci"), ("--cluster", "dgx-h100"), ()]))
def test_plan_numbers(options, recipe, base):
    argv = ["plan", *base, str(ROOT / "recipes" / recipe), "--json"]
    for opt, value in options:
        argv += [opt, value]
    rc, out, err, seconds = run_cli(argv)
    check_contract(argv, rc, out, err, seconds)
    if rc == 0:                          # a plan was made: it must be the one asked for, and sane
        import json

        plan = json.loads(out)
        given = dict(options)            # the last value of an option wins, as in click
        for opt, key in (("--global-batch", "global_batch"), ("--local-batch", "local_batch"),
                         ("--grad-accum", "grad_accum"), ("--instances-per-host", "instances_per_host"),
                         ("--devices-per-host", "devices_per_host")):
            if opt in given:
                assert plan[key] == int(given[opt]), f"{argv}: {key} {plan[key]} but {opt} {given[opt]}"
        if "--nodes" in given:
            assert len(plan["hosts"]) == int(given["--nodes"]), argv
        for key in ("replicas", "local_batch", "grad_accum", "instances_per_host", "devices_per_host",
                    "replicas_per_instance"):
            assert 1 <= plan[key] <= 2 ** 24, f"{argv}: {key} {plan[key]}"
        assert plan["replicas"] * plan["local_batch"] * plan["grad_accum"] == plan["global_batch"], argv


# documented ranges of the launch options (docs/cluster-specs.md): a value accepted must be in them
LAUNCH_RANGES = MappingProxyType({
    "--master-port": lambda v: 0 <= int(v) <= 65535,
    "--grace": lambda v: math.isfinite(float(v)) and 0 <= float(v) <= 7 * 24 * 3600,
    "--keepalive": lambda v: math.isfinite(float(v)) and 0 < float(v) <= 7 * 24 * 3600,
    "--max-restarts": lambda v: 0 <= int(v) <= 1000,
    "--max-concurrency": lambda v: 1 <= int(v),
    "--only-output-from-instance": lambda v: 0 <= int(v),
})


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(LAUNCH_NUMBERS), numbers), min_size=1, max_size=3))
def test_launch_numbers(options):
    with tempfile.TemporaryDirectory() as d:
        argv = ["launch", "--dry-run", "--hosts", "localhost", "--devices-per-host", "1", "--runs-dir", d]
        for opt, value in options:
            argv += [opt, value]
        argv += ["--", "true"]
        rc, out, err, seconds = run_cli(argv)
        check_contract(argv, rc, out, err, seconds)
        if rc == 0:
            for opt, value in dict(options).items():      # the last value of an option wins
                assert LAUNCH_RANGES[opt](value), f"{argv}: {opt} {value!r} accepted"


# argv and the environment are C strings: they cannot hold NUL, so the paths here do not either
paths = st.one_of(
    st.sampled_from(["a" * 300, "a" * 5000, "a/" * 3000, "", ".", "/", "/dev/null", "/proc/self/mem",
                     "-x", "../../../../etc/passwd", "recipes/resnet50/" + "a" * 300, "c.yaml", "/etc"]),
    st.text(max_size=60).filter(lambda t: "\x00" not in t),
)


@FUZZ
@given(paths, st.sampled_from(["cluster", "recipe", "hostfile", "pe"]))
def test_odd_paths(path, where):
    """Names and paths that the file system refuses (too long, NUL, a directory, a device)."""
    env = None
    if where == "cluster":
        argv = ["plan", "--cluster", path, str(ROOT / "recipes" / "resnet50")]
    elif where == "recipe":
        argv = ["plan", "--pod", "16", path]
    elif where == "hostfile":
        argv = ["hosts", "--hostfile", path]
    else:
        argv, env = ["hosts"], {"PE_HOSTFILE": path}
    check_contract(argv, *run_cli(argv, env), env=env)


# --- the exact inputs of the hostile-input report, each a regression test -------------------------


def spec_with(tmp_path: Path, old: str, new: str, base: str = "ipu-pod16") -> Path:
    text = CLUSTER_TEXTS[base]
    assert old in text, old
    p = tmp_path / "c.yaml"
    p.write_text(text.replace(old, new, 1))
    return p


def recipe_with(tmp_path: Path, old: str, new: str, base: str = "efficientnet_b4") -> Path:
    text = RECIPE_TEXTS[base]
    assert old in text, old
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "recipe.yaml").write_text(text.replace(old, new, 1))
    return tmp_path / "r"


def expect_error(argv, *fragments, env=None) -> str:
    rc, out, err, seconds = run_cli([str(a) for a in argv], env)
    check_contract(argv, rc, out, err, seconds, env)
    assert rc == 2, f"podrun {argv}: exit {rc}, expected 2\n{out[:1000]}"
    for f in fragments:
        assert f in err, f"{f!r} not in {err!r}"
    return err


@pytest.mark.parametrize("field,old,new,fragment", [
    ("bandwidth", "bandwidth_gbps: 512", "bandwidth_gbps: 0", "must be at least 0.001"),
    ("latency inf", "latency_us: 2", "latency_us: .inf", "finite number"),
    ("latency huge", "latency_us: 2", "latency_us: 1.0e+308", "must be at most"),
    ("latency negative", "latency_us: 2", "latency_us: -3", "must be at least 0"),
    ("bandwidth nan", "bandwidth_gbps: 512", "bandwidth_gbps: .nan", "finite number"),
    ("memory negative", "memory_gb: 0.9", "memory_gb: -1", "device.memory_gb"),
    ("devices 0", "devices_per_host: 16", "devices_per_host: 0", "devices_per_host"),
    ("host count", "count: 1", "count: 100001", "hosts.count"),
    ("pattern width", "pattern: \"pod16-host{i}\"", "pattern: \"h{i:>300}\"", "hosts.pattern"),
    ("wrong type", "latency_us: 2", "latency_us: [1, 2]", "a number"),
    ("hostile host", "pattern: \"pod16-host{i}\"", "pattern: \"$(touch x){i}\"", "not a valid host name"),
])
def test_cluster_spec_regressions(tmp_path, field, old, new, fragment):
    p = spec_with(tmp_path, old, new, "ipu-pod16")
    expect_error(["plan", "--cluster", p, ROOT / "recipes" / "efficientnet_b4"], str(p), fragment)


@pytest.mark.parametrize("old,new,fragment", [
    ("global_batch: 6144", "global_batch: 9223372036854775808", "global_batch"),
    ("global_batch: 6144", "global_batch: 0", "global_batch"),
    ("epochs: 350", "epochs: .inf", "finite number"),
])
def test_recipe_regressions(tmp_path, old, new, fragment):
    r = recipe_with(tmp_path, old, new)
    expect_error(["plan", "--pod", "16", r], fragment)


def test_recipe_lr_nan(tmp_path):
    text = RECIPE_TEXTS["efficientnet_b4"]
    base = yaml.safe_load(text)["lr"]["base"]
    r = recipe_with(tmp_path, f"base: {base}", "base: .nan")
    expect_error(["plan", "--pod", "16", r], "lr.base", "finite number")


def test_yaml_bombs_and_bytes_in_process(tmp_path):
    p = tmp_path / "bomb.yaml"
    p.write_text(alias_bomb(levels=5, width=30) + CLUSTER_TEXTS["local"])     # 24.3 million values
    expect_error(["hosts", "--cluster", p], "aliases")
    p.write_text(deep_nesting(40))
    expect_error(["hosts", "--cluster", p], "nested")
    p.write_bytes(b"name: \xff\xfe\n")
    expect_error(["hosts", "--cluster", p], "not UTF-8")
    p.write_bytes(b"name: a\x07b\n")
    expect_error(["hosts", "--cluster", p], "not YAML text")
    p.write_text('name: "a\\x00b"\n' + CLUSTER_TEXTS["local"].split("\n", 1)[1].replace("name: local\n", ""))
    expect_error(["hosts", "--cluster", p], "control characters")


@pytest.mark.parametrize("argv,fragment", [
    (["--instances-per-host", "-1"], "--instances-per-host"),
    (["--instances-per-host", "0"], "--instances-per-host"),
    (["--devices-per-host", "0"], "--devices-per-host"),
    (["--global-batch", "0"], "--global-batch"),
    (["--global-batch", "1" + "0" * 30], "--global-batch"),
    (["--nodes", "0"], "--nodes"),
])
def test_plan_number_regressions(argv, fragment):
    expect_error(["plan", "--pod", "16", ROOT / "recipes" / "efficientnet_b4", *argv], fragment)


@pytest.mark.parametrize("argv,fragment", [
    (["--master-port", "70000"], "--master-port"), (["--master-port", "-1"], "--master-port"),
    (["--grace", "nan"], "--grace"), (["--keepalive", "-1"], "--keepalive"), (["--keepalive", "0"], "--keepalive"),
    (["--max-restarts", "-5"], "--max-restarts"), (["--max-concurrency", "0"], "--max-concurrency"),
    (["--only-output-from-instance", "-1"], "--only-output-from-instance"),
])
def test_launch_number_regressions(tmp_path, argv, fragment):
    expect_error(["launch", "--dry-run", "--hosts", "localhost", "--runs-dir", tmp_path, *argv, "--", "true"], fragment)
    assert not any(tmp_path.iterdir())


def test_master_port_zero_is_accepted_by_the_option():
    from podrun.cli import types as t

    assert t.PORT.convert("0", None, None) == 0 and t.PORT.convert("65535", None, None) == 65535


@pytest.mark.parametrize("env,fragment", [
    ({"SLURM_JOB_NODELIST": "-n[1-2]"}, "not a valid host name"),
    ({"SLURM_JOB_NODELIST": "n[1-" + "9" * 5000 + "]"}, "more than 18 digits"),
    ({"SLURM_JOB_NODELIST": "$(touch x)"}, "not allowed"),
])
def test_nodelist_regressions(env, fragment):
    expect_error(["hosts"], "SLURM_JOB_NODELIST", fragment, env=env)


@pytest.mark.parametrize("value", ["$(touch x)", "a b", "-n1", "h[1-2]"])
def test_hosts_option_refuses_bad_names(value):
    expect_error(["hosts", "--hosts", value], "--hosts", "not a valid host name")


@pytest.mark.parametrize("argv", [
    ["plan", "--cluster", "a" * 5000, "resnet50"], ["plan", "--pod", "16", "recipes/resnet50/" + "a" * 300],
    ["plan", "--pod", "16", "a" * 5000], ["hosts", "--cluster", "a/" * 3000], ["hosts", "--hostfile", "a" * 5000],
])
def test_paths_the_file_system_refuses(argv):
    """`File name too long` and embedded NUL were tracebacks; the path is cut in the message."""
    err = expect_error(argv)
    assert len(err) < 600, err


def test_non_utf8_allocation_files(tmp_path):
    f = tmp_path / "nodes"
    f.write_bytes(b"n1\nn\xff2\n")
    expect_error(["hosts"], "PBS_NODEFILE", "not UTF-8", env={"PBS_NODEFILE": str(f)})
    expect_error(["hosts", "--hostfile", f], "not UTF-8")


# --- real processes: the bombs that hung or ate memory, measured -----------------------------------


# Peak RSS of a child is at least the RSS of the process it was forked from (Linux keeps the
# high-water mark across exec), and this test process is large. So a small interpreter (-S, no site)
# forks podrun, waits for it with os.wait4 and reports its peak RSS and exit code on stdout. The
# address-space limit keeps a regression from taking the test machine with it.
_WRAPPER = """
import os, resource, signal, sys
pid = os.fork()
if pid == 0:
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.execv(sys.executable, [sys.executable, "-m", "podrun", *sys.argv[2:]])
signal.signal(signal.SIGALRM, lambda *a: os.kill(pid, signal.SIGKILL))
signal.alarm(int(sys.argv[1]))
_, status, usage = os.wait4(pid, 0)
print(usage.ru_maxrss, os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime)
"""


def _measured(argv: list[str], env: dict | None = None) -> tuple[int, str, float, float]:
    """(exit code, stderr, CPU seconds, peak RSS MB) of `python -m podrun ARGV` in a real process."""
    full_env = {k: v for k, v in os.environ.items() if k not in _SCHEDULER_VARS}
    full_env.update(env or {})
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen([sys.executable, "-S", "-c", _WRAPPER, str(int(WALL_GUARD_S)), *argv],
                             stdout=subprocess.PIPE, stderr=err,
                             env=full_env, start_new_session=True)
        timer = threading.Timer(WALL_GUARD_S + 30, lambda: os.killpg(p.pid, signal.SIGKILL))
        timer.start()
        try:
            out, _ = p.communicate()
        finally:
            timer.cancel()
        err.seek(0)
        text = err.read().decode(errors="replace")
    fields = out.split()
    if len(fields) != 3:
        return -9, text + "\n(killed after the time limit)", float("nan"), float("nan")
    return int(fields[1]), text, float(fields[2]), int(fields[0]) / 1024


BOMBS = MappingProxyType({
    "alias bomb": ("c.yaml", alias_bomb() + CLUSTER_TEXTS["local"]),
    "hosts.count 10**7": ("c.yaml", CLUSTER_TEXTS["ipu-pod16"].replace("count: 1", "count: 10000000")),
    "hosts.count 10**29": ("c.yaml", CLUSTER_TEXTS["ipu-pod16"].replace("count: 1", "count: " + "1" + "0" * 29)),
    "pattern width": ("c.yaml", CLUSTER_TEXTS["ipu-pod16"].replace('"pod16-host{i}"', '"h{i:>300000000}"')),
    "deep nesting": ("c.yaml", deep_nesting(200_000)),
    "large file": ("c.yaml", "name: x\n" + "#" * (64 << 20)),
})


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_bombs_in_a_real_process(tmp_path, name):
    fname, text = BOMBS[name]
    p = tmp_path / fname
    p.write_text(text)
    rc, err, seconds, rss = _measured(["hosts", "--cluster", str(p)])
    assert rc == 2 and "error" in err and "Traceback" not in err, f"{name}: exit {rc}\n{err[-2000:]}"
    assert seconds < TIME_LIMIT_S, f"{name}: {seconds:.1f} s of CPU"
    assert rss < RSS_LIMIT_MB, f"{name}: peak RSS {rss:.0f} MB"


def test_nodelist_and_hostfile_bombs_in_a_real_process(tmp_path):
    cases = [
        ({"SLURM_JOB_NODELIST": "n[1-" + "9" * 5000 + "]"}, []),
        ({"SLURM_JOB_NODELIST": "g[1-100000000]"}, []),
        ({"SLURM_JOB_NODELIST": "r[1-400]n[1-400]"}, []),
    ]
    big = tmp_path / "hf"
    rnd = random.Random(1)
    with open(big, "w") as f:               # 200,000 distinct hosts: past the host limit
        for i in range(200_000):
            f.write(f"h{i}{rnd.choice('abc')}\n")
    cases.append(({}, ["--hostfile", str(big)]))
    cases.append(({"PBS_NODEFILE": str(big)}, []))
    for env, extra in cases:
        rc, err, seconds, rss = _measured(["hosts", *extra], env)
        what = f"{str(env)[:80]} {extra}"
        assert rc == 2 and "error" in err and "Traceback" not in err, f"{what}: exit {rc}\n{err[-2000:]}"
        assert seconds < TIME_LIMIT_S, f"{what}: {seconds:.1f} s of CPU"
        assert rss < RSS_LIMIT_MB, f"{what}: peak RSS {rss:.0f} MB"
