"""Issue 17's first hour at the door of `podrun launch`: a long run is announced (and asked about on a terminal),
a python without the recipe's packages is refused before anything starts, --help is in sections and
`podrun hosts` shows only the options it uses."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import click

from podrun.cli.main import cli, main
from tests.harness.podrun_proc import PODRUN
from tests.launch.helpers import run_on_terminal

ROOT = Path(__file__).resolve().parents[2]


def _launch(capsys, tmp_path, *argv):
    rc = main(["launch", "--runs-dir", str(tmp_path / "runs"), *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_a_long_run_is_announced_with_how_to_make_it_short(capsys, tmp_path):
    rc, out, err = _launch(capsys, tmp_path, "--dry-run", str(ROOT / "recipes" / "resnet50"))
    assert rc == 0, err
    (line,) = [l for l in out.splitlines() if "the planner estimates" in l]
    assert "2,001.83 h for 90 epochs of resnet50 on cluster local" in line
    assert "synthetic data (no --data given)" in line and "--steps N or --epochs E" in line and "--global-batch" in line
    for short in (["--global-batch", "32", str(ROOT / "recipes" / "resnet50"), "--steps", "20"],
                  [str(ROOT / "recipes" / "resnet18_cifar10"), "--data", "digits"]):
        rc, out, err = _launch(capsys, tmp_path, "--dry-run", *short)
        assert rc == 0 and "the planner estimates" not in out, out


def _pty_run(argv, answer: bytes, cwd, timeout=120.0) -> tuple[int, str]:
    """Run argv on a terminal and answer podrun's question; (exit code, what it showed)."""
    return run_on_terminal(argv, cwd=cwd, timeout=timeout, answer=(b"start it anyway?", answer))


def test_a_long_run_on_a_terminal_asks_and_no_means_not_started(tmp_path):
    rc, shown = _pty_run([*PODRUN, "launch", "--runs-dir", str(tmp_path / "runs"),
                          str(ROOT / "recipes" / "resnet50")], b"n\n", cwd=tmp_path)
    assert "the planner estimates 2,001.83 h" in shown and "start it anyway?" in shown, shown
    assert rc == 1 and "not started" in shown, shown
    assert not (tmp_path / "runs").exists()


def test_a_python_without_torch_is_refused_before_anything_starts(tmp_path, capsys):
    """A real fresh interpreter (a venv without system site-packages) that finds podrun but not torch."""
    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (site,) = venv.glob("lib/python3*/site-packages")
    (site / "podrun-checkout.pth").write_text(str(ROOT) + "\n")
    python = str(venv / "bin" / "python")
    assert subprocess.run([python, "-c", "import podrun"], timeout=60).returncode == 0
    rc, out, err = _launch(capsys, tmp_path, "--python", python, str(ROOT / "recipes" / "resnet18_cifar10"),
                           "--data", "digits")
    assert rc == 2, err
    assert err.startswith("podrun: error: preflight failed, nothing was started:\n  - localhost: "), err
    assert python in err and "torch" in err, err
    assert "pip install 'podrun[train]'" in err and "Traceback" not in err and len(err.splitlines()) == 3, err
    assert not (tmp_path / "runs").exists()


def test_launch_help_opens_with_torchrun_and_keeps_its_options_together():
    """--help for a torchrun user: the usage line and the description open with a script, torchrun's section comes
    first and holds all of torchrun's options (--master-addr/--master-port and --max-restarts too), and
    --nproc-per-node says what leaving it out means."""
    ctx = click.Context(cli.get_command(click.Context(cli), "launch"), info_name="launch")
    text = ctx.get_help()
    usage, description = text.splitlines()[0], text.split("\n\n")[1]
    assert usage.startswith("Usage: launch [OPTIONS] SCRIPT.py"), usage
    assert description.lstrip().startswith("Launch SCRIPT.py as torchrun would"), description
    heads = [text.index(h) for h in ("torchrun's options", "The plan: cluster, hosts, batch:",
                                     "Restarts and elastic runs", "When a run hangs", "Transports:", "Engines (poprun",
                                     "Output and the run")]
    assert heads == sorted(heads), heads
    torchrun, plan = text[heads[0]:heads[1]], text[heads[1]:heads[2]]
    for opt in ("--nproc-per-node", "--nnodes", "--rdzv-backend", "--rdzv-conf", "--master-addr", "--master-port",
                "--max-restarts", "--max_restarts", "-m, --module", "--no-python", "--run-path", "--local-ranks-filter",
                "--signals-to-handle", "--shutdown-timeout", "--numa-binding"):
        assert opt in torchrun, opt
    rest = text[heads[1]:]
    assert not re.search(r"^ +(--master-addr|--master-port|--max-restarts|-m, --module|--no-python)", rest, re.M)
    assert "Left out: 1 for a script, module or command, as torchrun's" in " ".join(torchrun.split())
    for opt in ("--cluster", "--hosts", "--global-batch", "--env"):
        assert opt in plan, opt
    assert "--elastic" in text[heads[2]:heads[3]] and "--straggler-timeout" in text[heads[3]:heads[4]]
    assert "--ssh-config" in text[heads[4]:heads[5]] and "--vipu-partition" in text[heads[5]:heads[6]]
    assert "--dry-run" in text[heads[6]:]


def test_hosts_help_shows_no_batch_options():
    for name, has_batch in (("hosts", False), ("plan", True), ("launch", True)):
        opts = {o for p in cli.get_command(click.Context(cli), name).params for o in p.opts}
        assert ({"--global-batch", "--local-batch", "--grad-accum"} <= opts) == has_batch, name
        assert "--hosts" in opts and "--nodes" in opts
