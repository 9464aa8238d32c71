"""The preflight's reading of a host's facts (podrun.launch.transports.ssh_common.HeldAgentTransport._check_facts):
the facts this machine reports (podrun.wire.probe.facts, what a held agent sends) against a host whose podrun or
Python differs."""
from __future__ import annotations

import sys
from types import SimpleNamespace

import podrun
from podrun.launch.transports.ssh_common import HeldAgentTransport
from podrun.wire.probe import facts, python_version


def _problems(host_facts: dict) -> list[str]:
    transport = SimpleNamespace(request=SimpleNamespace(python=sys.executable))
    return [p.message for p in HeldAgentTransport._check_facts(transport, "h7", host_facts)]


def test_this_machines_facts_pass_and_the_python_version_is_the_interpreters():
    here = facts()
    assert here["python"] == python_version() == "{}.{}.{}".format(*sys.version_info[:3])
    assert _problems(here) == []
    major, minor, _ = sys.version_info[:3]
    assert _problems({**here, "python": f"{major}.{minor}.999"}) == []      # another patch release is the same Python


def test_a_host_with_another_python_or_podrun_is_named_with_both_versions():
    here = facts()
    other = f"{sys.version_info[0]}.{sys.version_info[1] + 1}.0"
    assert _problems({**here, "python": other}) == [f"python {other} there, {python_version()} here"]
    assert _problems({**here, "podrun": "0.0.0"}) == [f"podrun 0.0.0 there, {podrun.__version__} here"]
