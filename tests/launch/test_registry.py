"""Transports and engines are asked their capabilities, never compared by name, outside their two packages; the
click choices are the registry's names; the registry imports no transport's code."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import click

from podrun.launch.engines import ENGINES
from podrun.launch.transports import TRANSPORTS, transport_choices, transport_of

PKG = Path(__file__).resolve().parents[2] / "podrun"
OWNERS = ("launch/transports/", "launch/engines/")       # where a transport's or engine's name may be spelled
NAMES = set(TRANSPORTS) | set(ENGINES)
#: compared expressions that hold another kind of value spelled like a name: how MASTER_ADDR was derived ("ssh"),
#: a Python module's name (runtime/rawstate.py: "torch")
OTHER_VALUES = {"request.master_derived", "mod"}


def _names_in(node: ast.AST) -> list[str]:
    """The registry names ``node`` spells: a str constant, or a tuple/list/set of them."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [e.value for e in items if isinstance(e, ast.Constant) and e.value in NAMES]


def name_comparisons(source: str, where: str) -> list[str]:
    """Every comparison in ``source`` of something against a transport's or engine's name."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        spelled = [n for side in sides for n in _names_in(side)]
        others = {ast.unparse(side) for side in sides if not _names_in(side)}
        if spelled and not others <= OTHER_VALUES:
            out.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_no_module_outside_the_two_packages_compares_a_name():
    found = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if not rel.startswith(OWNERS):
            found += name_comparisons(path.read_text(encoding="utf-8"), rel)
    assert found == []


def test_the_check_finds_each_spelling():
    """The check can fail: ==, !=, in a tuple, on either side."""
    src = ('if request.transport == "local": pass\nif "ssh" != name: pass\nok = name in ("mpirun", "x")\n'
           'ok = engine not in ["horovod"]\nok = request.master_derived == "ssh"\nok = kind == "other"\n')
    assert [f.split(": ", 1)[0] for f in name_comparisons(src, "m.py")] == ["m.py:1", "m.py:2", "m.py:3", "m.py:4"]


def _choices(command: click.Command, option: str) -> list[str]:
    (param,) = [p for p in command.params if option in p.opts]
    return list(param.type.choices)


def test_click_choices_are_the_registry_names():
    from podrun.cli.calibrate_cmd import calibrate
    from podrun.cli.launch_cmd import launch

    assert _choices(launch, "--transport") == transport_choices() == ["local", "ssh", "mpirun", "srun"]
    assert _choices(calibrate, "--transport") == transport_choices()
    assert _choices(launch, "--engine") == list(ENGINES) == ["torch", "poprun", "horovod"]
    assert set(transport_choices()) | {k.name for k in TRANSPORTS.values() if k.engine_only} == set(TRANSPORTS)
    assert {e.transport for e in ENGINES.values()} - {None} <= set(TRANSPORTS)   # each engine's transport is one


def test_capabilities_of_each_transport():
    """What the launch asks of each transport, as the code before the registry asked it of a name."""
    local, ssh, mpirun, srun, poprun = (transport_of(n) for n in ("local", "ssh", "mpirun", "srun", "poprun"))
    assert [k.name for k in TRANSPORTS.values() if not k.remote] == ["local"]
    assert [k.name for k in TRANSPORTS.values() if k.ssh_per_host] == ["ssh"] == \
        [k.name for k in TRANSPORTS.values() if k.env_stdin]
    assert [k.name for k in TRANSPORTS.values() if k.per_instance] == ["local", "ssh"]      # warm
    # elastic: each attempt on its plan's hosts, a launcher's new step or launch whose agents join again
    assert [k.name for k in TRANSPORTS.values() if k.replans] == ["local", "ssh", "mpirun", "srun"]
    assert [k.name for k in TRANSPORTS.values() if k.merged] == ["poprun"]
    assert srun.passes_env and not poprun.agent_store and poprun.engine_only
    # agents that join over TCP: mpirun's and srun's, and the copies of one podrun per node (chosen by podrun, never
    # --transport)
    assert [k.name for k in TRANSPORTS.values() if k.joined] == ["mpirun", "srun", "join"]
    assert transport_of("join").engine_only
    # one MPI rank per worker (--mpi-ranks, horovod): mpirun alone, then on its one merged stream, none joining
    assert [k.name for k in TRANSPORTS.values() if k.for_request(True) is not k] == ["mpirun"]
    ranks = mpirun.for_request(True)
    assert ranks.merged and ranks.agent_per_worker and not ranks.joined and mpirun.for_request(False) is mpirun
    assert not any(k.agent_per_worker for k in TRANSPORTS.values())


def test_a_request_and_its_transport_take_their_capabilities_from_the_registry(tmp_path):
    """What a request's transport does (merged, joined, an agent per worker) is the registry's entry for the
    request (``for_request``): the transport's code does not decide it again."""
    from podrun.launch.request import LaunchRequest
    from podrun.launch.transports.mpirun import MpirunTransport

    for mpi_ranks in (False, True):
        req = LaunchRequest(run_id="r", run_dir=str(tmp_path), plan=None, plan_path=str(tmp_path / "plan.json"),
                            command=("true",), python="python3", workdir="/w", master_addr="h0", master_port=29500,
                            transport="mpirun", mpi_ranks=mpi_ranks)
        t = MpirunTransport(req)
        assert req.kind == t.kind == transport_of("mpirun").for_request(mpi_ranks)
        assert (t.merged, t.kind.joined, t.kind.agent_per_worker) == (mpi_ranks, not mpi_ranks, mpi_ranks)


def test_the_registry_and_help_import_no_transport_code():
    """`podrun launch --help` reads the names without importing a transport (paramiko) or torch."""
    code = ("import sys\nfrom click.testing import CliRunner\nfrom podrun.cli.main import cli\n"
            "r = CliRunner().invoke(cli, ['launch', '--help'])\nassert r.exit_code == 0, r.output\n"
            "bad = [m for m in ('paramiko', 'torch', 'podrun.launch.transports.ssh', 'podrun.launch.transports.mpirun',"
            " 'podrun.launch.engines.poprun') if m in sys.modules]\nassert not bad, bad\n")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
