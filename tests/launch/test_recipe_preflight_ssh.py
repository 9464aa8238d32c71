"""A recipe over ssh with a --python that lacks its packages: every held agent reports what it cannot import,
and the run stops before anything starts, naming each host and the install command (real OpenSSH hosts)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.launch.helpers import podrun
from tests.ports import free_port

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]


def fresh_python(tmp_path: Path) -> str:
    """A real interpreter without torch: a venv without system site-packages that finds podrun's checkout."""
    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (site,) = venv.glob("lib/python3*/site-packages")
    (site / "podrun-checkout.pth").write_text(str(ROOT) + "\n")
    return str(venv / "bin" / "python")


def test_every_host_without_torch_is_named_and_nothing_starts(ssh_hosts, tmp_path):
    python = fresh_python(tmp_path)
    names = ssh_hosts.hosts[:2]
    cp = podrun("launch", "--hosts", ",".join(names), "--devices-per-host", "1", "--transport", "ssh",
                "--ssh-config", ssh_hosts.ssh_config_path, "--python", python, "--runs-dir", str(tmp_path / "runs"),
                "--master-port", str(free_port(2)), str(ROOT / "recipes" / "resnet18_cifar10"), "--data", "digits",
                timeout=180)
    assert cp.returncode == 2, cp.stderr
    for host in names:
        assert f"{host}: {python} cannot import yaml, torch, numpy, sklearn, which the recipe needs" in cp.stderr, \
            cp.stderr
    assert "pip install 'podrun[train]'" in cp.stderr and "Traceback" not in cp.stderr, cp.stderr
    assert not list((tmp_path / "runs").glob("*/instance-*.log")), "a worker started"
