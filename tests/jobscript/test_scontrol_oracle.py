"""Slurm itself as the oracle: `scontrol show hostnames` (real Slurm, no controller needed) must
expand every nodelist exactly as expand_nodelist does."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from podrun.specs.allocation import compress_hostlist, expand_nodelist



@pytest.fixture(scope="module")
def scontrol(tmp_path_factory):
    exe = shutil.which("scontrol")
    if exe is None:
        pytest.fail("scontrol (Debian package slurm-client) is not installed: it is the oracle for nodelists",
                    pytrace=False)
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    # a minimal config: `show hostnames` is computed locally; SLURM_CONF must always be set, else
    # Slurm looks its controller up in DNS
    conf.write_text("ClusterName=podrunoracle\nSlurmctldHost=localhost(127.0.0.1)\n"
                    "NodeName=node1 CPUs=1\nPartitionName=p Nodes=node1\n")
    env = {**os.environ, "SLURM_CONF": str(conf)}

    def hostnames(nodelist: str) -> list[str]:
        proc = subprocess.run([exe, "show", "hostnames", nodelist], capture_output=True, text=True,
                              env=env, timeout=20)
        assert proc.returncode == 0 and "Invalid hostlist" not in proc.stdout, proc.stdout + proc.stderr
        return proc.stdout.split()

    return hostnames


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nodelist", [
    "g[0001-0003,0007],h5", "rack[1-2]-n[01-02]", "x[3,1,2]", "n[8-11]", "n[08-11]", "n[098-101]",
    "gpu1.cluster.local,login", "a,b,a", "r[1-2]n[1-2]", "[1-3]", "a.b-c_d", "node[1-3]", "g[0001-1088]",
])
def test_examples_match_scontrol(scontrol, nodelist):
    assert expand_nodelist(nodelist) == scontrol(nodelist)


_host = st.builds(lambda p, n, w: f"{p}{str(n).zfill(w)}", st.sampled_from(["g", "node", "r1n", "a-", "x.y"]),
                  st.integers(0, 300), st.integers(0, 4))


@pytest.mark.timeout(60)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_host, min_size=1, max_size=30, unique=True))
def test_compressed_lists_expand_like_scontrol(scontrol, hosts):
    text = compress_hostlist(hosts)
    assert scontrol(text) == hosts == expand_nodelist(text)


def test_compressor_output_with_suffixes_is_accepted_by_slurm(scontrol):
    hosts = ["gpu1-ib", "gpu2-ib", "gpu3", "gpu4", "gpu10", "login.example"]
    text = compress_hostlist(hosts)
    assert text == "gpu1-ib,gpu2-ib,gpu[3-4],gpu10,login.example"
    assert scontrol(text) == hosts
