"""The input boundary: option types, spec-loader limits and ranges, the host-name rule, host resolution
in the library (discovered once), zero as a value, and the host counts named for an unreachable batch."""
from __future__ import annotations

import math

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from podrun.cli import types as t
from podrun.cli.main import main
from podrun.errors import HostError, PlanError, SpecError
from podrun.plan import Overrides, make_plan
from podrun.specs import load_cluster, load_recipe, project_root
from podrun.specs.hosts import check_name

ROOT = project_root()


# --- click option types ---------------------------------------------------------------------------


@pytest.mark.parametrize("ptype,good,bad", [
    (t.PORT, ["0", "1", "29500", "65535"], ["-1", "65536", "70000", "http", "1.5", ""]),
    (t.BATCH, ["1", "6144", str(2 ** 24)], ["0", "-3", str(2 ** 24 + 1), "1" + "0" * 30, "9" * 5000, "nan"]),
    (t.PER_HOST, ["1", "16", "4096"], ["0", "-1", "4097"]),
    (t.RESTARTS, ["0", "3"], ["-5", "1001"]),
    (t.CONCURRENCY, ["1", "64"], ["0", "-1"]),
    (t.INSTANCE_INDEX, ["0", "7"], ["-1"]),
    (t.GRACE, ["0", "5", "0.5"], ["nan", "inf", "-1", "1e308", "soon"]),
    (t.KEEPALIVE, ["0.1", "5"], ["0", "-1", "nan", "inf"]),
    (t.POLL, ["1", "0.2"], ["0", "-inf"]),
])
def test_option_types_accept_their_range_and_say_why_otherwise(ptype, good, bad):
    for v in good:
        assert ptype.convert(v, None, None) == (float(v) if isinstance(ptype, t.Seconds) else int(v))
    for v in bad:
        with pytest.raises(click.BadParameter) as err:
            ptype.convert(v, None, None)
        msg = err.value.format_message()
        assert ptype.why in msg and len(msg) < 300, msg


def run(argv, capsys):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("argv", [
    ["--global-batch", "0"], ["--instances-per-host", "-1"], ["--instances-per-host", "0"],
    ["--devices-per-host", "0"], ["--global-batch", str(10 ** 30)], ["--nodes", "-2"], ["--local-batch", "0"],
    ["--grad-accum", "0"],
])
def test_plan_refuses_zero_and_out_of_range_numbers(argv, capsys):
    """issue 10 A2: --global-batch 0 printed the reference plan at 6144 with exit 0."""
    rc, out, err = run(["plan", "--pod", "16", ROOT / "recipes" / "efficientnet_b4", *argv], capsys)
    assert rc == 2 and out == "" and argv[0] in err and "Traceback" not in err


# --- zero is a value in the library too -----------------------------------------------------------


def test_overrides_zero_is_not_the_default():
    c, r = load_cluster("ipu-pod16"), load_recipe("efficientnet_b4")
    for ov in (Overrides(devices_per_host=0), Overrides(instances_per_host=0), Overrides(global_batch=0),
               Overrides(local_batch=0, grad_accum=1), Overrides(instances_per_host=-1)):
        with pytest.raises(PlanError):
            make_plan(c, r, ov)
    assert c.with_hosts(("a",), 0).devices_per_host == 0       # with_hosts keeps the value it is given


def test_bare_command_zero_local_batch_is_refused():
    with pytest.raises(PlanError, match="--local-batch"):
        make_plan(load_cluster("local"), None, Overrides(local_batch=0, global_batch=None))


# --- issue 10 A10: an unreachable batch names the host counts that reach it -------------------------


def test_abci_resnet50_without_nodes_names_host_counts(capsys):
    rc, out, err = run(["plan", "--cluster", "abci", ROOT / "recipes" / "resnet50"], capsys)
    assert rc == 2 and "--nodes 512" in err and "81920 is reached on" in err, err
    assert "hint: podrun never changes the global batch by itself; pass --nodes 1024" in err
    for n in (1024, 640, 512):                       # each named count really reaches 81920
        p = make_plan(load_cluster("abci"), load_recipe("resnet50"), Overrides(nodes=n))
        assert p.global_batch == 81920


