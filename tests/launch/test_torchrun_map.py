"""torchrun's command line and its mapping (podrun.launch.torchrun_cli, torchrun_map), pure: targets, torchrun's options onto podrun's, refusals;
and `podrun launch` refusing bad input with one paragraph and exit 2 before anything starts."""
from __future__ import annotations

import json
import os
import sys

import pytest

from podrun.cli.main import main
from podrun.errors import LaunchError
from podrun.launch.torchrun_cli import (COMMAND, MODULE, RECIPE, SCRIPT, Target, TorchrunOptions, classify,
                                        command_hint, recipe_args)
from podrun.launch.instance_logs import RankFiles
from podrun.launch.torchrun_map import OwnOptions, check_nproc_kind, parse_endpoint, reconcile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _classify(args, *, dashdash=False, recipes=(), files=(), **kw):
    return classify(args, dashdash=dashdash, is_recipe_dir=lambda p: p in recipes, is_file=lambda p: p in files, **kw)


@pytest.mark.parametrize("args,dashdash,kw,expect", [
    (["train.py", "--epochs", "3"], False, {}, Target(SCRIPT, "train.py", ("--epochs", "3"))),
    (["train.py", "--epochs", "3"], True, {}, Target(SCRIPT, "train.py", ("--epochs", "3"))),
    (["run"], False, {"files": ("run",)}, Target(SCRIPT, "run")),                     # an existing file: python
    (["./run.sh", "x"], True, {"files": ("./run.sh",)}, Target(COMMAND, "./run.sh", ("x",))),
    (["python", "t.py"], True, {}, Target(COMMAND, "python", ("t.py",))),
    (["pkg.train", "--x"], False, {"module": True}, Target(MODULE, "pkg.train", ("--x",))),
    (["pkg.train"], True, {"module": True}, Target(MODULE, "pkg.train")),
    (["train.py"], False, {"no_python": True}, Target(COMMAND, "train.py")),
    (["recipes/r", "--data", "digits", "--", "--steps", "30"], False, {"recipes": ("recipes/r",)},
     Target(RECIPE, "recipes/r", ("--data", "digits", "--steps", "30"))),
    (["recipes/r", "--", "--steps", "3"], False, {"recipes": ("recipes/r",)}, Target(RECIPE, "recipes/r", ("--steps", "3"))),
    (["recipes/resnet5"], False, {}, Target(RECIPE, "recipes/resnet5")),             # a miss: the loader explains
])
def test_classify_reads_the_target_as_torchrun_does(args, dashdash, kw, expect):
    assert _classify(args, dashdash=dashdash, **kw) == expect


def test_worker_commands():
    py = "/venv/bin/python"
    assert Target(SCRIPT, "t.py", ("-a",)).worker_command(py) == [py, "t.py", "-a"]
    assert Target(MODULE, "m", ("-a",)).worker_command(py) == [py, "-m", "m", "-a"]
    assert Target(COMMAND, "./x", ("-a",)).worker_command(py) == ["./x", "-a"]
    assert Target(RECIPE, "r", ("-a",)).worker_command(py, "/abs/r/train.py") == [py, "/abs/r/train.py", "-a"]
    # a module of podrun's own (calibrate's worker) is a helper: started without the working directory on its path
    from podrun import pystart

    helper = Target(MODULE, "podrun.calibrate.worker", ("-a",)).worker_command(py)
    assert helper == pystart.safe(py, "-a", module="podrun.calibrate.worker", root=None) and pystart.is_helper(helper)


def test_recipe_args_takes_out_one_dashdash_wherever_it_stands():
    assert recipe_args(("--data", "digits", "--", "--steps", "30")) == ("--data", "digits", "--steps", "30")
    assert recipe_args(("--", "--data", "x")) == ("--data", "x")
    assert recipe_args(("--data", "x")) == ("--data", "x")


def test_nothing_and_contradictions_are_refused():
    with pytest.raises(LaunchError, match="nothing to launch"):
        _classify([])
    with pytest.raises(LaunchError, match="contradict"):
        _classify(["m"], module=True, no_python=True)


