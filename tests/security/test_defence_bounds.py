"""Tests that kill the input defences' mutants which the other tests let survive (cosmic-ray): the redaction of
words and command lines, the CLI's number types and their bounds, the spec loader's integer and YAML-size
limits, and the agent's preparation of several workers' snapshot directories."""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import click
import pytest

from podrun.cli import types as cli_types
from podrun.errors import SpecError
from podrun.redaction import REDACTED, redact_argv, redact_assignment
from podrun.runtime import snapshot
from podrun.specs.loader import _check_structure, build_dataclass, read_yaml
from podrun.specs.recipe import ModelSpec

pytestmark = pytest.mark.timeout(60)


# -- podrun.redaction ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("word, shown", [
    ("PASSWORD", "PASSWORD"),              # a name-like word with no '=' is no assignment
    ("HF_TOKEN", "HF_TOKEN"),
    ("plain", "plain"),
    ("HF_TOKEN=abc", f"HF_TOKEN={REDACTED}"),
    ("EPOCHS=3", "EPOCHS=3"),
    ("not a name=x", "not a name=x"),
])
def test_redact_assignment_hides_only_the_value_of_a_name_value_word(word, shown):
    """redact_assignment treats a word as NAME=VALUE only when it has an '=' and a valid name before it."""
    assert redact_assignment(word) == shown


@pytest.mark.parametrize("argv, shown", [
    # the value after a secret-named option is hidden, the word after that is not
    (["--token", "X", "Y"], ["--token", REDACTED, "Y"]),
    (["--password", "pw", "train.py", "data"], ["--password", REDACTED, "train.py", "data"]),
    (["--token", "X", "--epochs", "3"], ["--token", REDACTED, "--epochs", "3"]),
    # a plain word that reads like a secret name is no option: the word after it is shown
    (["password", "hunter2"], ["password", "hunter2"]),
    (["token", "abc", "secret", "def"], ["token", "abc", "secret", "def"]),
    # a lone '-' (stdin) is a plain word
    (["-", "x"], ["-", "x"]),
    (["--token=v", "x"], [f"--token={REDACTED}", "x"]),
])
def test_redact_argv_hides_exactly_the_secret_option_values(argv, shown):
    """redact_argv hides the one word after a secret-named option, and treats only '-'-words of 2+ chars as options."""
    assert redact_argv(argv) == shown


# -- podrun.cli.types ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [
    (True, None),                      # a bool is not a number
    (False, None),
    (3, 3.0),
    (2.5, 2.5),
    (float("inf"), float("inf")),      # a float object is taken as it is (the range check refuses it later)
    ("1" * 64, float("1" * 64)),       # 64 characters: the longest text read
    ("1" * 65, None),                  # 65: refused unread
    (" " + "1" * 64 + " ", float("1" * 64)),   # the length is counted after stripping
    ("1e3", 1000.0),
    ("nan", None),
])
def test_ascii_number_takes_numbers_but_not_bools_and_at_most_64_characters(value, expected):
    """ascii_number refuses bools and texts longer than 64 characters, and takes real numbers as they are."""
    assert cli_types.ascii_number(value) == expected


def test_a_bool_is_refused_by_a_number_option():
    """BoundedFloat refuses True even though True == 1 is inside its range."""
    with pytest.raises(click.BadParameter, match="True is not a number"):
        cli_types.DEVICE_MEMORY_GB.convert(True, None, None)


def _refusal(ptype, value) -> str:
    with pytest.raises(click.BadParameter) as e:
        ptype.convert(value, None, None)
    return e.value.message


@pytest.mark.parametrize("value, head", [
    ("1025", "1025 is outside 1..1024: "),                       # a small number in full
    (10 ** 12 - 1, "999999999999 is outside 1..1024: "),
    (10 ** 12, "1e+12 is outside 1..1024: "),                    # a huge one short
    ("12345678901234567890", "1.23e+19 is outside 1..1024: "),
    ("-3", "-3 is outside 1..1024: "),
])
def test_a_bounded_int_error_shows_small_numbers_in_full_and_huge_ones_short(value, head):
    """BoundedInt's out-of-range message shows |n| < 10**12 in full and larger ones as %.3g."""
    assert _refusal(cli_types.NUM_ILDS, value).startswith(head)


@pytest.mark.parametrize("value, accepted", [(1, True), (1024, True), ("1024", True), (1025, False), (0, False)])
def test_num_ilds_takes_1_to_1024(value, accepted):
    """--num-ilds takes 1..1024 inclusive."""
    if accepted:
        assert cli_types.NUM_ILDS.convert(value, None, None) == int(value)
    else:
        _refusal(cli_types.NUM_ILDS, value)


@pytest.mark.parametrize("value, shown", [
    ("a" * 38, "'" + "a" * 38 + "'"),                # repr of 40 characters: shown whole
    ("a" * 39, "'" + "a" * 36 + "..."),              # repr of 41: cut to 37 and '...'
    ("a" * 200, "'" + "a" * 36 + "..."),
])
def test_a_refused_value_is_shown_whole_up_to_40_characters(value, shown):
    """An option's refusal quotes the value's repr whole up to 40 characters, else its first 37 and '...'."""
    assert _refusal(cli_types.PORT, value) == f"{shown} is not an integer ({cli_types.PORT.why})"
    assert _refusal(cli_types.DEVICE_MEMORY_GB, value).startswith(f"{shown} is not a number (")


