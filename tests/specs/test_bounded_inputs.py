"""Bounded inputs over the CLI: a FIFO, a device or an oversized file where podrun wants a file the user names, a
non-finite float, a control socket that answers too deep or too much, and a bad host list: each refused at once
(the subprocess timeout proves nothing waits) with one line naming the option or file, exit 2, no traceback."""
from __future__ import annotations

import os
import subprocess
import threading

import pytest

from tests.harness.podrun_proc import run_podrun

pytestmark = pytest.mark.timeout(300)

HUGE = 60 * 1024 * 1024


def _fifo(d, name):
    path = d / name
    os.mkfifo(path)
    return str(path)


def _recipe_with_fifo(d):
    (d / "rcp").mkdir()
    _fifo(d / "rcp", "recipe.yaml")
    return str(d / "rcp")


def _oversized(d, name, size):
    path = d / name
    with open(path, "wb") as f:
        f.truncate(size)           # sparse: no disk used
    return str(path)


def _control_socket(d, reply: bytes):
    """A fake live run (nothing real answers this way): <d>/run/control.sock answering ``reply`` to every
    connection, beside a control.pid naming this test's process, so podrun takes the run for a live one."""
    from podrun.wire import unixsock
    from podrun.rundir.layout import CONTROL_PID, CONTROL_SOCKET
    from podrun.wire.owner import record_text

    run = d / "run"
    run.mkdir(mode=0o700)
    fd = os.open(run / CONTROL_PID, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, record_text().encode())
    os.close(fd)
    server = unixsock.bind(str(run / CONTROL_SOCKET), 8)

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.recv(4096)
                    conn.sendall(reply)
                except OSError:            # podrun stopped reading: what the test wants
                    pass

    threading.Thread(target=serve, daemon=True).start()
    return str(run)


# (case, argv from the test's directory d, what stderr must say)
CASES = [
    ("hostfile-fifo", lambda d: ["plan", "--hostfile", _fifo(d, "hf"), "resnet50"], "hf: is a FIFO, not a regular file"),
    ("calibration-fifo", lambda d: ["plan", "--calibration", _fifo(d, "c.yaml"), "resnet18_cifar10"],
     "calibration file", "c.yaml: is a FIFO"),
    ("cluster-device", lambda d: ["plan", "--cluster", "/dev/zero", "resnet50"],
     "cluster spec /dev/zero: is a device"),
    ("recipe-fifo", lambda d: ["plan", _recipe_with_fifo(d)], "recipe.yaml: is a FIFO"),
    ("ssh-config-device", lambda d: ["launch", "--dry-run", "--hosts", "h1", "--ssh-config", "/dev/zero", "--",
                                     "true"], "--ssh-config /dev/zero: is a device"),
    ("ssh-config-fifo-paramiko", lambda d: ["launch", "--dry-run", "--hosts", "h1", "--ssh-client", "paramiko",
                                            "--ssh-config", _fifo(d, "cfg"), "--", "true"], "cfg: is a FIFO"),
    ("ssh-config-oversized", lambda d: ["calibrate", "--hosts", "h1", "--device-memory", "1", "--ssh-config",
                                        _oversized(d, "big", 17 << 20), "resnet18_cifar10"],
     "--ssh-config", "larger than"),
    ("device-memory-nan", lambda d: ["calibrate", "--device-memory", "nan", "resnet18_cifar10"],
     "--device-memory", "is not a number"),
    ("max-age-nan", lambda d: ["plan", "--max-age", "nan", "--calibration", "x", "resnet18_cifar10"],
     "--max-age", "is not a number"),
    ("stack-deep", lambda d: ["stack", _control_socket(d, b"[" * 100_000 + b"]" * 100_000)], "nested more than 32"),
    ("stack-huge", lambda d: ["stack", _control_socket(d, b'{"run_id": "r", "ranks": 1, "stacks_dir": "s", '
                                                          b'"lines": ["' + b"x" * HUGE + b'"]}\n')],
     "larger than 16 MiB"),
    ("spare-hosts-empty", lambda d: ["launch", "--dry-run", "--elastic", "1", "--hosts", "a,b", "--spare-hosts",
                                     "h1,,h2", "--", "true"], "--spare-hosts 'h1,,h2': empty host name"),
]


@pytest.mark.parametrize("argv,words", [(c[1], c[2:]) for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_at_once_with_one_line(tmp_path, argv, words):
    cp = run_podrun(*argv(tmp_path), cwd=tmp_path, timeout=60, stdin=subprocess.DEVNULL)
    err = cp.stderr
    assert cp.returncode == 2 and "Traceback" not in err and cp.stdout == "", (cp.returncode, err[-2000:])
    line = next((x for x in err.splitlines() if all(w in x for w in words)), None)
    assert line is not None and line.startswith(("podrun: error: ", "Error: Invalid value")), err[-2000:]
    assert len(err) < 1000, err[-2000:]