def test_host_counts_respect_the_cluster_size_and_instances():
    from podrun.plan.decompose import host_counts

    got = host_counts(6144, max_hosts=16, devices_per_host=16, devices_per_replica=2, instances_per_host=1,
                      max_local_batch=3, min_grad_accum=4, local_batch=None, grad_accum=None)
    assert got and all(1 <= n <= 16 for n in got)
    assert host_counts(7, max_hosts=4, devices_per_host=4, devices_per_replica=1, instances_per_host=1,
                       max_local_batch=1, min_grad_accum=1, local_batch=None, grad_accum=None) == []


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10 ** 6), st.integers(0, 10 ** 6))
def test_largest_divisor_matches_brute_force(n, cap):
    """decompose finds the local batch by trial division up to sqrt(n), not a walk over max_local_batch."""
    from podrun.plan.decompose import _largest_divisor, divisors

    brute = max((d for d in range(1, min(n, cap) + 1) if n % d == 0), default=None)
    assert _largest_divisor(n, cap) == brute
    if n <= 5000:
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]


# --- spec loader limits and ranges -----------------------------------------------------------------


def cluster_file(tmp_path, old=None, new=None, name="ipu-pod16", raw: bytes | None = None):
    p = tmp_path / "c.yaml"
    if raw is not None:
        p.write_bytes(raw)
        return p
    text = (ROOT / "cluster_specs" / f"{name}.yaml").read_text()
    if old is not None:
        assert old in text
        text = text.replace(old, new, 1)
    p.write_text(text)
    return p


@pytest.mark.parametrize("old,new,fragments", [
    ("bandwidth_gbps: 512", "bandwidth_gbps: 0", ["interconnect.intra_host.bandwidth_gbps", "at least 0.001",
                                                 "the estimate divides by it"]),
    ("latency_us: 2", "latency_us: .inf", ["latency_us", "finite"]),
    ("latency_us: 2", "latency_us: -1.5", ["latency_us", "at least 0"]),
    ("memory_gb: 0.9", "memory_gb: .nan", ["memory_gb", "finite"]),
    ("count: 1", "count: 100000000000000000000000000000", ["hosts.count", "2**53"]),
    ("count: 1", "count: 10000000", ["hosts.count", "at most 100000"]),
    ('pattern: "pod16-host{i}"', 'pattern: "h{i:>300000000}"', ["hosts.pattern", "{i:04d}"]),
    ('pattern: "pod16-host{i}"', 'pattern: "h{j}"', ["hosts.pattern"]),
    ('pattern: "pod16-host{i}"', 'pattern: "fixed"', ["hosts.pattern", "no {i}"]),
    ('pattern: "pod16-host{i}"', 'pattern: "-h{i}"', ["not a valid host name"]),
    ("devices_per_host: 16", "devices_per_host: 0", ["devices_per_host", "at least 1"]),
    ("devices_per_host: 16", "devices_per_host: [16]", ["devices_per_host"]),
    ("name: ipu-pod16", "name: {a: 1}", ["field 'name' must be a string"]),
])
def test_cluster_spec_ranges_name_file_line_field_and_why(tmp_path, old, new, fragments):
    p = cluster_file(tmp_path, old, new)
    with pytest.raises(SpecError) as err:
        load_cluster(str(p))
    msg = str(err.value)
    assert f"{p}" in msg and all(f in msg for f in fragments), msg


def test_hosts_list_names_are_checked(tmp_path):
    p = tmp_path / "c.yaml"
    text = (ROOT / "cluster_specs" / "local.yaml").read_text().replace("hosts: [localhost]", 'hosts: [a, "$(touch x)"]')
    p.write_text(text)
    with pytest.raises(SpecError, match=r"field 'hosts' item 1: '\$\(touch x\)' is not a valid host name"):
        load_cluster(str(p))


@pytest.mark.parametrize("raw,fragment", [
    (b"name: caf\xe9\n", "not UTF-8"),
    (b"name: a\x07b\n", "not YAML text"),
    (b'name: "a\\x00b"\n', "control characters"),
    (b"x: " + b"[" * 2000 + b"]" * 2000 + b"\n", "nested more than 32"),
    (b"a: &a [*a]\n", "nested more than"),
    (b"? [a]\n: 1\n", "a key must be a plain name"),
    (b"name: 0x" + b"f" * 5000 + b"\n", "is no spec value"),
    (b"name: 1" + b"0" * 5000 + b"\n", "cannot read"),
    (b"name: x\n" + b"#" * (2 << 20), "larger than 1 MiB"),
])
def test_yaml_that_is_not_a_spec(tmp_path, raw, fragment):
    p = cluster_file(tmp_path, raw=raw)
    with pytest.raises(SpecError) as err:
        load_cluster(str(p))
    assert str(p) in str(err.value) and fragment in str(err.value), str(err.value)


