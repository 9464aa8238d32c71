"""The preflight's reading of a host's facts (podrun.launch.transports.ssh_common.HeldAgentTransport._check_facts):
the facts this machine reports (podrun.wire.probe.facts, what a held agent sends) against a host whose podrun or
Python differs."""
from __future__ import annotations

import sys
from dataclasses import replace
from types import SimpleNamespace

import podrun
from podrun.launch.transports.ssh_common import HeldAgentTransport
from podrun.wire.probe import Facts, facts, python_version


def _problems(host_facts: Facts) -> list[str]:
    transport = SimpleNamespace(request=SimpleNamespace(python=sys.executable))
    return [p.message for p in HeldAgentTransport._check_facts(transport, "h7", host_facts)]


def test_this_machines_facts_pass_and_the_python_version_is_the_interpreters():
    here = facts()
    assert here.python == python_version() == "{}.{}.{}".format(*sys.version_info[:3])
    assert _problems(here) == []
    major, minor, _ = sys.version_info[:3]
    assert _problems(replace(here, python=f"{major}.{minor}.999")) == []      # another patch release is the same Python


def test_a_host_with_another_python_or_podrun_is_named_with_both_versions():
    here = facts()
    other = f"{sys.version_info[0]}.{sys.version_info[1] + 1}.0"
    assert _problems(replace(here, python=other)) == [f"python {other} there, {python_version()} here"]
    assert _problems(replace(here, podrun="0.0.0")) == [f"podrun 0.0.0 there, {podrun.__version__} here"]


def test_the_facts_read_back_as_written_and_an_older_agents_say_less():
    """A probe line is Facts written and read back whole (``decode(encode(f)) == f``); one that says less (an agent
    of another podrun) reads as what it says, its version first, and one that is no JSON object is no facts."""
    here = facts(master_addr="127.0.0.1", master_port=9)
    assert here.master_resolves == ("127.0.0.1",) and here.master_reach is not None
    assert Facts.decode(here.encode()) == here and Facts.decode(facts().encode()) == facts()
    assert Facts.decode('{"podrun":"0.1","python":"3.9.1","ports":[1,"x",true]}') == Facts("0.1", "3.9.1", ports=(1,))
    assert Facts.read("[1]") is None and Facts.read("no json") is None
