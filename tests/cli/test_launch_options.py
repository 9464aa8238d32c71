"""`podrun launch`'s options: each is declared in one titled section, which names its --help section and the part
of LaunchOptions it fills; the CLI builds that one frozen object and passes it whole."""
from __future__ import annotations

import click

from podrun.cli.launch_cmd import SECTION_ATTR, SECTIONS, TRANSPORTS, launch, launch_options, section
from podrun.launch.options import HangOptions, LaunchOptions


def untitled(command: click.Command) -> list[str]:
    return [p.name for p in command.params if isinstance(p, click.Option) and p.name not in ("help", "help_all")
            and getattr(p, SECTION_ATTR, None) not in SECTIONS]


def test_every_launch_option_is_in_a_section():
    assert untitled(launch) == []


def test_an_option_declared_outside_a_section_is_found():
    """The check can fail: an option added beside the sections, not in one, is named."""
    @click.command()
    @section(TRANSPORTS, click.option("--inside"))
    @click.option("--outside")
    def cmd(inside, outside):
        pass

    assert untitled(cmd) == ["outside"]


def test_the_command_line_becomes_one_frozen_object():
    argv = ["--nproc-per-node", "2", "--hosts", "a,b", "--max-restarts", "3", "--no-warm", "--hang-timeout", "90",
            "--straggler-timeout", "30", "--transport", "ssh", "--no-host-key-check", "--heartbeat", "1",
            "--env", "A=1", "--dry-run", "--run-id", "r1", "--engine", "torch", "-m", "pkg.train", "--lr", "0.1"]
    ctx = launch.make_context("launch", list(argv))
    opts = launch_options(ctx, tuple(ctx.params.pop("args")), dict(ctx.params))
    assert isinstance(opts, LaunchOptions)
    assert opts.target.args == ("pkg.train", "--lr", "0.1") and opts.target.module and not opts.target.no_python
    assert "--no-host-key-check" in opts.target.option_names
    assert opts.torchrun.nproc_per_node == "2" and opts.plan.hosts_opt == "a,b"
    assert (opts.restarts.max_restarts, opts.restarts.warm, opts.restarts.straggler_timeout) == (3, False, 30.0)
    assert opts.hangs == HangOptions(hang_timeout=90.0, on_hang="end") and opts.engine.engine == "torch"
    t = opts.transports
    assert (t.transport, t.ssh.host_key_check, t.heartbeat, t.env_items) == ("ssh", False, 1.0, ("A=1",))
    assert (opts.output.dry_run, opts.output.run_id) == (True, "r1")


def test_a_dry_run_at_scale_fits_a_screen_and_shows_what_runs():
    """ABCI at 512 nodes: the summary names what differs and prints the first and last host's command and worker's
    env exactly as --dry-run-all does; --dry-run-host shows one host's; a host not in the plan is exit 2."""
    from click.testing import CliRunner

    from podrun.cli.main import cli

    args = ["launch", "--cluster", "abci", "--nodes", "512", "--run-id", "r", "--dry-run"]
    runner = CliRunner()
    summary = runner.invoke(cli, args + ["--", "python", "train.py"])
    assert summary.exit_code == 0 and len(summary.output.splitlines()) < 120, summary.output
    assert "--instance 0 .. --instance 511" in summary.output and "RANK=0 .. RANK=2047" in summary.output
    whole = runner.invoke(cli, args + ["--dry-run-all", "--", "python", "train.py"]).output
    assert len(whole.splitlines()) > 50_000
    blocks = summary.output.split("\n\n")[1:]          # each host's command and each worker's env, as printed
    assert len(blocks) == 4 and all(b in whole for b in blocks), blocks
    one = runner.invoke(cli, args + ["--dry-run-host", "g0007", "--", "python", "train.py"]).output
    assert one.count("# host ") == 1 and one.count("# instance 6 on g0007, worker ") == 4, one
    wrong = runner.invoke(cli, args + ["--dry-run-host", "gx", "--", "python", "train.py"])
    assert wrong.exit_code == 2 and "not a host of the plan" in wrong.output
