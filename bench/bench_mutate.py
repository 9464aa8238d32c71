"""`python -m bench mutate`: a mutation check (cosmic-ray) of the defence modules against the fast tests guarding them.

It never mutates the working tree: the tree is copied into a new temporary directory, cosmic-ray mutates the copy,
and every process of a test run (pytest and the `python -m podrun` it starts) imports the copy through PYTHONPATH,
which wins over the editable install's finder (that one is appended to sys.meta_path, after the path finder);
a sentinel run per module, with the module replaced by a `raise`, shows its tests fail on the copy.

Mutants are sampled: at most --per-module sites (places in the source a mutation operator changes; those inside
annotations, never evaluated, and, where SCOPES names them, outside the functions that hold the defence),
one operator at each, chosen by --seed (which also seeds hypothesis), so a run is replayable and sized to the time
at hand. A mutant is killed when its tests fail, survives when they pass; a run longer than the
per-mutant timeout counts as a timeout (a detection, shown apart). Needs `pip install -e '.[mutate]'`.
"""
from __future__ import annotations

import argparse
import ast
import glob
import importlib.util
import json
import os
import platform
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
COSMIC_RAY = [sys.executable, "-m", "cosmic_ray.cli"]      # this interpreter's, whatever PATH holds
COPIED = ("podrun", "tests", "bench", "recipes", "cluster_specs", "docs", "pyproject.toml", "README.md")

AGENT = "tests/host/test_agent.py::"
FAULTS = "tests/train/test_checkpoint_faults.py::"
JOIN = "tests/launch/test_join.py::"
PLANTED = "tests/faults/test_other_user.py::test_code_the_other_user_planted_in_a_shared_working_directory_never_runs"
# defence module -> the fast tests that guard it (pytest arguments, the fastest first: a run stops at its first
# failure; a glob must match at least one file)
GUARDS = {
    "podrun/safefs.py": ["tests/security/test_safe_files.py", "tests/security/test_safefs.py",
                         "tests/faults/test_other_user*.py"],
    "podrun/runtime/snapshot.py": ["tests/runtime/test_snapshot_format.py", "tests/runtime/test_snapshot.py",
                                   "tests/runtime/test_snapshot_receive.py", "tests/security/test_defence_bounds.py",
                                   "tests/elastic/test_snapshot_security.py"],
    "podrun/train/checkpoint.py": [
        "tests/train/test_keep_checkpoints.py::test_save_keeps_the_newest_n_and_never_the_newest_for_0",
        "tests/security/test_defence_mutants.py", "tests/train/test_checkpoint_security.py",
        FAULTS + "test_truncated_and_empty_checkpoints_are_named_and_none_good_is_exit_2",
        FAULTS + "test_flipped_bytes_are_found_and_the_older_good_checkpoint_is_used",
        FAULTS + "test_temp_files_go_only_with_their_dead_writer",
        FAULTS + "test_a_disk_that_fills_during_the_write_is_named_and_leaves_no_temp_file"],
    "podrun/rundir/lock.py": ["tests/security/test_defence_mutants.py",
                             FAULTS + "test_a_restart_waits_for_its_own_runs_earlier_attempt_never_for_another_run",
                             FAULTS + "test_temp_files_go_only_with_their_dead_writer",
                             FAULTS + "test_a_second_writer_of_a_run_dir_or_a_checkpoint_dir_is_refused"],
    "podrun/redaction.py": ["tests/security/test_defence_bounds.py", "tests/security/test_defence_mutants.py",
                            "tests/security/test_redact_by_value.py",
                            "tests/faults/test_rundir.py"],
    "podrun/wire/envchannel.py": [AGENT + "test_env_message_frames_values_that_hold_the_control_letters",
                                  AGENT + "test_held_agent_reads_its_env_from_stdin_before_the_probe_and_the_go",
                                  AGENT + "test_agent_without_its_env_message_ends_with_a_message",
                                  "tests/security/test_defence_mutants.py"],
    "podrun/cli/types.py": ["tests/security/test_defence_bounds.py", "tests/specs/test_bounded_inputs.py",
                            "tests/cli/test_bounded_options.py", "tests/specs/test_input_boundary.py",
                            "tests/fuzz/test_hostile_input.py"],
    "podrun/specs/limits.py": ["tests/security/test_defence_bounds.py", "tests/cli/test_bounded_options.py",
                               "tests/specs/test_input_boundary.py"],
    "podrun/plan/decompose.py": ["tests/plan/test_planner.py", "tests/security/test_defence_mutants.py"],
    "podrun/launch/hangs.py": ["tests/launch/test_watch.py", "tests/cli/test_launch_options.py",
                               "tests/security/test_defence_mutants.py"],
    "podrun/host/link.py": ["tests/host/test_link.py", "tests/security/test_defence_mutants.py"],
    "podrun/launch/transports/local.py": [
        "tests/launch/test_secrets_argv.py::test_env_values_are_on_no_command_line_local",
        "tests/security/test_defence_mutants.py"],
    "podrun/wire/join.py": [
        "tests/wire/test_wire_contracts.py::"
        "test_a_hand_shake_line_in_pieces_is_read_whole_and_one_past_its_limit_is_none",
        JOIN + "test_a_controller_that_proves_the_key_over_both_nonces_the_run_and_the_instance_is_the_only_one_"
               "believed",
        JOIN + "test_a_join_proof_made_for_another_instance_run_or_nonce_is_the_wrong_key",
        JOIN + "test_an_agent_that_proves_the_key_joins_and_the_rest_are_refused_in_one_line_each",
        JOIN + "test_an_agent_names_the_address_it_cannot_reach_and_a_short_key_is_no_key",
        # (the forged controller as `nobody` is left out: its script lies in the mutants' private copy of the tree)
        JOIN + "test_copies_without_the_variable_share_the_users_key_file_made_once_private_and_the_variable_wins"],
    # the planted-code test on this machine only (its ssh case brings up the harness's hosts for each mutant)
    "podrun/pystart.py": ["tests/security/test_python_starts.py", "tests/wire/test_wire_contracts.py",
                          "tests/launch/test_torchrun_map.py", "tests/host/test_lean_agent.py",
                          PLANTED + "[local cold]", PLANTED + "[local warm]"],
    "podrun/specs/__init__.py": [
        "tests/faults/test_other_user.py::"
        "test_a_recipe_or_cluster_spec_of_the_other_user_named_like_podruns_own_never_runs",
        "tests/specs/test_specs.py", "tests/specs/test_bounded_inputs.py"],
}

