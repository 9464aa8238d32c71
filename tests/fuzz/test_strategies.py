"""The fuzz strategies' own tests: every draw is a fresh object, and no draw changes module state.

A hostile value that is a list or a dict used to be handed out as the very object in HOSTILE_SCALARS;
the mutations then put it into a document by reference and later mutations changed it in place (even
made it hold itself), so later examples drew from altered constants and a rare run hit RecursionError
and hypothesis's FlakyStrategyDefinition. These tests fail on that strategy deterministically.
"""
from __future__ import annotations

import copy

import yaml
from hypothesis import find, given, settings
from hypothesis import strategies as st

from tests.fuzz import test_hostile_input as fuzz

# derandomize: the same examples on every run, so a failure here never depends on luck
FIXED = settings(max_examples=300, derandomize=True, database=None, deadline=None)


@FIXED
@given(st.data())
def test_a_drawn_hostile_value_can_be_changed_without_changing_the_next_draw(data):
    before = copy.deepcopy(fuzz.HOSTILE_SCALARS)
    first = data.draw(fuzz.hostile)
    if isinstance(first, list):
        first.append(first)               # what a later mutation of the document can do to it
    elif isinstance(first, dict):
        first["self"] = first
    assert repr(fuzz.HOSTILE_SCALARS) == repr(before), "a draw handed out a module constant by reference"


def test_the_recursion_from_the_ci_failure_cannot_happen():
    """The exact sequence that failed CI: a field set to a drawn [1, [2]], then its element [1] set to
    another draw of [1, [2]]. With draws that are the constant itself, both are one object, which then holds
    itself, and walking the document recursed until RecursionError."""
    first = find(fuzz.hostile_scalars, lambda v: v == [1, [2]], settings=FIXED)
    again = find(fuzz.hostile_scalars, lambda v: v == [1, [2]], settings=FIXED)
    assert first is not again, "two draws of [1, [2]] are one object"
    doc = fuzz._set({"interconnect": {"intra_host": 512}}, ("interconnect", "intra_host"), first)
    doc = fuzz._set(doc, ("interconnect", "intra_host", 1), again)
    assert len(list(fuzz._leaves(doc))) < 20       # a document that holds itself recurses here
    yaml.safe_dump(doc)
    assert [1, [2]] in fuzz.HOSTILE_SCALARS, "the constant [1, [2]] was changed"


@FIXED
@given(st.data())
def test_mutated_yaml_leaves_the_module_constants_as_they_were(data):
    snapshot = repr((fuzz.HOSTILE_SCALARS, fuzz.CLUSTER_TEXTS, fuzz.RECIPE_TEXTS))
    name = data.draw(st.sampled_from(sorted(fuzz.CLUSTER_TEXTS)))
    data.draw(fuzz.mutated_yaml(fuzz.CLUSTER_TEXTS[name]))
    data.draw(fuzz.mutated_yaml(fuzz.CLUSTER_TEXTS[name]))
    assert repr((fuzz.HOSTILE_SCALARS, fuzz.CLUSTER_TEXTS, fuzz.RECIPE_TEXTS)) == snapshot
