"""Bad input beside the shared-node issue: each option and `podrun stack`'s input (and a control socket's reply)
refused with one paragraph and exit 2, never a traceback; what reaches the terminal has its control characters
escaped."""
from __future__ import annotations

import json
import os
import socket
import threading

import pytest

from podrun.cli.main import main
from tests.harness.podrun_proc import run_podrun

pytestmark = pytest.mark.timeout(120)


def _launch(capsys, monkeypatch, tmp_path, *argv):
    monkeypatch.chdir(tmp_path)
    rc = main(["launch", "--runs-dir", str(tmp_path / "runs"), "--dry-run", *argv, "--", "echo", "hi"])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("argv,words", [
    (["--nproc-per-node", "100000"], "at most 4096"),
    (["--nproc-per-node", "99999999999999999999"], "at most 4096"),
    (["--nproc-per-node", "\u0663"], "is not a number of workers"),               # ARABIC-INDIC DIGIT THREE
    (["--nproc-per-node", "\u00b2"], "is not a number of workers"),               # SUPERSCRIPT TWO
    (["--hang-timeout", "1e308"], "--hang-timeout"),
    (["--hang-timeout", "604801"], "--hang-timeout"),
    (["--hang-timeout", "1e-320"], "--hang-timeout"),
    (["--hang-timeout", "0.0001"], "--hang-timeout"),
    (["--hang-timeout", "\u0663"], "--hang-timeout"),
    (["--heartbeat", "\u0663"], "--heartbeat"),
    (["--grace", "\u0663"], "--grace"),
    (["--heartbeat", "604800", "--heartbeat-misses", "1000000"], "--heartbeat, --heartbeat-misses"),
    (["--keepalive", "604801"], "--keepalive"),
    (["--rdzv-endpoint", "h1:65536"], "is not a TCP port"),
    (["--rdzv-endpoint", "h1:29400:1"], "is not one HOST:PORT"),
    (["--rdzv-endpoint", "h1:\u0663"], "is not a TCP port"),
    (["--data-interface", "nonexist0"], "nonexist0 (--data-interface) does not exist on this machine"),
])
def test_launch_refuses_with_one_paragraph_and_exit_2(capsys, monkeypatch, tmp_path, argv, words):
    rc, out, err = _launch(capsys, monkeypatch, tmp_path, *argv)
    assert rc == 2, err
    assert words in err and "Traceback" not in err and out == "", err
    assert len(err) < 1000, err          # one paragraph, not a dry run's millions of lines
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("argv", [["--hang-timeout", "1"], ["--hang-timeout", "604800"], ["--nproc-per-node", "4096"],
                                  ["--rdzv-endpoint", "[::1]:29400"], ["--data-interface", "lo"],
                                  ["--heartbeat", "0.5", "--heartbeat-misses", "1000000"]])
def test_the_bounds_themselves_are_accepted(capsys, monkeypatch, tmp_path, argv):
    monkeypatch.chdir(tmp_path)
    rc = main(["launch", "--runs-dir", str(tmp_path / "runs"), "--dry-run", "--json", *argv, "--", "echo", "hi"])
    out, err = capsys.readouterr()
    assert rc in (0, None), err
    assert json.loads(out)["run_id"]


def _stack(*argv):
    return run_podrun("stack", *argv, timeout=60)


def test_podrun_stack_with_a_300_character_name_is_one_paragraph(tmp_path):
    cp = _stack("--runs-dir", str(tmp_path), "x" * 300)
    assert cp.returncode == 2 and "is not a plain name" in cp.stderr and "Traceback" not in cp.stderr, cp.stderr
    cp = _stack(str(tmp_path / ("y" * 300)))
    assert cp.returncode == 2 and "Traceback" not in cp.stderr, cp.stderr


class FakeControlSocket:
    """A fake control socket (nothing real answers malformed replies): a unix socket in a run directory that
    answers every connection with the given bytes."""

    def __init__(self, run_dir, reply: bytes):
        os.chmod(run_dir, 0o700)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self.sock.bind(os.path.join(run_dir, "control.sock"))     # a short path: tmp_path's
        finally:
            os.umask(old)
        self.sock.listen(8)
        self.reply = reply
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with c:
                try:
                    if c.recv(4096):          # podrun's check for a stale socket connects and sends nothing
                        c.sendall(self.reply)
                except OSError:
                    pass

    def close(self):
        self.sock.close()


@pytest.mark.parametrize("reply", [b"[]\n", b'"x"\n', b"null\n", b"{}\n", b'{"run_id": "r", "lines": []}\n',
                                   b'{"run_id": "r", "ranks": "2", "lines": [], "stacks_dir": "s"}\n',
                                   b'{"run_id": "r", "ranks": 1, "lines": [3], "stacks_dir": "s"}\n', b"not json\n"])
def test_podrun_stack_refuses_a_malformed_reply_with_one_paragraph(tmp_path, reply):
    run = tmp_path / "r"
    run.mkdir()
    fake = FakeControlSocket(run, reply)
    try:
        cp = _stack(str(run))
    finally:
        fake.close()
    assert cp.returncode == 2, cp.stdout + cp.stderr
    assert cp.stderr.startswith("podrun: error:") and "Traceback" not in cp.stderr, cp.stderr


def test_podrun_stack_escapes_control_characters_and_redacts_secrets(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    token = "hf_" + "k" * 24
    reply = {"run_id": "r\x1b]0;owned\x07", "ranks": 1, "stacks_dir": "s",
             "lines": [f"rank 0: evil\x1b[2J\rline {token}"], "groups": []}
    fake = FakeControlSocket(run, json.dumps(reply).encode() + b"\n")
    try:
        cp = _stack(str(run))
        as_json = _stack(str(run), "--json")
    finally:
        fake.close()
    assert cp.returncode == 0, cp.stderr
    assert "\x1b" not in cp.stdout and "\r" not in cp.stdout and "\x07" not in cp.stdout, repr(cp.stdout)
    assert "\\x1b[2J\\x0dline <redacted>" in cp.stdout, repr(cp.stdout)
    assert token not in as_json.stdout and token not in cp.stdout


def test_a_run_name_with_control_characters_is_shown_escaped(tmp_path):
    cp = _stack("--runs-dir", str(tmp_path), "bad\x1b[2Jname")
    assert cp.returncode == 2 and "\x1b" not in cp.stderr and "Traceback" not in cp.stderr, repr(cp.stderr)