# where a module holds more than the defence, the functions that hold it (the other functions are not mutated)
SCOPES = {
    "podrun/specs/__init__.py": ("_check_owner", "load_cluster", "load_recipe"),    # the owner check on recipes
    "podrun/host/link.py": ("emit", "link_close"),                  # nothing written once closed or lost
    "podrun/launch/transports/local.py": ("start",),                 # the agents' env, argv, session, stdin copy
    # the proofs both ways, the args' MAC, the key's checks and the agent's side of the hand-shake (not addresses)
    "podrun/wire/join.py": ("_mac", "proof", "proof_ok", "controller_proof", "args_mac", "with_mac", "user_key",
                            "key_problem", "read_line", "_handshake"),
    # the directories, files, MACs and receiving of snapshots (not the writer's threading or the state's freezing)
    "podrun/runtime/snapshot.py": ("check_private", "make_private", "open_dir", "prepare_dirs", "_read_small",
                                   "_listed", "_Seal", "_matches", "_open_data", "_commit", "_uncommit", "put",
                                   "verified", "read", "open_writer", "recover", "_load"),
    # the digest, the write, the trust and the choice of a checkpoint (not the generators' state, the pruning or
    # the messages of a full disk)
    "podrun/train/checkpoint.py": ("check_keep", "write", "seal", "verify", "decode", "remove_dead_temps",
                                   "save", "list_checkpoints", "newest_good", "load_latest"),
}


def short(module: str) -> str:
    """podrun/wire/envchannel.py -> envchannel (the name --modules takes; the path works too)."""
    return Path(module).stem


def pick_modules(names: list[str] | None) -> list[str]:
    if not names:
        return list(GUARDS)
    by_name = {short(m): m for m in GUARDS} | {m: m for m in GUARDS}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"python -m bench mutate: unknown module(s) {', '.join(unknown)}; "
                         f"known: {', '.join(short(m) for m in GUARDS)}")
    return [by_name[n] for n in names]