def test_alias_bomb_is_refused_before_it_is_built(tmp_path):
    lines = ["a0: &a0 [" + ",".join(["x"] * 9) + "]"]
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    p = cluster_file(tmp_path, raw="\n".join(lines).encode())
    with pytest.raises(SpecError, match="once aliases are expanded"):
        load_cluster(str(p))


def test_small_anchors_still_work(tmp_path):
    text = (ROOT / "cluster_specs" / "ipu-pod16.yaml").read_text()
    text = text.replace("  intra_host:\n", "  intra_host: &link\n", 1)
    text = text.split("  inter_host:")[0] + "  inter_host: *link\n" + text.split("    source: Graphcore IPU-POD reference design (approximate)\n")[1]
    p = cluster_file(tmp_path, raw=text.encode())
    c = load_cluster(str(p))
    assert c.interconnect.inter_host == c.interconnect.intra_host


def recipe_dir(tmp_path, old, new, name="efficientnet_b4"):
    text = (ROOT / "recipes" / name / "recipe.yaml").read_text()
    assert old in text, old
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "recipe.yaml").write_text(text.replace(old, new, 1))
    return str(tmp_path / "r")


@pytest.mark.parametrize("old,new,fragments", [
    ("base: 8.4853", "base: .nan", ["lr.base", "finite"]),
    ("base: 8.4853", "base: 0", ["lr.base", "more than 0"]),
    ("epochs: 350", "epochs: .inf", ["epochs", "finite"]),
    ("global_batch: 6144", "global_batch: 9223372036854775808", ["global_batch", "2**53"]),
    ("global_batch: 6144", "global_batch: 100000000", ["global_batch", "at most 16777216", "typo"]),
    ("global_batch: 6144", "global_batch: -1", ["global_batch", "at least 1"]),
    ("warmup_epochs: 70", "warmup_epochs: -1", ["schedule.warmup_epochs"]),
])
def test_recipe_ranges(tmp_path, old, new, fragments):
    with pytest.raises(SpecError) as err:
        load_recipe(recipe_dir(tmp_path, old, new))
    assert all(f in str(err.value) for f in fragments), str(err.value)


def test_every_numeric_spec_field_has_a_range():
    """A new numeric field without a range would let .nan-free but absurd values through."""
    import dataclasses
    import typing

    from podrun.specs import cluster, recipe

    missing = []
    for mod in (cluster, recipe):
        for obj in vars(mod).values():
            if not (dataclasses.is_dataclass(obj) and obj.__module__ == mod.__name__) or obj in (cluster.ClusterSpec,):
                continue
            hints = typing.get_type_hints(obj)
            for f in dataclasses.fields(obj):
                tp = hints[f.name]
                numeric = tp in (int, float) or any(a in (int, float) for a in typing.get_args(tp)) or \
                    any(a in (int, float) for arg in typing.get_args(tp) for a in typing.get_args(arg))
                if numeric and "bound" not in f.metadata and f.name != "gradient_bytes":
                    missing.append(f"{obj.__name__}.{f.name}")
    assert missing == [], missing


# --- the host-name rule ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["h1", "g0001", "node-1.cluster.local", "10.0.0.1", "::1", "fe80::1%eth0"[:-5],
                                  "a_b", "x" * 253])
def test_host_names_accepted(name):
    assert check_name(name, "here") == name


@pytest.mark.parametrize("name", ["", "-n1", "a b", "$(touch x)", "`id`", "h[1-2]", "a;b", "x" * 254, "h\x00",
                                  "caf\u00e9", "a/b"])
def test_host_names_refused(name):
    with pytest.raises(HostError, match="here: .* is not a valid host name"):
        check_name(name, "here")


# --- host resolution in the library, discovery once --------------------------------------------------