# -- podrun.specs.loader: MAX_SPEC_INT and MAX_YAML_NODES -------------------------------------------------------

YAML_NODES = 200_000     # podrun.specs.limits.MAX_YAML_NODES, written out: the tests pin the number itself

def _model(tmp_path: Path, params: int) -> ModelSpec:
    path = tmp_path / "recipe.yaml"
    path.write_text(f"model:\n  name: resnet50\n  params: {params}\n")
    data, src = read_yaml(path, "recipe")
    return build_dataclass(ModelSpec, data["model"], ("model",), src)


def test_a_spec_integer_of_2_to_the_53_is_taken_and_one_more_is_refused_naming_the_field(tmp_path):
    """A recipe's integer field takes 2**53 and refuses 2**53 + 1, with file:line and the field's name."""
    assert _model(tmp_path, 2 ** 53).params == 2 ** 53
    with pytest.raises(SpecError) as e:
        _model(tmp_path, 2 ** 53 + 1)
    assert f"{tmp_path / 'recipe.yaml'}:3: field 'model.params' must be an integer of at most 2**53" in e.value.message
    assert str(2 ** 53 + 1) in e.value.message


def _alias_doc(total: int) -> str:
    """A mapping whose nodes, once aliases are expanded, number ``total``: 1 (top) + 1 + k (a) + 1 + m*(1+k) (b)
    + 1 + p (c)."""
    k, m = 999, 198                    # a: 1 + 999 nodes, b: 1 + 198 * 1000 nodes
    p = total - (1 + (1 + k) + (1 + m * (1 + k)) + 1)
    assert p >= 0
    return (f"a: &a [{', '.join(['0'] * k)}]\n"
            f"b: [{', '.join(['*a'] * m)}]\n"
            f"c: [{', '.join(['0'] * p)}]\n")


def test_a_yaml_of_max_nodes_after_aliases_is_read_and_one_more_is_refused(tmp_path):
    """read_yaml takes exactly MAX_YAML_NODES (200000) nodes once aliases are expanded, and refuses one more."""
    path = tmp_path / "spec.yaml"
    path.write_text(_alias_doc(YAML_NODES))
    data, _ = read_yaml(path, "cluster spec")
    assert len(data["b"]) == 198 and len(data["a"]) == 999
    path.write_text(_alias_doc(YAML_NODES + 1))
    with pytest.raises(SpecError, match="more than 200000 values once aliases are expanded"):
        read_yaml(path, "cluster spec")


def test_a_yaml_of_max_parser_events_passes_the_structure_check_and_one_more_is_refused(tmp_path):
    """read_yaml's first check (_check_structure) takes exactly MAX_YAML_NODES parser events and refuses one more."""
    # stream, document and sequence start; n scalars; sequence, document and stream end
    n = YAML_NODES - 6
    _check_structure("[" + ",".join(["0"] * n) + "]", tmp_path)
    with pytest.raises(SpecError, match=f"{tmp_path}: more than 200000 YAML values"):
        _check_structure("[" + ",".join(["0"] * (n + 1)) + "]", tmp_path)


# -- podrun.runtime.snapshot.prepare_dirs -------------------------------------------------------------------------

def test_prepare_dirs_goes_on_past_an_env_without_a_snapshot_dir_and_a_repeated_one():
    """prepare_dirs makes the snapshot directory of every worker env, after ones without any or with a repeat."""
    base = Path(f"/dev/shm/podrun-test-{uuid.uuid4().hex}")
    dirs = [str(base / "host-a"), str(base / "host-b")]
    name = "PODRUN_SNAPSHOT_DIR"
    envs = [{"RANK": "0"}, {name: ""}, {name: dirs[0]}, {name: dirs[0]}, {"RANK": "4"}, {name: dirs[1]}]
    try:
        assert snapshot.prepare_dirs(envs) == []
        for d in dirs:
            assert os.path.isdir(d) and (os.lstat(d).st_mode & 0o777) == 0o700
        assert [e.get(name) for e in envs] == [None, "", dirs[0], dirs[0], None, dirs[1]]
    finally:
        for d in dirs:
            snapshot.remove(d)
    assert not base.exists()


def test_cores_per_node_and_device_memory_take_their_whole_range_and_no_more():
    """--cpus-per-node: 1 .. 2**20 (a node of a million cores is no typo's reach); --device-memory: above 0 GB."""
    assert cli_types.CPUS.convert(1, None, None) == 1 and cli_types.CPUS.convert(1 << 20, None, None) == 1 << 20
    for bad in (0, (1 << 20) + 1):
        with pytest.raises(click.BadParameter):
            cli_types.CPUS.convert(bad, None, None)
    assert cli_types.DEVICE_MEMORY_GB.convert("0.5", None, None) == 0.5
    with pytest.raises(click.BadParameter):
        cli_types.DEVICE_MEMORY_GB.convert("0", None, None)


def test_heartbeats_and_the_straggler_window_are_above_0_and_an_age_may_be_0():
    """--heartbeat and --straggler-timeout: 0 s is refused (no heartbeat, no window); --max-age 0 days is a bound."""
    for t in (cli_types.HEARTBEAT, cli_types.STRAGGLER):
        assert t.convert("0.5", None, None) == 0.5
        with pytest.raises(click.BadParameter):
            t.convert("0", None, None)
    assert cli_types.AGE_DAYS.convert("0", None, None) == 0.0