def annotation_spans(source: str) -> set[tuple[int, int, int]]:
    """(line, first col, last col) spans of the annotations in ``source`` (never evaluated here: every module
    has `from __future__ import annotations`); a mutant there cannot be killed."""
    spans = set()
    for node in ast.walk(ast.parse(source)):
        for ann in ([node.returns] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else []) + \
                   ([node.annotation] if isinstance(node, (ast.arg, ast.AnnAssign)) else []):
            if ann is not None:
                spans.add((ann.lineno, ann.col_offset, ann.end_col_offset))
    return spans


def in_annotation(pos: tuple[int, int], spans) -> bool:
    return any(line == pos[0] and lo <= pos[1] < hi for line, lo, hi in spans)


def copy_tree(dest: Path) -> None:
    """COPIED into ``dest``, less caches and bench/'s own output (bench/out, bench/results)."""
    def ignore(folder, names):
        return [n for n in names if n in ("__pycache__", ".pytest_cache", ".hypothesis") or n.endswith(".pyc")
                or (Path(folder) == ROOT / "bench" and n in ("out", "results"))]

    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        elif src.exists():
            shutil.copy2(src, dest / name)


def guard_args(copy: Path, module: str) -> list[str]:
    """The module's guard tests as pytest arguments in the copy; a glob that matches nothing is an error."""
    out = []
    for arg in GUARDS[module]:
        found = sorted(str(Path(p).relative_to(copy)) for p in glob.glob(str(copy / arg))) if "*" in arg else \
            ([arg] if (copy / arg.split("::")[0]).exists() else [])
        if not found:
            raise RuntimeError(f"its guard {arg} matches no file")
        out += found
    return out


def guard_command(module: str, tests: list[str], seed: int) -> str:
    """The test run of one mutant: its stale bytecode removed first (tests/conftest.py turns bytecode writing
    back on, and a mutant of the same size written in the same second would pass the cache's check), then the
    guards in one process, stopping at the first failure, hypothesis's examples drawn from the seed."""
    pyc = str(Path(module).parent / "__pycache__" / f"{Path(module).stem}.*.pyc")
    pytest = [sys.executable, "-m", "pytest", "-q", "-x", "-n0", "-p", "no:cacheprovider",
              f"--hypothesis-seed={seed}", *tests]
    return "sh -c " + shlex.quote(f"rm -f {pyc}; exec {shlex.join(pytest)}")