def test_command_hint_names_the_file_in_the_working_directory(tmp_path):
    (tmp_path / "run.sh").write_text("echo hi\n")
    (tmp_path / "train.py").write_text("")
    files = {str(tmp_path / "run.sh"), str(tmp_path / "train.py")}
    err = command_hint("run.sh", str(tmp_path), on_path=lambda p: False, is_file=lambda p: p in files)
    assert err is not None and str(tmp_path / "run.sh") in err.message and "-- ./run.sh" in err.hint
    err = command_hint("train.py", str(tmp_path), on_path=lambda p: False, is_file=lambda p: p in files)
    assert "podrun launch train.py" in err.hint
    assert "no such command" in command_hint("nope", str(tmp_path), on_path=lambda p: False,
                                             is_file=lambda p: False).message
    assert command_hint("sh", str(tmp_path), on_path=lambda p: True, is_file=lambda p: False) is None
    assert command_hint("./run.sh", str(tmp_path), on_path=lambda p: False, is_file=lambda p: False) is None


# --- the table in docs/launch.md, row by row ----------------------------------------------------

@pytest.mark.parametrize("tr,expect", [
    (TorchrunOptions(nproc_per_node="2"), OwnOptions(devices_per_host=2)),
    (TorchrunOptions(nproc_per_node="auto"), OwnOptions()),
    (TorchrunOptions(nproc_per_node="cpu"), OwnOptions(devices_per_host=7)),
    (TorchrunOptions(nproc_per_node="gpu"), OwnOptions()),
    (TorchrunOptions(nnodes="3"), OwnOptions(nodes=3)),
    (TorchrunOptions(nnodes="2:4"), OwnOptions(nodes=4, elastic_min=2)),
    (TorchrunOptions(nnodes="2:2"), OwnOptions(nodes=2)),
    (TorchrunOptions(standalone=True), OwnOptions(nodes=1, master_port=0)),
    (TorchrunOptions(rdzv_endpoint="node1:1234"), OwnOptions(master_addr="node1", master_port=1234)),
    (TorchrunOptions(rdzv_endpoint="node1"), OwnOptions(master_addr="node1", master_port=29400)),
    (TorchrunOptions(rdzv_endpoint="[fd00::1]:7"), OwnOptions(master_addr="fd00::1", master_port=7)),
    (TorchrunOptions(rdzv_id="job7"), OwnOptions(rdzv_id="job7")),           # not the run directory's name
    (TorchrunOptions(log_dir="/tmp/logs"), OwnOptions(runs_dir="/tmp/logs")),
    (TorchrunOptions(tee="3"), OwnOptions(rank_files=RankFiles(tee="3"))),
    (TorchrunOptions(tee="0:3,1:1"), OwnOptions(rank_files=RankFiles(tee="0:3,1:1"))),
    (TorchrunOptions(redirects="3", tee="0:1"), OwnOptions(rank_files=RankFiles(tee="0:1", redirects="3"))),
    (TorchrunOptions(rdzv_endpoint="localhost:0"), OwnOptions(master_addr="localhost", master_port=0)),  # stacked
    (TorchrunOptions(local_addr="10.0.0.1", event_log_handler="console", virtual_local_rank=True), OwnOptions()),
    (TorchrunOptions(signals_to_handle="SIGTERM,SIGUSR1"), OwnOptions()),      # Slurm's preemption signal
    (TorchrunOptions(rdzv_backend="c10d", rdzv_endpoint="h:5"), OwnOptions(master_addr="h", master_port=5)),
    (TorchrunOptions(rdzv_backend="static"), OwnOptions()),
    (TorchrunOptions(rdzv_conf="keep_alive_interval=2,keep_alive_max_attempt=5"),
     OwnOptions(heartbeat=2.0, heartbeat_misses=5)),
    (TorchrunOptions(rdzv_conf="join_timeout=900,last_call_timeout=1,close_timeout=5,read_timeout=60,"
                               "heartbeat_timeout=5,timeout=30,store_type=tcp"), OwnOptions()),
    (TorchrunOptions(monitor_interval="0.5"), OwnOptions()),
    (TorchrunOptions(start_method="fork"), OwnOptions()),
    (TorchrunOptions(event_log_handler="null"), OwnOptions()),
    (TorchrunOptions(role="trainer"), OwnOptions(role="trainer")),
    (TorchrunOptions(run_path=True), OwnOptions()),
    (TorchrunOptions(local_ranks_filter="0,2"), OwnOptions(local_ranks=frozenset({0, 2}))),
    (TorchrunOptions(duplicate_stdout_filters=""), OwnOptions()),
    (TorchrunOptions(signals_to_handle="SIGTERM,SIGINT"), OwnOptions()),
    (TorchrunOptions(shutdown_timeout="30"), OwnOptions(grace=30.0)),
    *((TorchrunOptions(numa_binding=mode), OwnOptions(cpu_bind="auto"))
      for mode in ("node", "socket", "exclusive", "core-complex")),
    (TorchrunOptions(standalone=True, rdzv_id="x"), OwnOptions(nodes=1, master_port=0)),   # torchrun's own id
])
def test_each_torchrun_option_maps_to_podruns(tr, expect):
    assert reconcile(tr, OwnOptions(), cpu_count=7) == expect


