"""Elastic at 256 ranks: a host lost under rank 200 (4 hosts x 64 light workers over ssh) is dropped and the run
re-planned on the 3 left, whose 192 ranks all start in the second attempt. Real OpenSSH hosts, real agents."""
from __future__ import annotations

import pytest

from tests.elastic.test_elastic_ssh import cut_when_up, launch_args
from tests.launch.helpers import marker, podrun_popen, run_dir, summary

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def test_a_host_lost_under_rank_200_of_256_is_dropped_and_the_run_replanned_on_3_hosts(make_ssh_hosts, tmp_path):
    hosts = make_ssh_hosts(4)
    m = marker()
    # the first attempt waits until podrun ends it (the cut), the re-planned one ends at once
    cmd = ["sh", "-c", f'echo "up $RANK of $WORLD_SIZE"; [ "$PODRUN_RESTART_COUNT" != 0 ] || sleep 600 # {m}']
    args = launch_args(hosts, hosts.hosts, tmp_path, "runs", "--global-batch", "768", "--elastic", "3",
                       "--max-restarts", "1")
    args[args.index("--devices-per-host") + 1] = "64"
    p = podrun_popen(*args, "--", *cmd)
    err = cut_when_up(p, hosts, "h4", instances=256, timeout=180)      # h4 holds ranks 192-255
    assert p.returncode == 0, err[-3000:]
    assert "elastic: dropping h4 (host h4 lost" in err and "re-planned 4 -> 3 hosts" in err, err[-3000:]
    s = summary(tmp_path / "runs")
    assert [x["host"] for x in s["instances"]] == ["h1", "h2", "h3"], s["instances"]
    assert all(x["exit_code"] == 0 and len(x["workers"]) == 64 for x in s["instances"]), s["instances"]
    logs = "".join(f.read_text() for f in run_dir(tmp_path / "runs").glob("instance-*.log"))
    second = {line.split("up ", 1)[1].strip() for line in logs.splitlines() if line.strip().endswith(" of 192")}
    assert second == {f"{r} of 192" for r in range(192)}, sorted(second)[:5]