def run_guards(copy: Path, command: str, env: dict, timeout: float) -> tuple[bool, float, str]:
    t0 = time.monotonic()
    try:
        cp = subprocess.run(shlex.split(command), cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, time.monotonic() - t0, f"timed out after {timeout:.0f} s"
    return cp.returncode == 0, time.monotonic() - t0, (cp.stdout + cp.stderr)[-2000:]


def sample(db_path: Path, copy: Path, module: str, per_module: int, seed: int) -> tuple[int, int, int]:
    """Mark every mutant but the sampled ones skipped in the session; (sites, mutants, sampled): the sites in
    scope outside annotations, every mutant cosmic-ray made of the module, those sampled."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    spans = annotation_spans((copy / module).read_text())
    scope = SCOPES.get(module)
    with use_db(str(db_path), WorkDB.Mode.open) as db:
        items = list(db.work_items)
        sites: dict[tuple, list] = {}
        for item in items:
            m = item.mutations[0]
            if not in_annotation(tuple(m.start_pos), spans) and (scope is None or m.definition_name in scope):
                sites.setdefault((tuple(m.start_pos), tuple(m.end_pos)), []).append(item)
        rng = random.Random(f"{seed}:{module}")
        chosen = rng.sample(sorted(sites), min(per_module, len(sites)))
        keep = set()
        for site in chosen:
            keep.add(rng.choice(sorted(sites[site], key=lambda i: (i.mutations[0].operator_name,
                                                                   i.mutations[0].occurrence))).job_id)
        db.set_multiple_results([i.job_id for i in items if i.job_id not in keep],
                                WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output="not sampled"))
    return len(sites), len(items), len(keep)


def outcomes(db_path: Path) -> dict:
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    out = {"killed": 0, "survived": 0, "timeout": 0, "error": 0, "survivors": []}
    with use_db(str(db_path), WorkDB.Mode.open) as db:
        for item, result in db.completed_work_items:
            if result.worker_outcome == WorkerOutcome.SKIPPED:
                continue
            m = item.mutations[0]
            if result.worker_outcome != WorkerOutcome.NORMAL or result.test_outcome == TestOutcome.INCOMPETENT:
                out["error"] += 1
            elif result.test_outcome == TestOutcome.SURVIVED:
                out["survived"] += 1
                out["survivors"].append({
                    "where": f"{m.module_path}:{m.start_pos[0]}", "operator": m.operator_name.removeprefix("core/"),
                    "diff": [line for line in (result.diff or "").splitlines()
                             if line[:1] in "+-" and line[:3] not in ("+++", "---")]})
            elif result.output == "timeout":
                out["timeout"] += 1
            else:
                out["killed"] += 1
    out["survivors"].sort(key=lambda s: int(s["where"].rsplit(":", 1)[1]))
    return out


def check_module(copy: Path, module: str, args, env: dict) -> dict:
    rec = {"module": module, "guards": GUARDS[module], "scope": SCOPES.get(module)}
    try:
        tests = guard_args(copy, module)
    except RuntimeError as exc:
        return rec | {"problem": str(exc)}
    command = guard_command(module, tests, args.seed)
    ok, base_s, tail = run_guards(copy, command, env, args.timeout or 600)
    if not ok:
        return rec | {"problem": "its guard tests fail on the unmutated copy", "output": tail}
    source = (copy / module).read_text()
    (copy / module).write_text("raise ImportError('bench mutate: sentinel')\n")
    try:
        sentinel_passed, _, _ = run_guards(copy, command, env, args.timeout or 600)
    finally:
        (copy / module).write_text(source)
    if sentinel_passed:
        return rec | {"problem": "its guard tests pass with the module replaced by a raise: they do not import "
                                 "the copy, or do not exercise the module"}
    timeout = args.timeout or max(30.0, 5 * base_s)
    work = copy.parent / f"{short(module)}"
    work.mkdir()
    config = work / "config.toml"
    config.write_text(f'[cosmic-ray]\nmodule-path = "{module}"\ntimeout = {timeout:.0f}\nexcluded-modules = []\n'
                      f"test-command = {json.dumps(command)}\n\n[cosmic-ray.distributor]\nname = \"local\"\n")
    db = work / "session.sqlite"
    subprocess.run([*COSMIC_RAY, "init", str(config), str(db)], cwd=copy, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    sites, mutants, sampled = sample(db, copy, module, args.per_module, args.seed)
    t0 = time.monotonic()
    subprocess.run([*COSMIC_RAY, "exec", str(config), str(db)], cwd=copy, env=env, check=True,
                   stdout=subprocess.DEVNULL, preexec_fn=lambda: os.nice(10))
    spent = time.monotonic() - t0
    res = outcomes(db)
    ran = res["killed"] + res["survived"] + res["timeout"]
    return rec | {"tests": tests, "sites": sites, "mutants": mutants, "sampled": sampled, **res,
                  "score": round(100 * (ran - res["survived"]) / ran, 1) if ran > 0 else None,
                  "baseline_s": round(base_s, 2), "s_per_mutant": round(spent / sampled, 2) if sampled > 0 else None,
                  "timeout_s": round(timeout)}


def print_table(records: list[dict]) -> None:
    cols = ["module", "sampled", "killed", "survived", "timeout", "error", "score", "s_per_mutant"]
    rows = [[short(r["module"])] + ["-" if r.get(c) is None else str(r[c]) for c in cols[1:]]
            for r in records if "problem" not in r]
    widths = [max([len(c)] + [len(row[i]) for row in rows]) for i, c in enumerate(cols)]
    for row in [cols] + rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))
    for r in records:
        for s in r.get("survivors", []):
            print(f"survived: {s['where']} {s['operator']}: {' / '.join(s['diff'])}")
        if "problem" in r:
            print(f"{r['module']}: not run: {r['problem']}" + (f":\n{r['output']}" if "output" in r else ""))


def rows_of(records: list[dict], seed: int) -> list[dict]:
    """bench/run.py's rows: one score per module."""
    return [{"benchmark": "mutation score", "subject": r["module"], "value": r.get("score"), "peer": None,
             "peer_value": None, "ratio": None, "unit": "% killed",
             "note": r.get("problem") or f"{r['killed']} killed, {r['survived']} survived, {r['timeout']} timeouts "
                                          f"of {r['sampled']} sampled (seed {seed})"} for r in records]


def check(args) -> list[dict]:
    copy_root = Path(tempfile.mkdtemp(prefix="podrun-mutate-"))
    copy = copy_root / "tree"
    try:
        copy_tree(copy)
        env = {**os.environ, "PYTHONPATH": str(copy)}
        where = subprocess.run([sys.executable, "-c", "import podrun; print(podrun.__file__)"], cwd=copy_root,
                               env=env, capture_output=True, text=True).stdout.strip()
        if not where.startswith(str(copy)):
            raise RuntimeError(f"`python -c 'import podrun'` imports {where!r}, not the copy in {copy}")
        records = []
        for module in pick_modules(args.modules):
            print(f"[mutate] {module} ...", file=sys.stderr, flush=True)
            r = check_module(copy, module, args, env)
            print(f"[mutate] {module}: " + (r.get("problem") or f"{r['killed']} killed, {r['survived']} survived, "
                                            f"{r['timeout']} timeouts, {r['s_per_mutant']} s a mutant"),
                  file=sys.stderr, flush=True)
            records.append(r)
        return records
    finally:
        shutil.rmtree(copy_root, ignore_errors=True)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench mutate", description=__doc__.split("\n")[0])
    ap.add_argument("--modules", type=lambda s: [m for m in s.split(",") if m],
                    help=f"comma-separated (default all): {', '.join(short(m) for m in GUARDS)}")
    ap.add_argument("--per-module", type=int, default=20, help="mutants sampled per module (default 20)")
    ap.add_argument("--seed", type=int, help="the sample's seed (default: a new one, printed)")
    ap.add_argument("--timeout", type=float, help="seconds per mutant (default: 5 x the unmutated run, at least 30)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "out"), help="folder for mutate.json")
    ap.add_argument("--keep", action="store_true", help="also write bench/results/mutate-YYYYMMDD-HHMM.json")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        pick_modules(args.modules)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.seed is None:
        args.seed = random.randrange(1_000_000)
    command = f"python -m bench mutate --per-module {args.per_module} --seed {args.seed}" + \
        (f" --modules {','.join(args.modules)}" if args.modules else "")
    print(f"[mutate] seed {args.seed}: the same sample again with `{command}`", file=sys.stderr)
    if importlib.util.find_spec("cosmic_ray") is None:
        print("python -m bench mutate needs cosmic-ray: pip install -e '.[mutate]'", file=sys.stderr)
        return 2
    records = check(args)
    print_table(records)
    ran = [r for r in records if "problem" not in r]
    killed = sum(r["killed"] + r["timeout"] for r in ran)
    total = killed + sum(r["survived"] for r in ran)
    score = round(100 * killed / total, 1) if total > 0 else None
    print(f"score: {killed} of {total} mutants killed ({score} %)")
    record = {"benchmark": "mutate", "command": command, "seed": args.seed, "per_module": args.per_module,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": f"{platform.node()} {platform.machine()} {platform.python_version()}",
              "killed": killed, "total": total, "score": score, "modules": records,
              "rows": rows_of(records, args.seed)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "mutate.json").write_text(json.dumps(record, indent=2))
    if args.keep:
        kept = RESULTS / f"mutate-{time.strftime('%Y%m%d-%H%M', time.gmtime())}.json"
        kept.write_text(json.dumps(record, indent=1) + "\n")
        print(f"kept: {kept.relative_to(ROOT)}")
    return 1 if len(ran) < len(records) else 0


def run(quick: bool) -> list[dict]:
    """`python -m bench [--quick] mutate` without its own options: every module, 3 (quick) or 20 mutants each."""
    args = parser().parse_args(["--per-module", "3" if quick else "20"])
    args.seed = random.randrange(1_000_000)
    return rows_of(check(args), args.seed)
