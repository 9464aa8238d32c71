"""Every line between processes is read in podrun/wire/ alone: a JSON parse (json.loads, json.load) anywhere else in
podrun/ is one of the records named below, each with why it is no protocol line; and the env names the agent gives a
worker are spelled only as podrun.wire.worker_env's constants (podrun's sitecustomize, which may import no podrun
module, spells the same names)."""
from __future__ import annotations

import ast
from pathlib import Path

from podrun.wire import worker_env

PKG = Path(__file__).resolve().parents[2] / "podrun"

#: "path:function" (path under podrun/; <module> at module level) -> why what it parses is no protocol line
NOT_PROTOCOL = {
    "calibrate/run.py:calibrate": "the calibration worker's result file in the run directory",
    "host/workers.py:instance_workers": "the plan file (plan.json) the controller wrote in the run directory",
    "host/workers.py:read_error_file": "torch's @record error file (TORCHELASTIC_ERROR_FILE), written by torch",
    "host/zygote.py:_recv_request": "a host's own fork request to its zygote (podrun.host.zygote_client): a framed "
                                    "record beside the descriptors it passes, both ends in podrun.host",
    "rundir/job.py:JobRecord": "a submitted job's record in the run directory",
    "launch/resume.py:_earlier": "the launch record a resume reads",
    "live/top.py:from_records": "summary.json of the run",
    "rundir/lock.py:_who": "the run directory lock's owner record",
    "rundir/metrics.py:_record": "a line of metrics.jsonl, written by the workers' runtime",
    "rundir/summary.py:read_json": "summary.json",
    "runtime/env.py:read_plan": "the plan file a worker reads",
    "runtime/inplace.py:read_plan": "the in-place plan file a worker's agent writes from a PlanToken (podrun.wire."
                                    "plan_token), read through safefs's trusted read",
    "runtime/rawstate.py:load": "a raw state file's header",
    "runtime/snapshot.py:_listed": "a snapshot slot's header file",
    "runtime/snapshot.py:recover": "a snapshot's seal, sent between the ranks over torch.distributed, both ends there",
    "train/shards.py:_resumable": "the shard packer's progress file",
    "train/shards.py:ShardDataset": "a shard set's index file",
    "train/stage.py:stage": "a shard set's index file, read before its shards are staged",
}


def json_parses(source: str) -> list[tuple[str, int]]:
    """(enclosing function, line) of each json.loads / json.load call (by module or by a name imported from json)."""
    tree = ast.parse(source)
    names = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "json"
             for a in n.names if a.name in ("loads", "load")}
    out = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and where == "<module>" else where
            if isinstance(child, ast.Call):
                f = child.func
                if (isinstance(f, ast.Attribute) and f.attr in ("loads", "load") and isinstance(f.value, ast.Name)
                        and f.value.id == "json") or (isinstance(f, ast.Name) and f.id in names):
                    out.append((where, child.lineno))
            visit(child, inner)

    visit(tree, "<module>")
    return out


def parses_outside_wire(root: Path = PKG) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("wire/"):
            continue
        for where, line in json_parses(path.read_text(encoding="utf-8")):
            found.setdefault(f"{rel}:{where}", []).append(line)
    return found


def test_no_line_between_processes_is_parsed_outside_wire():
    found = parses_outside_wire()
    unnamed = {k: v for k, v in found.items() if k not in NOT_PROTOCOL}
    assert unnamed == {}, "parse it in podrun/wire/ (a typed message), or name the record in NOT_PROTOCOL with why"
    assert sorted(set(NOT_PROTOCOL) - set(found)) == []        # a record no longer parsed there: drop its entry


def test_the_check_finds_a_parse_by_module_or_by_name(tmp_path):
    """The check can fail: a protocol line's JSON read in a transport (as ssh_common read a probe line), by
    ``json.loads`` or by a ``loads`` imported from json, is named with its function; podrun/wire/ is not looked at."""
    (tmp_path / "launch").mkdir()
    (tmp_path / "wire").mkdir()
    (tmp_path / "launch" / "t.py").write_text("import json\nfrom json import loads as l\n\n"
                                              "def wait_probe(ev):\n    return json.loads(ev.text)\n\n"
                                              "class H:\n    def on(self, text):\n        return l(text)\n")
    (tmp_path / "wire" / "p.py").write_text("import json\nx = json.loads('{}')\n")
    assert parses_outside_wire(tmp_path) == {"launch/t.py:wait_probe": [5], "launch/t.py:H": [9]}


def test_the_agents_env_names_are_spelled_only_as_wires_constants():
    """PODRUN_CPUS, PODRUN_STACK_DIR, PODRUN_STACK_SIGNAL and PODRUN_OUTPUT_CHUNK as string constants: in
    worker_env.py, and in the sitecustomize the agent puts first on a worker's PYTHONPATH, which reads the stack and
    output names (it imports no podrun module but safefs)."""
    names = {worker_env.CPUS_ENV, worker_env.STACK_DIR_ENV, worker_env.STACK_SIGNAL_ENV, worker_env.OUTPUT_CHUNK_ENV}
    where: dict[str, set[str]] = {}
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in names:
                where.setdefault(path.relative_to(PKG).as_posix(), set()).add(node.value)
    assert where == {"wire/worker_env.py": names,
                     "runtime/site/sitecustomize.py": names - {worker_env.CPUS_ENV}}