def test_podruns_own_options_pass_through_and_must_agree():
    own = OwnOptions(devices_per_host=2, nodes=1, max_restarts=3, master_port=5, cpu_bind="none")
    assert reconcile(TorchrunOptions(nproc_per_node="2", nnodes="1"), own, cpu_count=4) == own
    for tr, words in ((TorchrunOptions(nproc_per_node="4"), "--devices-per-host 2"),
                      (TorchrunOptions(nnodes="2"), "--nodes 1"),
                      (TorchrunOptions(rdzv_endpoint="h:6"), "--master-port 5"),
                      (TorchrunOptions(numa_binding="node"), "--cpu-bind none")):
        with pytest.raises(LaunchError, match=words):
            reconcile(tr, own, cpu_count=4)


# options podrun refuses, each with the words of its refusal that say why
REFUSED = [
    ({"node_rank": "1"}, "podrun places the instances itself"),
    ({"redirects": "4"}, "not a stream choice"), ({"tee": "7"}, "not a stream choice"),
    ({"nproc_per_node": "many"}, "not a number of workers"), ({"nproc_per_node": "0"}, "at least one worker"),
    ({"nnodes": "1:2:3"}, "neither N nor MIN:MAX"), ({"nnodes": "3:2"}, "MIN <= MAX"),
    ({"standalone": True, "nnodes": "2"}, "--standalone runs one node"),
    ({"standalone": True, "rdzv_endpoint": "h:1"}, "drop --rdzv-endpoint"),
    ({"rdzv_endpoint": "h:port"}, "not a TCP port"), ({"rdzv_endpoint": ":5"}, "names no host"),
    ({"rdzv_conf": "keep_alive_interval=x"}, "not a number above 0"), ({"rdzv_conf": "join_timeout"}, "not KEY=VALUE"),
    ({"monitor_interval": "soon"}, "not a number of seconds"),
    ({"start_method": "thread"}, "start methods are spawn, fork, forkserver"),
    ({"local_ranks_filter": "0,a"}, "not a list of local ranks"),
    ({"signals_to_handle": "SIGFOO"}, "'SIGFOO' is not a signal"), ({"shutdown_timeout": "1.5"}, "whole number"),
    ({"numa_binding": "numa"}, "modes are node, socket, exclusive, core-complex"),
]


@pytest.mark.parametrize("tr,words", [(TorchrunOptions(**given), words) for given, words in REFUSED])
def test_options_podrun_has_no_meaning_for_are_refused_saying_why(tr, words):
    with pytest.raises(LaunchError, match=words):
        reconcile(tr, OwnOptions(), cpu_count=4)


# torchrun's options podrun has no meaning for: each as the user gave it, and the options that give it
UNSUPPORTED = [
    ("--node-rank 1", {"node_rank": "1"}),
    ("--rdzv-backend etcd-v2", {"rdzv_backend": "etcd-v2"}), ("--rdzv-conf is_host=1", {"rdzv_conf": "is_host=1"}),
    ("--rdzv-conf rank=0", {"rdzv_conf": "rank=0"}), ("--rdzv-conf store_type=file", {"rdzv_conf": "store_type=file"}),
    ("--rdzv-conf jion_timeout=5", {"rdzv_conf": "jion_timeout=5"}),
    ("--duplicate-stdout-filters apple", {"duplicate_stdout_filters": "apple"}),
    ("--duplicate-stderr-filters apple", {"duplicate_stderr_filters": "apple"}),
    ("--logs-specs mine", {"logs_specs": "mine"}),
    ("--signals-to-handle SIGTERM,SIGUSR2", {"signals_to_handle": "SIGTERM,SIGUSR2"}),
    ("PET_NODE_RANK=0", {"node_rank": "0", "spelled": {"node_rank": "PET_NODE_RANK"}}),
]


