"""Slurm hostlist expansion: examples, malformed lists, and hypothesis round trips through a compressor."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from podrun.errors import HostError, PodrunError
from podrun.specs.allocation import compress_hostlist, expand_nodelist


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("g[0001-0003,0007],h5", ["g0001", "g0002", "g0003", "g0007", "h5"]),
        ("node1", ["node1"]),
        ("a,b,c", ["a", "b", "c"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        ("n[08-11]", ["n08", "n09", "n10", "n11"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("x[3,1,2]", ["x3", "x1", "x2"]),                       # written order, never sorted
        ("gpu[1-2].cluster.local,login", ["gpu1.cluster.local", "gpu2.cluster.local", "login"]),
        ("[1-3]", ["1", "2", "3"]),
        (" h1 ", ["h1"]),
    ],
)
def test_expand_examples(text, hosts):
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize(
    "text, part",
    [
        ("g[0001-0003", "never closed"),
        ("g0001]", "']' without '['"),
        ("g[1-[2]]", "nested"),
        ("g[3-1]", "backwards"),
        ("g[a-b]", "bad range 'a-b'"),
        ("g[1-2-3]", "bad range '1-2-3'"),
        ("g[]", "empty brackets"),
        ("a,,b", "empty host name"),
        ("a b", "' '"),
        ("", "is empty"),
        ("g[1-10000000]", "more than"),
        ("g$(id)", "'$'"),
    ],
)
def test_malformed_nodelists_name_the_variable_and_the_part(text, part):
    with pytest.raises(HostError) as err:
        expand_nodelist(text, "SLURM_JOB_NODELIST")
    assert "SLURM_JOB_NODELIST" in err.value.message
    assert part in err.value.message
    assert isinstance(err.value, PodrunError) and err.value.exit_code == 2


def test_compress_examples():
    assert compress_hostlist(["g0001", "g0002", "g0003", "g0007", "h5"]) == "g[0001-0003,0007],h5"
    assert compress_hostlist(["n9", "n10"]) == "n9,n10"          # different widths stay apart
    assert compress_hostlist(["a", "b"]) == "a,b"
    assert compress_hostlist(["n3", "n1"]) == "n3,n1"            # order kept


_label = st.text(alphabet="abcxyz-.", min_size=0, max_size=3)
_host = st.builds(
    lambda pre, num, width, post: f"{pre}{str(num).zfill(width)}{post}" if (pre or post or width) else "h",
    st.text(alphabet="abgn", min_size=1, max_size=3),
    st.integers(min_value=0, max_value=120),
    st.integers(min_value=0, max_value=4),
    _label,
).map(lambda h: h if h[-1:] not in "-." else h + "x")
_hosts = st.lists(st.one_of(_host, st.sampled_from(["login", "g0001", "g0002", "g0003"])), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(_hosts)
def test_compress_then_expand_is_identity(hosts):
    text = compress_hostlist(hosts)
    assert expand_nodelist(text, "SLURM_JOB_NODELIST") == hosts


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 500), st.integers(0, 20)), min_size=1, max_size=6), st.integers(1, 4))
def test_bracket_expansion_keeps_written_order(ranges, width):
    body = ",".join(f"{str(a).zfill(width)}-{str(a + n).zfill(width)}" for a, n in ranges)
    got = expand_nodelist(f"h[{body}]")
    want = [f"h{str(i).zfill(width)}" for a, n in ranges for i in range(a, a + n + 1)]
    assert got == want


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(alphabet="abcdefgh0123456789-._", min_size=1, max_size=8).filter(lambda s: s[0] not in "-"),
                min_size=1, max_size=20))
def test_plain_names_joined_by_commas_expand_to_themselves(names):
    assert expand_nodelist(",".join(names)) == names


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab1[],-", max_size=14))
def test_fast_split_agrees_with_the_character_scanner(text):
    from podrun.specs.allocation import _split_top, _split_top_slow

    def outcome(fn):
        try:
            return fn(text, "X")
        except HostError as e:
            return ("error", e.message)

    assert outcome(_split_top) == outcome(_split_top_slow)


# --- hostile nodelists: refused where they enter, with the variable named ---------------------------


@pytest.mark.parametrize("text, fragment", [
    ("-n[1-2]", "not a valid host name"),                  # would read as an option to srun/mpirun
    ("n[1-" + "9" * 5000 + "]", "more than 18 digits"),   # once: int() digit limit, a traceback
    ("$(touch x)", "not allowed"),
    ("a b", "not allowed"),
    ("g[1-100000000]", "more than 100000 hosts"),
    ("r[1-400]n[1-400]", "more than 100000 hosts"),
    ("x" * 300, "not a valid host name"),                  # longer than a DNS name
])
def test_hostile_nodelists_are_refused(text, fragment):
    with pytest.raises(HostError) as err:
        expand_nodelist(text, "SLURM_JOB_NODELIST")
    assert "SLURM_JOB_NODELIST" in err.value.message and fragment in err.value.message
    assert len(err.value.message) < 300                    # one paragraph, the input cut


def test_the_worker_runtime_uses_the_one_parser():
    """runtime/env.py found MASTER_ADDR with its own fallback parse; now a malformed list is an error."""
    from podrun.runtime.env import _slurm_first_node

    assert _slurm_first_node({"SLURM_JOB_NODELIST": "gpu[07-08]"}) == "gpu07"
    assert _slurm_first_node({"SLURM_STEP_NODELIST": "rack[2-3]-n[01-02]"}) == "rack2-n01"
    assert _slurm_first_node({}) is None
    with pytest.raises(HostError, match="SLURM_JOB_NODELIST"):
        _slurm_first_node({"SLURM_JOB_NODELIST": "-x[1-2]"})


def test_srun_transport_uses_the_one_parser():
    from podrun.launch.transports.srun import allocation_hosts

    assert allocation_hosts({"SLURM_JOB_NODELIST": "n[1-2]"}) == ["n1", "n2"]
    with pytest.raises(HostError):
        allocation_hosts({"SLURM_JOB_NODELIST": "n[1-2],$(id)"})


def test_one_nodelist_parser_in_the_package():
    """No module but podrun.specs.allocation parses bracket ranges; podrun.jobscript.discover is gone."""
    import importlib.util
    import pathlib
    import re

    import podrun

    assert importlib.util.find_spec("podrun.jobscript.discover") is None
    root = pathlib.Path(podrun.__file__).parent
    parsers = [p.relative_to(root).as_posix() for p in root.rglob("*.py")
               if re.search(r"\\\[\(\\d\+\)|_expand_range_list|def expand_nodelist", p.read_text())]
    assert parsers == ["specs/allocation.py"], parsers
