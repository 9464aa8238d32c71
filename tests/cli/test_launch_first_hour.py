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


def test_a_recipe_without_data_says_so_and_a_long_one_is_refused_until_synthetic_is_said(capsys, tmp_path):
    """No --data: a notice with how to pass real data; over an hour, exit 2 before anything starts (--dry-run:
    the refusal as a note); --data synthetic lifts it; a short run is only told; a recipe defaulting to digits
    gets no notice."""
    resnet50 = str(ROOT / "recipes" / "resnet50")
    rc, out, err = _launch(capsys, tmp_path, resnet50)
    assert rc == 2 and err.startswith("podrun: error: no --data given: resnet50 would train on synthetic data "
                                      "for 2001 h 50 min"), err
    assert "--data synthetic to train on synthetic data anyway" in err and "Traceback" not in err, err
    assert not (tmp_path / "runs").exists()
    rc, out, err = _launch(capsys, tmp_path, "--dry-run", resnet50)
    assert rc == 0 and "# a real launch refuses this: no --data given" in out, out
    assert "# no --data given: resnet50 trains on synthetic data" in out and "--data DIR after the recipe" in out
    rc, out, err = _launch(capsys, tmp_path, "--dry-run", resnet50, "--data", "synthetic")
    assert rc == 0 and "no --data given" not in out and "the planner estimates" in out, out
    rc, out, err = _launch(capsys, tmp_path, "--dry-run", "--global-batch", "32", resnet50, "--steps", "2")
    assert rc == 0 and "# no --data given" in out and "refuses" not in out, out
    rc, out, err = _launch(capsys, tmp_path, "--dry-run", str(ROOT / "recipes" / "resnet18_cifar10"))
    assert rc == 0 and "--data" not in "".join(l for l in out.splitlines() if l.startswith("#")), out


def _pty_run(argv, answer: bytes, cwd, timeout=120.0) -> tuple[int, str]:
    """Run argv on a terminal and answer podrun's question; (exit code, what it showed)."""
    return run_on_terminal(argv, cwd=cwd, timeout=timeout, answer=(b"start it anyway?", answer))


def test_a_long_run_on_a_terminal_asks_and_no_means_not_started(tmp_path):
    rc, shown = _pty_run([*PODRUN, "launch", "--runs-dir", str(tmp_path / "runs"),
                          str(ROOT / "recipes" / "resnet50"), "--data", "synthetic"], b"n\n", cwd=tmp_path)
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


def test_launch_help_is_short_podrun_first_and_help_all_has_every_option():
    """--help: the usage line and the description open with a script; the options most runs use, podrun's sections
    first, torchrun's names beside podrun's (--nnodes by --nodes), under 100 lines, pointing at --help-all;
    --help-all: every option, podrun's sections first and torchrun's together last (all their spellings)."""
    from click.testing import CliRunner

    short = CliRunner().invoke(cli, ["launch", "--help"], terminal_width=80).output
    usage, description = short.splitlines()[0], short.split("\n\n")[1]
    assert usage.startswith("Usage: cli launch [OPTIONS] SCRIPT.py"), usage
    assert description.lstrip().startswith("Launch SCRIPT.py as torchrun would"), description
    assert len(short.splitlines()) < 100 and "podrun launch --help-all" in " ".join(short.split()), short
    heads = [short.index(h) for h in ("The plan: cluster, hosts, batch:", "A script or command", "Restarts and",
                                      "When a run hangs", "Output and the run", "Help:")]
    assert heads == sorted(heads), heads
    for row in ("--nodes, --nnodes INTEGER", "--devices-per-host, --nproc-per-node", "--cluster", "-m, --module",
                "--max-restarts", "--dry-run", "--hang-timeout"):
        assert re.search(rf"^  {re.escape(row)}", short, re.M), row
    assert "--ssh-config" not in short and "--rdzv-conf" not in short and "--max_restarts" not in short
    text = CliRunner().invoke(cli, ["launch", "--help-all"], terminal_width=80).output
    heads = [text.index(h) for h in ("The plan: cluster, hosts, batch:", "Restarts and elastic runs",
                                     "When a run hangs", "Transports:", "Engines (poprun", "Output and the run",
                                     "torchrun's options (docs/launch.md):")]
    assert heads == sorted(heads), heads
    torchrun = text[heads[-1]:]
    for opt in ("--nproc-per-node", "--nnodes", "--rdzv-backend", "--rdzv-conf", "--master-addr", "--master-port",
                "--max-restarts", "--max_restarts", "-m, --module", "--no-python", "--run-path", "--local-ranks-filter",
                "--signals-to-handle", "--shutdown-timeout", "--numa-binding"):
        assert opt in torchrun, opt
    assert "Left out: 1 for a script, module or command, as torchrun's" in " ".join(torchrun.split())
    assert "--grace, --shutdown-timeout" in text[heads[3]:heads[4]] and "--vipu-partition" in text[heads[4]:heads[5]]


def test_hosts_help_shows_no_batch_options():
    for name, has_batch in (("hosts", False), ("plan", True), ("launch", True)):
        opts = {o for p in cli.get_command(click.Context(cli), name).params for o in p.opts}
        assert ({"--global-batch", "--local-batch", "--grad-accum"} <= opts) == has_batch, name
        assert "--hosts" in opts and "--nodes" in opts
