"""The liveness settings (--heartbeat, --heartbeat-misses, --keepalive, the cluster spec's fields) and Hearing."""
from __future__ import annotations

import json
import subprocess

import pytest

from podrun.errors import LaunchError
from podrun.launch.listener import Hearing
from podrun.wire.liveness import Liveness, settings
from tests.harness.podrun_proc import PODRUN, run_podrun


@pytest.mark.parametrize("given,period,bound", [
    ({}, 0.25, 1.0),                                          # the default: 0.25 s x 4
    ({"heartbeat": 0.25}, 0.25, 1.0),                         # misses stay 4
    ({"misses": 10}, 0.25, 2.5),                              # the period stays 0.25 s
    ({"heartbeat": 1.0, "misses": 3}, 1.0, 3.0),
    ({"keepalive": 5.0}, 1.25, 5.0),                          # the bound itself: 4 misses of 5/4 s
    ({"keepalive": 3.0, "misses": 6}, 0.5, 3.0),
    ({"keepalive": 3.0, "heartbeat": 0.5}, 0.5, 3.0),
    ({"keepalive": 3.0, "heartbeat": 0.5, "misses": 6}, 0.5, 3.0),
    ({"spec_heartbeat": 0.2, "spec_misses": 5}, 0.2, 1.0),    # the cluster spec's, when no option is given
    ({"spec_heartbeat": 0.2, "spec_misses": 5, "keepalive": 4.0}, 1.0, 4.0),   # any option: the spec's are ignored
    ({"spec_misses": 8}, 0.25, 2.0),
])
def test_the_bound_is_the_period_times_the_misses(given, period, bound):
    live = settings(**given)
    assert (live.period, live.bound) == pytest.approx((period, bound))
    assert live.misses == pytest.approx(bound / period)


@pytest.mark.parametrize("given,words", [
    ({"keepalive": 3.0, "heartbeat": 0.5, "misses": 5},
     "--keepalive 3 disagrees with --heartbeat 0.5 x --heartbeat-misses 5"),
    ({"keepalive": 1.0, "heartbeat": 2.0}, "--keepalive 1 is shorter than --heartbeat 2"),
    ({"keepalive": 0.02}, "a heartbeat every 0.005 s (--keepalive) is more often than every 0.01 s"),
    ({"spec_heartbeat": 0.001}, "heartbeat and heartbeat_misses in the cluster spec"),
    ({"misses": 0}, "--heartbeat-misses 0 is outside 1..1000000"),
])
def test_settings_that_cannot_hold_together_are_refused_naming_the_options(given, words):
    with pytest.raises(LaunchError) as e:
        settings(**given)
    assert words in str(e.value), str(e.value)


def test_the_bound_is_described_as_it_is_made():
    assert Liveness().describe() == "1 s (4 missed heartbeats of 0.25 s)"
    assert Liveness(0.5, 2.0).to_dict() == {"period_s": 0.5, "misses": 4, "bound_s": 2.0}


class Clock:
    """A clock the test moves by hand (Hearing's arithmetic, without sleeping)."""

    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_silence_leaves_out_the_time_a_reader_waited_on_the_controller():
    clock = Clock()
    h = Hearing(clock)
    assert h.silence(0, "r") is None and 0 not in h.gaps()
    h.heard("r", 0)
    clock.t += 0.5
    h.heard("r", 0)
    assert h.gaps()[0] == pytest.approx(0.5)
    clock.t += 0.4
    h.wait_begins("r")            # the controller's queue is full: the reader waits 3 s
    clock.t += 3.0
    assert h.silence(0, "r") == pytest.approx(0.4)
    h.wait_ends("r")
    clock.t += 0.2
    assert h.silence(0, "r") == pytest.approx(0.6)
    h.heard("r", 0)
    assert h.gaps()[0] == pytest.approx(0.6)      # 3.6 s between the lines, 3 s of them the controller's
    clock.t += 2.5
    assert h.silence(0, "r") == pytest.approx(2.5)
    h.end("r")
    assert h.silence(0, "r") == 0.0                # its end is queued: EOF says the rest


def test_the_controllers_own_stall_counts_in_no_instances_silence():
    """A controller that did not run for a while (starved, stopped) heard nobody then: that time is taken out of
    every instance's silence, from the stall on (a line heard after it starts a silence of its own)."""
    clock = Clock()
    h = Hearing(clock)
    h.heard("a", 0)
    h.heard("b", 1)
    clock.t += 10.0
    h.stall(9.0)                   # 9 of those 10 s the controller's loop did not turn
    assert h.silence(0, "a") == pytest.approx(1.0) and h.silence(1, "b") == pytest.approx(1.0)
    h.heard("a", 0)
    clock.t += 3.0
    assert h.silence(0, "a") == pytest.approx(3.0) and h.silence(1, "b") == pytest.approx(4.0)


def test_one_reader_for_several_instances_counts_each_instances_own_silence():
    """mpirun/srun: one stream carries every instance; a line of one is no news of another."""
    clock = Clock()
    h = Hearing(clock)
    h.heard("m", 0)
    h.heard("m", 1)
    for _ in range(5):
        clock.t += 0.5
        h.heard("m", 0)
    assert h.silence(0, "m") == 0.0 and h.silence(1, "m") == pytest.approx(2.5)