@pytest.mark.parametrize("tr,option", [(TorchrunOptions(**given), option) for option, given in UNSUPPORTED])
def test_unsupported_options_get_the_one_line(tr, option):
    """torchrun's option podrun has no meaning for: "torchrun's --X is not supported by podrun: WHY, use WHAT",
    naming the option as the user gave it (spelling, or its PET_ variable)."""
    with pytest.raises(LaunchError) as err:
        reconcile(tr, OwnOptions(), cpu_count=4)
    assert err.value.message.startswith(f"torchrun's {option} is not supported by podrun: "), err.value.message
    assert ", use " in err.value.message and err.value.hint is None and err.value.exit_code == 2


def test_nproc_gpu_needs_gpus():
    check_nproc_kind(TorchrunOptions(nproc_per_node="gpu"), "gpu", "dgx-h100")
    check_nproc_kind(TorchrunOptions(nproc_per_node="auto"), "cpu", "local")
    with pytest.raises(LaunchError, match="cluster 'local' has cpu devices"):
        check_nproc_kind(TorchrunOptions(nproc_per_node="gpu"), "cpu", "local")


def test_parse_endpoint():
    assert parse_endpoint("10.0.0.1:29500") == ("10.0.0.1", 29500)
    assert parse_endpoint("[::1]") == ("::1", 29400)
    assert parse_endpoint("localhost:0") == ("localhost", 0)          # a free port, picked at the start


@pytest.mark.parametrize("tee,redirects,console,files", [
    ("3", None, {(0, "out"), (0, "err"), (1, "out"), (1, "err")}, {(0, "out"), (0, "err"), (1, "out"), (1, "err")}),
    (None, "1", {(0, "err"), (1, "err")}, {(0, "out"), (1, "out")}),
    ("0:2", "1:3", {(0, "out"), (0, "err")}, {(0, "err"), (1, "out"), (1, "err")}),
    ("0", "0", {(0, "out"), (0, "err"), (1, "out"), (1, "err")}, set()),
])
def test_tee_and_redirects_choose_each_ranks_files_and_console_as_torchrun(tee, redirects, console, files):
    """torchrun's Std: 1 stdout, 2 stderr, 3 both, per local rank with LR:N; --tee: files and console, --redirects:
    files only."""
    rf = RankFiles(tee=tee, redirects=redirects)
    every = {(lr, s) for lr in (0, 1) for s in ("out", "err")}
    assert {k for k in every if rf.on_console(*k)} == console
    assert {k for k in every if rf.to_file(*k)} == files


# --- the command line: one paragraph and exit 2, before anything starts ------------------------