class CountingEnv(dict):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.reads: dict[str, int] = {}

    def get(self, key, default=None):
        self.reads[key] = self.reads.get(key, 0) + 1
        return super().get(key, default)


def test_resolve_discovers_the_allocation_once():
    from podrun.cli.options import resolve_plan

    env = CountingEnv({"SLURM_JOB_NODELIST": "n[1-3]"})
    plan, spec, _, src = resolve_plan(None, cluster="dgx-h100", environ=env)
    assert plan.hosts == ("n1", "n2", "n3") and src.source == "SLURM_JOB_NODELIST"
    assert src.discovered is not None and src.discovered.names == plan.hosts
    assert env.reads["SLURM_JOB_NODELIST"] == 1


def test_host_source_order_and_empty_hosts_option(tmp_path):
    from podrun.specs.allocation import host_source

    c = load_cluster("ipu-pod16")
    assert host_source(c, environ={}).source == "cluster spec ipu-pod16"
    assert host_source(c, "a,b", environ={"SLURM_JOB_NODELIST": "n1"}).source == "--hosts"
    with pytest.raises(HostError, match="empty host name"):       # '' was taken as 'not given'
        host_source(c, "", environ={})
    with pytest.raises(HostError, match="not both"):
        host_source(c, "a", str(tmp_path / "hf"), environ={})


def test_hosts_command_reports_scheduler_slots_from_the_one_discovery(tmp_path, monkeypatch, capsys):
    import json

    f = tmp_path / "pe"
    f.write_text("g1 4 q@g1 UNDEFINED\ng2 4 q@g2 UNDEFINED\n")
    for var in ("SLURM_JOB_NODELIST", "SLURM_NODELIST", "PBS_NODEFILE", "SGE_JOB_HOSTLIST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PE_HOSTFILE", str(f))
    rc = main(["hosts", "--cluster", "abci", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["source"] == "PE_HOSTFILE" and [h["scheduler_slots"] for h in d["hosts"]] == [4, 4]


def test_jobscript_package_still_exports_discovery():
    import podrun.jobscript as js
    from podrun.specs import allocation

    assert js.discover is allocation.discover and js.expand_nodelist is allocation.expand_nodelist


def test_estimate_is_finite_at_the_range_edges(tmp_path):
    p = cluster_file(tmp_path, "bandwidth_gbps: 400", "bandwidth_gbps: 0.001")
    text = p.read_text().replace("latency_us: 5", "latency_us: 1000000000")
    p.write_text(text)
    plan = make_plan(load_cluster(str(p)), load_recipe("efficientnet_b4"))
    e = plan.estimate
    assert all(math.isfinite(x) for x in (e.images_per_second, e.step_seconds, e.time_to_train_hours))


def test_hostfile_with_control_characters_and_too_many_hosts(tmp_path):
    from podrun.specs.hosts import parse_hostfile

    f = tmp_path / "hf"
    f.write_text("h1\nh\x1b[31m2\n")
    with pytest.raises(HostError, match="hf:2: control character"):
        parse_hostfile(f)
    f.write_text("".join(f"h{i}\n" for i in range(100_001)))
    with pytest.raises(HostError, match="more than 100000 hosts"):
        parse_hostfile(f)
    f.write_text("h1 slots=99999999999999\n")
    with pytest.raises(HostError, match="slots must be an integer from 1 to 4096"):
        parse_hostfile(f)


def test_script_discovers_the_allocation_once(monkeypatch, capsys):
    """`podrun script` inside an allocation plans on it and checks it against the plan from one discovery."""
    import podrun.jobscript as jobscript
    import podrun.specs.allocation as allocation
    from podrun.cli.main import main

    for var in ("SLURM_NODELIST", "PBS_NODEFILE", "PE_HOSTFILE", "SGE_JOB_HOSTLIST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    calls = []
    real = allocation.discover
    counting = lambda environ: calls.append(1) or real(environ)  # noqa: E731
    monkeypatch.setattr(allocation, "discover", counting)
    monkeypatch.setattr(jobscript, "discover", counting)         # the name `podrun script` imports
    assert main(["script", "--scheduler", "slurm", "--cluster", "dgx-h100", "--", "python", "train.py"]) == 0
    assert "--nodes=2" in capsys.readouterr().out
    assert len(calls) == 1