def test_a_cluster_spec_sets_the_heartbeat_and_dry_run_shows_it(tmp_path):
    from podrun.specs import load_cluster
    from tests.specs.test_specs import write

    local = open(load_cluster("local").path).read()
    p = write(tmp_path, local + "\nheartbeat: 0.25\nheartbeat_misses: 8\n")
    base = ["launch", "--cluster", str(p), "--nodes", "1", "--dry-run"]
    cp = run_podrun(*base, "--json", "--", "true", timeout=60)
    assert cp.returncode == 0, cp.stderr
    rec = json.loads(cp.stdout)
    assert rec["heartbeat"] == {"period_s": 0.25, "misses": 8, "bound_s": 2.0}
    assert "--heartbeat 0.25 --instance 0 --stdin-timeout 2 " in rec["commands"][0]["command"]
    cp = run_podrun(*base, "--heartbeat-misses", "2", "--", "true", timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert "# heartbeat every 0.25 s both ways; a host silent for 0.5 s (2 missed) is lost" in cp.stdout, cp.stdout
    p = write(tmp_path, local + "\nheartbeat_misses: 0\n", "bad.yaml")
    cp = run_podrun(*base[:1], "--cluster", p, "--dry-run", "--", "true", timeout=60)
    line = len(p.read_text().splitlines())
    assert cp.returncode == 2 and f"{p}:{line}: field 'heartbeat_misses' must be at least 1" in cp.stderr, cp.stderr
    assert "Traceback" not in cp.stderr


@pytest.mark.parametrize("hosts,period", [(1, 0.25), (16, 0.25), (17, 0.265625), (32, 0.5), (64, 1.0),
                                          (320, 5.0), (512, 5.0)])
def test_the_default_period_grows_with_the_hosts_beyond_16_up_to_5_s(hosts, period):
    """A host lost within 1 s up to 16 hosts; the controller hears 64 heartbeats a second at most (16 hosts x 4)
    until the period reaches 5 s."""
    from podrun.wire.liveness import default_period

    assert default_period(hosts) == pytest.approx(period)
    live = settings(hosts=hosts)
    assert (live.period, live.bound) == pytest.approx((period, 4 * period))


@pytest.mark.parametrize("given,period,bound", [
    ({"keepalive": 2.0}, 0.5, 2.0),                 # an explicit bound wins: 4 misses of 0.5 s
    ({"heartbeat": 0.5}, 0.5, 2.0),
    ({"misses": 6}, 1.0, 6.0),                      # the period follows the hosts, the misses are the option's
    ({"spec_heartbeat": 0.25, "spec_misses": 4}, 0.25, 1.0),   # a cluster spec's period wins too
])
def test_what_is_given_wins_over_the_period_the_host_count_gives(given, period, bound):
    live = settings(**given, hosts=64)
    assert (live.period, live.bound) == pytest.approx((period, bound))


def test_dry_run_of_64_hosts_gives_every_agent_the_longer_period():
    """The default: the controller's bound grows with the hosts; an agent's bound on the controller's silence is at
    least 5 s (a loaded controller machine misses heartbeats; a controller that ends closes its agents' stdin). A
    given --keepalive is the bound both ways."""
    hosts = ",".join(f"n{i}" for i in range(64))
    base = [*PODRUN, "launch", "--transport", "ssh", "--hosts", hosts, "--devices-per-host", "1",
            "--dry-run", "--json"]
    cp = subprocess.run([*base, "--", "true"], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    rec = json.loads(cp.stdout)
    assert rec["heartbeat"] == {"period_s": 1.0, "misses": 4, "bound_s": 4.0, "agent_bound_s": 5.0}
    assert all("--heartbeat 1 --instance" in c["command"] and "--stdin-timeout 5 " in c["command"]
               for c in rec["commands"])
    cp = subprocess.run([*base, "--keepalive", "2", "--", "true"], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    rec = json.loads(cp.stdout)
    assert rec["heartbeat"] == {"period_s": 0.5, "misses": 4, "bound_s": 2.0}
    assert all("--stdin-timeout 2 " in c["command"] for c in rec["commands"])


def test_under_mpirun_every_workers_agent_counts_as_a_heartbeat_sender():
    """--transport mpirun --mpi-ranks runs an agent per worker (an MPI rank each), and each sends heartbeats: 16
    hosts x 4 workers are 64 senders, the period of 64 hosts (1 s), not of 16; over ssh, and under mpirun's agents
    that join (one a host), 0.25 s."""
    hosts = ",".join(f"n{i}" for i in range(16))
    base = [*PODRUN, "launch", "--hosts", hosts, "--devices-per-host", "4", "--dry-run",
            "--json"]
    got = {}
    for transport in ("mpirun --mpi-ranks", "mpirun", "ssh"):
        cp = subprocess.run([*base, "--transport", *transport.split(), "--", "true"], capture_output=True, text=True,
                            timeout=60)
        assert cp.returncode == 0, cp.stderr
        got[transport] = json.loads(cp.stdout)["heartbeat"]
    assert got == {"mpirun --mpi-ranks": {"period_s": 1.0, "misses": 4, "bound_s": 4.0, "agent_bound_s": 5.0},
                   "mpirun": {"period_s": 0.25, "misses": 4, "bound_s": 1.0, "agent_bound_s": 5.0},
                   "ssh": {"period_s": 0.25, "misses": 4, "bound_s": 1.0, "agent_bound_s": 5.0}}
