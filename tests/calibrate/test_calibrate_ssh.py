"""`podrun calibrate` over ssh on namespace hosts (real sshd, real gloo): the inter-host all-reduce measured on a
link shaped by tc, the plan taking it; a host that dies during the calibration is named and no file is written."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from podrun.specs.calibration import load
from tests.harness.shaping import shape, shaped_rate_mbit, unshape
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
RECIPE = str(ROOT / "recipes" / "resnet18_cifar10")


def calibrate_argv(hosts, names, tmp_path, *extra):
    return [sys.executable, "-m", "podrun", "calibrate", "--hosts", ",".join(names), "--devices-per-host", "1",
            "--transport", "ssh", "--ssh-config", hosts.ssh_config_path, "--master-port", str(free_port(2)),
            "--runs-dir", str(tmp_path / "runs"), "--device-memory", "0.3", "--batches", "4", "--steps", "1",
            *extra, RECIPE]


def test_calibrate_over_ssh_measures_the_shaped_link_and_the_plan_uses_it(ssh_hosts, tmp_path):
    names = ssh_hosts.hosts[:2]
    shape(ssh_hosts, names, rate_mbit=200)
    try:
        assert shaped_rate_mbit(ssh_hosts, names[0]) == 200
        r = subprocess.run(calibrate_argv(ssh_hosts, names, tmp_path, "--json"), capture_output=True, text=True,
                           timeout=900, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"})
    finally:
        unshape(ssh_hosts, names)
    assert r.returncode == 0, r.stderr[-3000:]
    cal = load(json.loads(r.stdout)["file"])
    assert cal.hosts == tuple(names) and cal.devices_per_host == 1
    link = cal.network.inter_host
    assert link is not None and link.ranks == 2 and link.message_bytes == 11173962 * 4
    # 2 ranks: each sends the whole gradient once (half in the reduce-scatter, half in the all-gather), at most
    # the 200 Mbit/s each host may send
    assert 0.1 < link.bus_bandwidth_gbps <= 0.21, link
    p = subprocess.run([sys.executable, "-m", "podrun", "plan", "--hosts", ",".join(names), "--devices-per-host",
                        "1", RECIPE, "--calibration", str(tmp_path / "runs" / "calibrations" /
                                                         "resnet18_cifar10-local.yaml"), "--json"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    e = json.loads(p.stdout)["estimate"]
    comm = link.message_bytes * 8 / (link.bus_bandwidth_gbps * 1e9) + 2 * link.latency_us * 1e-6
    assert abs(e["allreduce_seconds"] - comm) < 1e-5 and "inter-host" in " ".join(e["assumptions"])


def test_a_host_that_dies_during_calibration_is_named_and_no_file_is_written(make_ssh_hosts, tmp_path):
    hosts = make_ssh_hosts(2)
    err = tmp_path / "stderr"
    with open(err, "w") as f:
        proc = subprocess.Popen(calibrate_argv(hosts, hosts.hosts, tmp_path), stdout=subprocess.PIPE, stderr=f,
                                text=True, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 600
    while "memory probe 1" not in err.read_text() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, err.read_text()[-3000:]
    hosts.crash("h2")
    proc.communicate(timeout=300)
    text = err.read_text()
    assert proc.returncode not in (0, 2), text[-3000:]
    assert "calibration failed on host h2" in text and "no calibration file written" in text, text[-3000:]
    assert "Traceback" not in text
    cals = tmp_path / "runs" / "calibrations"
    assert not cals.exists() or not list(cals.iterdir())