def _launch(capsys, monkeypatch, tmp_path, *argv):
    monkeypatch.chdir(tmp_path)
    rc = main(["launch", "--runs-dir", str(tmp_path / "runs"), *argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("argv,words", [
    (["--nproc-per-node", "2", "--node-rank", "1", "t.py"], "podrun places the instances itself"),
    (["--nproc_per_node", "2", "--redirects", "5", "t.py"], "--redirects '5' is not a stream choice"),
    (["--max-restarts", "-1", "t.py"], "--max-restarts: -1 is outside 0..1000"),
    (["--max_restarts=-1", "t.py"], "--max_restarts: -1 is outside 0..1000"),
    (["--nproc-per-node", "gpu", "t.py"], "cluster 'local' has cpu devices"),
    (["--nnodes", "2", "--nodes", "3", "t.py"], "--nnodes 2 means --nodes 2"),
    (["missing.py"], "script missing.py does not exist in the working directory"),
    (["--", "t.sh"], "the file"),
])
def test_cli_refuses_with_one_paragraph(capsys, monkeypatch, tmp_path, argv, words):
    (tmp_path / "t.py").write_text("print('hi')\n")
    (tmp_path / "t.sh").write_text("echo hi\n")
    rc, out, err = _launch(capsys, monkeypatch, tmp_path, *argv)
    assert rc == (127 if argv[0] == "--" else 2), err      # a command not found: the shell's 127
    assert words in err and "Traceback" not in err and err.startswith("podrun: error:"), err
    assert not (tmp_path / "runs").exists()


def test_cli_script_and_module_dry_run(capsys, monkeypatch, tmp_path):
    """`podrun launch --cluster local train.py --epochs 3` (issue 17's first line): --python runs the script with
    its arguments, with or without --; `-m` runs a module; --nproc-per-node 2 gives 2 workers."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    for argv in (["--cluster", "local", "--nproc-per-node", "2", "train.py", "--epochs", "3"],
                 ["--nproc-per-node", "2", "--", "train.py", "--epochs", "3"]):
        rc, out, err = _launch(capsys, monkeypatch, tmp_path, "--dry-run", "--json", *argv)
        assert rc == 0, err
        rec = json.loads(out)
        assert rec["commands"][0]["command"].endswith(f"-- {sys.executable} train.py --epochs 3")
        assert [w["LOCAL_RANK"] for w in rec["instances"][0]["workers"]] == ["0", "1"]
        assert rec["instances"][0]["workers"][1]["WORLD_SIZE"] == "2"
    rc, out, err = _launch(capsys, monkeypatch, tmp_path, "--dry-run", "--json", "-m", "json.tool", "--x")
    assert rc == 0, err
    assert json.loads(out)["commands"][0]["command"].endswith(f"-- {sys.executable} -m json.tool --x")


def test_cli_recipe_arguments_are_parsed_before_anything_starts(capsys, monkeypatch, tmp_path):
    """Issue 17 item 13: `--` among a recipe's arguments is taken out; a typo is one message and exit 2."""
    recipe = os.path.join(ROOT, "recipes", "resnet18_cifar10")
    rc, out, err = _launch(capsys, monkeypatch, tmp_path, "--dry-run", "--json", recipe, "--data", "digits", "--",
                           "--steps", "30")
    assert rc == 0, err
    command = json.loads(out)["commands"][0]["command"]
    assert command.endswith("train.py --data digits --steps 30"), command
    rc, out, err = _launch(capsys, monkeypatch, tmp_path, recipe, "--data", "digits", "--", "--stepz", "30")
    assert rc == 2 and "resnet18_cifar10/train.py would refuse" in err and "--stepz" in err, err
    assert err.count("usage:") == 0 and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("typo,suggestion", [("recipes/resnet5", "recipes/resnet50"),
                                             ("recipes/resnet18_cifar1", "recipes/resnet18_cifar10"),
                                             ("resnet5", "resnet50")])
def test_cli_recipe_typos_get_did_you_mean_in_both_forms(capsys, monkeypatch, tmp_path, typo, suggestion):
    """Issue 17 item 8: the path form gets the name form's did-you-mean, and no hint to use --."""
    monkeypatch.chdir(ROOT)
    rc = main(["launch", "--runs-dir", str(tmp_path / "runs"), typo])
    err = capsys.readouterr().err
    assert rc == 2 and f"did you mean '{suggestion}'" in err and "podrun launch [OPTIONS] --" not in err, err


def test_cli_elastic_without_max_restarts_gets_one_per_host(capsys, monkeypatch, tmp_path):
    """Issue 17 item 3: --elastic MIN alone runs, with one restart per host it can lose, said in the dry run."""
    rc, out, err = _launch(capsys, monkeypatch, tmp_path, "--dry-run", "--hosts", "localhost,127.0.0.1,127.0.0.2",
                           "--devices-per-host", "1", "--elastic", "1", "--", "true")
    assert rc == 0, err
    assert "--max-restarts 2" in out and "2 restart(s), one per host the run can lose" in out, out
    rc, out, err = _launch(capsys, monkeypatch, tmp_path, "--dry-run", "--json", "--nnodes", "2:3", "--hosts",
                           "localhost,127.0.0.1,127.0.0.2", "--devices-per-host", "1", "--", "true")
    assert rc == 0, err
    rec = json.loads(out)
    assert rec["max_restarts"] == 1 and "--elastic 2 without --max-restarts" in rec["notes"][0]
    rc, out, err = _launch(capsys, monkeypatch, tmp_path, "--dry-run", "--hosts", "localhost,127.0.0.1",
                           "--devices-per-host", "1", "--elastic", "2", "--", "true")
    assert rc == 2 and "can lose no host" in err, err
    rc, out, err = _launch(capsys, monkeypatch, tmp_path, "--dry-run", "--hosts", "localhost,127.0.0.1",
                           "--devices-per-host", "1", "--elastic", "1", "--max-restarts", "5", "--", "true")
    assert rc == 0 and "--max-restarts 5" in out and "one per host" not in out, out


def test_cli_this_machine_among_other_hosts_is_reached_over_ssh_and_said(capsys, monkeypatch, tmp_path):
    """Issue 17 item 10, decided: with other hosts, this machine's instance goes over ssh too; the run says so."""
    rc, out, err = _launch(capsys, monkeypatch, tmp_path, "--dry-run", "--hosts", "localhost,h2", "--devices-per-host",
                           "1", "--", "true")
    assert rc == 0, err
    assert " via ssh," in out and "# localhost is this machine: in a run with other hosts podrun reaches it over ssh" in out
    rc, out, err = _launch(capsys, monkeypatch, tmp_path, "--dry-run", "--hosts", "localhost", "--devices-per-host",
                           "1", "--", "true")
    assert rc == 0 and " via local," in out and "is this machine" not in out, out


# --- every option of torchrun's own parser, one by one -------------------------------------------

# a value torchrun takes for each of its options (by its dest); a new torchrun option fails the test until added
SAMPLES = {"nnodes": "1", "nproc_per_node": "2", "rdzv_backend": "c10d", "rdzv_endpoint": "127.0.0.1:29400",
           "rdzv_id": "456", "rdzv_conf": "join_timeout=900", "max_restarts": "1", "monitor_interval": "0.5",
           "start_method": "spawn", "event_log_handler": "null", "role": "trainer", "log_dir": "logs",
           "redirects": "0", "tee": "3", "local_ranks_filter": "0", "duplicate_stdout_filters": "apple",
           "duplicate_stderr_filters": "apple", "node_rank": "1", "master_addr": "127.0.0.1", "master_port": "29555",
           "local_addr": "127.0.0.1", "logs_specs": "mine", "numa_binding": "node",
           "signals_to_handle": "SIGTERM,SIGINT,SIGHUP", "shutdown_timeout": "10"}
FLAGS = ("standalone", "module", "no_python", "run_path", "virtual_local_rank")


def _torchrun_options():
    """(option string, dest, takes a value) for every option of the installed torchrun's parser, every spelling."""
    try:
        from torch.distributed.run import get_args_parser
    except ImportError as exc:
        pytest.fail(f"torchrun's parser is compared option by option and needs torch: {exc}", pytrace=False)

    out = []
    for action in get_args_parser()._actions:
        if action.dest in ("help", "training_script", "training_script_args"):
            continue
        for opt in action.option_strings:
            out.append((opt, action.dest, action.nargs != 0))
    return out


@pytest.mark.torch
def test_every_torchrun_option_is_taken_with_its_meaning_or_refused_in_one_line(capsys, monkeypatch, tmp_path):
    """`podrun launch --dry-run OPTION [VALUE] -m json.tool --x` for each option (each spelling) of the installed
    torchrun: a dry run whose target is the module json.tool (nothing after an option is ever read as the target),
    or exit 2 with "torchrun's OPTION ... is not supported by podrun: ..., use ...", naming it as typed."""
    options = _torchrun_options()
    (tmp_path / "x.py").write_text("print('hi')\n")
    assert {dest for _, dest, _ in options} == set(SAMPLES) | set(FLAGS)
    refused = set()
    for opt, dest, takes in options:
        argv = [opt, SAMPLES[dest]] if takes else [opt]
        target = {"module": ["json", "--x"], "no_python": ["true", "--x"], "run_path": ["x.py", "--x"]}.get(
            dest, ["-m", "json.tool", "--x"])
        monkeypatch.chdir(tmp_path)
        rc = main(["launch", "--dry-run", "--json", *argv, *target])
        out, err = capsys.readouterr()
        if rc == 2:
            assert err.startswith(f"podrun: error: torchrun's {' '.join(argv)} is not supported by podrun: "), err
            assert ", use " in err and len(err.strip().splitlines()) == 1, err
            refused.add(dest)
            continue
        assert rc == 0, (opt, err)
        command = json.loads(out)["commands"][0]["command"]
        expect = {"no_python": "-- true --x", "run_path": f"-- {sys.executable} x.py --x",
                  "module": f"-- {sys.executable} -m json --x"}.get(dest, f"-- {sys.executable} -m json.tool --x")
        assert command.endswith(expect), (opt, command)
    assert refused == {"duplicate_stdout_filters", "duplicate_stderr_filters", "node_rank", "logs_specs"}


@pytest.mark.parametrize("argv,command", [
    (["--monitor-interval", "5", "-m", "pkg"], "-m pkg"), (["-m", "--monitor_interval", "5", "pkg"], "-m pkg"),
    (["--no-python", "--rdzv-conf", "join_timeout=1", "true"], "-- true"), (["--foo", "-m", "pkg"], None),
    (["-m", "--foo", "pkg"], None), (["--no-python", "--foo", "true"], None), (["--rdzv_backend=etcd", "t.py"], None),
    (["--bogus=1", "t.py"], None)])
def test_no_option_is_read_as_a_recipe_module_or_command(capsys, monkeypatch, tmp_path, argv, command):
    """An option podrun does not know is "no such option" (a torchrun one it does not take, its one line): never
    "unknown recipe", a module of that name, or a command."""
    rc, out, err = _launch(capsys, monkeypatch, tmp_path, "--dry-run", "--json", *argv)
    if command is not None:
        assert rc == 0, err
        assert json.loads(out)["commands"][0]["command"].endswith(command)
        return
    assert rc == 2 and ("no such option" in err or "is not supported by podrun" in err), err
    assert "recipe" not in err and "Traceback" not in err, err


def test_unknown_option_gets_a_did_you_mean(capsys, monkeypatch, tmp_path):
    rc, out, err = _launch(capsys, monkeypatch, tmp_path, "--nproc-per-nodes", "2", "t.py")
    assert rc == 2 and "no such option: --nproc-per-nodes" in err and "did you mean --nproc-per-node?" in err, err


def _workers(rec, key):
    return [w.get(key) for i in rec["instances"] for w in i["workers"]]


@pytest.mark.parametrize("argv,check", [
    (["--nproc_per_nod=2"], lambda r: _workers(r, "LOCAL_RANK") == ["0", "1"]),      # argparse's prefix forms
    (["--nproc-per", "2", "--max-rest", "1"], lambda r: len(_workers(r, "RANK")) == 2 and r["max_restarts"] == 1),
    ([], lambda r: _workers(r, "WORLD_SIZE") == ["1"]),                  # a script: one worker, torchrun's default
    (["--nnodes=1:2"], lambda r: len(r["instances"]) == 1 and any("starting on the 1 host" in n for n in r["notes"])),
    (["--rdzv-endpoint=localhost:0"], lambda r: (r["master_addr"], r["master_port"]) == ("localhost", 0)),
    (["--virtual-local-rank", "--nproc-per-node", "2"],
     lambda r: _workers(r, "LOCAL_RANK") == ["0", "0"] and _workers(r, "CUDA_VISIBLE_DEVICES") == ["0", "1"]),
    ([], lambda r: "--grace 5 --interrupt-grace 30 " in r["commands"][0]["command"]),   # torchrun's 30 s after SIGINT
    (["--grace", "2"], lambda r: "--grace 2 --interrupt-grace 2 " in r["commands"][0]["command"]),
    (["--shutdown-timeout", "7"], lambda r: "--grace 7 --interrupt-grace 7 " in r["commands"][0]["command"]),
])
def test_torchrun_command_lines_that_run_as_under_torchrun(capsys, monkeypatch, tmp_path, argv, check):
    rc, rec, err = _dry(capsys, monkeypatch, tmp_path, *argv)
    assert rc == 0 and check(rec), (err, rec)


# --- PET_ variables: flag > PET_ > default ------------------------------------------------------

def _dry(capsys, monkeypatch, tmp_path, *argv, **pet):
    for k in [k for k in os.environ if k.startswith("PET_")]:
        monkeypatch.delenv(k)
    for k, v in pet.items():
        monkeypatch.setenv(k, v)
    (tmp_path / "x.py").write_text("print('hi')\n")
    rc, out, err = _launch(capsys, monkeypatch, tmp_path, "--dry-run", "--json", *argv, "x.py")
    return rc, (json.loads(out) if rc == 0 else None), err


def test_pet_variables_are_torchruns_options_below_the_flags(capsys, monkeypatch, tmp_path):
    rc, rec, err = _dry(capsys, monkeypatch, tmp_path, "--standalone", PET_NPROC_PER_NODE="1")
    assert rc == 0 and len(rec["instances"][0]["workers"]) == 1, err
    rc, rec, err = _dry(capsys, monkeypatch, tmp_path, "--nproc_per_node", "2", PET_NPROC_PER_NODE="3")
    assert len(rec["instances"][0]["workers"]) == 2                   # the flag wins
    rc, rec, err = _dry(capsys, monkeypatch, tmp_path, "--devices-per-host", "2", PET_NPROC_PER_NODE="3")
    assert len(rec["instances"][0]["workers"]) == 2                   # podrun's own flag wins too
    rc, rec, err = _dry(capsys, monkeypatch, tmp_path, PET_NPROC_PER_NODE="2", PET_STANDALONE="1", PET_ROLE="tr",
                        PET_MAX_RESTARTS="2", PET_RDZV_ID="job", PET_MASTER_PORT="29555")
    worker = rec["instances"][0]["workers"][1]
    assert (worker["WORLD_SIZE"], worker["ROLE_NAME"], rec["max_restarts"]) == ("2", "tr", 2)
    assert rec["master_port"] == 0                                    # --standalone (from PET_) picks the port
    rc, rec, err = _dry(capsys, monkeypatch, tmp_path, PET_RDZV_ID="job", PET_MASTER_PORT="29555")
    assert rec["instances"][0]["workers"][0]["TORCHELASTIC_RUN_ID"] == "job" and rec["master_port"] == 29555
    assert rec["run_id"].startswith("job-")


@pytest.mark.parametrize("pet,words", [
    ({"PET_STANDALONE": "yes"}, "PET_STANDALONE='yes' is not 0 or 1"),
    ({"PET_MASTER_PORT": "x"}, "PET_MASTER_PORT='x' is not a TCP port"),
    ({"PET_NPROC_PER_NODE": "0"}, "PET_NPROC_PER_NODE=0: a node runs at least one worker"),
    ({"PET_NNODES": "2:3"}, "PET_NNODES=2:3 asks for more hosts than cluster 'local' has (1)\n"
                            "  hint: use PET_NNODES=1 or fewer"),
    ({"PET_NODE_RANK": "0"}, "torchrun's PET_NODE_RANK=0 is not supported by podrun"),
])
def test_pet_variables_are_named_in_errors(capsys, monkeypatch, tmp_path, pet, words):
    rc, rec, err = _dry(capsys, monkeypatch, tmp_path, **pet)
    assert rc == 2 and words in err, err


# --- the rendezvous id is not the run directory's name ------------------------------------------

def test_rdzv_id_names_the_workers_rendezvous_not_the_run_directory(capsys, monkeypatch, tmp_path):
    """--rdzv-id 456: every worker's TORCHELASTIC_RUN_ID is 456, the run directory is 456-TIMESTAMP, and a
    second launch with the same id gets a directory of its own; --run-id names the directory and leaves the
    rendezvous id to --rdzv-id."""
    rc, rec, err = _dry(capsys, monkeypatch, tmp_path, "--rdzv-id", "456", "--role", "trainer")
    assert rc == 0, err
    assert rec["run_id"].startswith("456-") and rec["run_dir"].endswith("/" + rec["run_id"])
    assert {w["TORCHELASTIC_RUN_ID"] for w in rec["instances"][0]["workers"]} == {"456"}
    assert {w["ROLE_NAME"] for w in rec["instances"][0]["workers"]} == {"trainer"}
    assert {w["PODRUN_RUN_ID"] for w in rec["instances"][0]["workers"]} == {rec["run_id"]}
    rc, rec, err = _dry(capsys, monkeypatch, tmp_path, "--rdzv-id", "a/b", "--run-id", "mine")
    assert rec["run_id"] == "mine" and rec["instances"][0]["workers"][0]["TORCHELASTIC_RUN_ID"] == "a/b"
    rc, rec, err = _dry(capsys, monkeypatch, tmp_path, "--rdzv-id", "../x")
    assert rc == 0 and "/" not in rec["run_id"] and rec["run_id"].startswith("rdzv.._x-"), rec["run_id"]


# --- errors in the user's words ------------------------------------------------------------------

@pytest.mark.parametrize("argv,said,not_said", [
    (["--nnodes", "2:3"], "--nnodes 2:3 asks for more hosts than cluster 'local' has (1)", "--nodes 3"),
    (["--nnodes", "2"], "hint: use --nnodes 1 or fewer", "--nodes"),
    (["--standalone", "--master_port", "1234"], "--standalone picks a free rendezvous port on this machine, and "
     "--master_port 1234 names one", "podrun's"),
    (["--nproc_per_node", "0"], "--nproc_per_node 0: a node runs at least one worker", "--nproc-per-node"),
    (["--nproc_per_node", "3", "--devices-per-host", "2"], "--nproc_per_node 3 means --devices-per-host 3",
     "--nproc-per-node"),
    (["--rdzv_endpoint", "h:port"], "--rdzv_endpoint 'h:port'", "--rdzv-endpoint"),
    (["--standalone", "--hosts", "localhost", "--transport", "ssh"], "--standalone (podrun picks a free port)",
     "--master-port 0"),
])
def test_errors_name_the_options_as_the_user_wrote_them(capsys, monkeypatch, tmp_path, argv, said, not_said):
    rc, rec, err = _dry(capsys, monkeypatch, tmp_path, *argv)
    assert rc == 2 and said in err and not_said not in err, err
