"""The snapshot slots (podrun.runtime.snapshot) in one process: header last, two slots, the optimizer step waits
for the background write, buffers copied at the call, the directory in the env contract and its removal."""
from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import torch

from podrun.wire.worker_env import PODRUN_FIELDS
from podrun.runtime import snapshot


def test_a_slot_counts_only_with_its_header_and_the_size_it_names(host_dir):
    w = snapshot.Writer(host_dir)
    for step in (1, 2, 3):
        w.submit(step, {"x": torch.full((1000,), float(step))})
    w.close()
    assert snapshot.held(host_dir) == [(3, 0), (2, 1)]       # two slots: the last two updates
    (host_dir / "slot-0.bin").write_bytes(b"torn")             # a data file cut short: that slot no longer counts
    assert snapshot.held(host_dir) == [(2, 1)]
    (host_dir / "slot-1.json").unlink()                       # no header: not complete
    assert snapshot.held(host_dir) == []
    got = snapshot.recover(snapshot.Writer(host_dir), -1)
    assert got is None


def test_recover_single_process_returns_the_newest_state_newer_than_the_checkpoint(host_dir):
    w = snapshot.Writer(host_dir)
    w.submit(4, {"w": torch.arange(3.0), "note": "four"})
    w.submit(5, {"w": torch.arange(3.0) + 5, "note": "five"})
    got = snapshot.recover(w, newer_than=4)
    assert (got.step, got.from_rank, got.fetched_by, got.state["note"]) == (5, 0, (), "five")
    assert torch.equal(got.state["w"], torch.arange(3.0) + 5)
    assert snapshot.recover(w, newer_than=5) is None          # the disk checkpoint is as new: it is the resume
    w.close()


def test_the_next_optimizer_step_waits_for_the_write_and_buffers_are_copied_at_the_call(host_dir, monkeypatch):
    from podrun.runtime import rawstate

    laid_out = rawstate.layout
    started, release = threading.Event(), threading.Event()

    def held_layout(state):      # the write is still running when the next optimizer step starts, until released
        started.set()
        assert release.wait(60), "the test never let the write go on"
        return laid_out(state)
    monkeypatch.setattr(rawstate, "layout", held_layout)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.BatchNorm1d(1024))
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    w = snapshot.Writer(host_dir)
    for step in (1, 2):
        model(torch.randn(16, 1024)).square().sum().backward()
        opt.step()
        opt.zero_grad()
    want = {k: v.clone() for k, v in model.state_dict().items()}
    w.submit(2, {"model": snapshot.freeze(model), "opt": opt.state_dict()})
    assert started.wait(60)                                   # the write is running
    model(torch.randn(16, 1024)).square().sum().backward()     # a forward changes BatchNorm's running stats
    stepped = threading.Event()
    stepper = threading.Thread(target=lambda: (opt.step(), stepped.set()))   # and this step the weights
    stepper.start()
    try:
        assert not stepped.wait(0.5), "the optimizer step did not wait for the write"
    finally:
        release.set()
        stepper.join(60)
    assert stepped.is_set()
    w.close()
    got = snapshot.recover(w, -1)
    assert got.step == 2
    for k, v in want.items():
        assert torch.equal(got.state["model"][k], v), k
    assert not torch.equal(got.state["model"]["0.weight"], model.state_dict()["0.weight"])


def test_test_knob_stops_a_host_writing_after_a_step(host_dir, monkeypatch):
    """PODRUN_TEST_SNAPSHOT_UNTIL (a test knob) names hosts by their directory."""
    monkeypatch.setenv(snapshot.TEST_UNTIL_ENV, "h0=9,h1=2")
    w = snapshot.Writer(host_dir)
    for step in (1, 2, 3, 4):
        w.submit(step, {"s": step})
    w.close()
    assert [s for s, _ in snapshot.held(host_dir)] == [2, 1]


def test_the_env_contract_names_a_directory_per_run_and_host_when_a_restart_can_read_it():
    """A run that can restart gets a snapshot directory per run and host; a run that cannot gets none (a
    snapshot no restart reads would only cost a write per update)."""
    from podrun.plan import Overrides, make_plan
    from podrun.wire.worker_env import worker_env
    from podrun.specs import load_cluster

    plan = make_plan(load_cluster("local").with_hosts(("a", "b"), 1), None, Overrides(global_batch=8))

    def envs(max_restarts, key="k1"):
        return [worker_env(plan, i, 0, run_id="r1", run_dir="/x", plan_path="/x/plan.json", master_addr="a",
                           master_port=1, max_restarts=max_restarts, snapshot_key=key) for i in (0, 1)]
    got = [e[PODRUN_FIELDS["snapshot_dir"]] for e in envs(1)]
    run_dir = os.path.dirname(got[0])
    assert got == [f"{run_dir}/a", f"{run_dir}/b"] and run_dir.startswith("/dev/shm/podrun-r1-")
    assert len(os.path.basename(run_dir)) == len("podrun-r1-") + 32          # the key's tag: 128 bits
    assert os.path.dirname(envs(1, "k2")[0][PODRUN_FIELDS["snapshot_dir"]]) != run_dir   # another key, elsewhere
    assert all(PODRUN_FIELDS["snapshot_dir"] not in e for e in envs(0))
    assert all(PODRUN_FIELDS["snapshot_dir"] not in e for e in envs(1, None))   # no key: no snapshots


@pytest.mark.parametrize("code,ended,restart,most,removed", [
    (0, False, 0, 2, True),       # the workers finished
    (1, False, 0, 2, False),      # a failure a restart will resume from
    (1, True, 0, 2, True),        # the run is being ended (signal, or the controller lost)
    (1, False, 2, 2, True),       # the last restart's failure: nothing will read it
])
def test_the_agent_drops_snapshots_only_when_no_restart_will_read_them(host_dir, code, ended, restart, most, removed):
    w = snapshot.Writer(host_dir)
    w.submit(1, {"s": 1})
    w.close()
    env = {PODRUN_FIELDS["snapshot_dir"]: str(host_dir), PODRUN_FIELDS["restart_count"]: str(restart),
           "TORCHELASTIC_MAX_RESTARTS": str(most)}
    snapshot.drop_when_done([env], code, ended)
    assert host_dir.exists() is not removed
    assert host_dir.parent.exists() is not removed             # the run's directory goes with its last host


def test_the_user_api_plan_reads_the_env_contract(monkeypatch):
    from podrun.runtime import elastic

    for k, v in {"PODRUN_NUM_REPLICAS": "3", "RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "0",
                 "PODRUN_REPLICA_OFFSET": "2", "PODRUN_LOCAL_BATCH": "1", "PODRUN_GRAD_ACCUM": "4",
                 "PODRUN_GLOBAL_BATCH": "12", "PODRUN_RESTART_COUNT": "1"}.items():
        monkeypatch.setenv(k, v)
    p = elastic.plan()
    assert (p.rank, p.world_size, p.replica, p.replicas, p.local_batch, p.grad_accum, p.global_batch,
            p.restart_count) == (2, 3, 2, 3, 1, 4, 12, 1)


def test_update_0_is_recovered_and_a_snapshot_older_than_the_checkpoint_never_is(host_dir):
    w = snapshot.Writer(host_dir)
    w.submit(0, {"w": torch.zeros(2)})
    got = snapshot.recover(w, -1)
    assert got is not None and got.step == 0
    w.submit(3, {"w": torch.ones(2)})
    assert snapshot.recover(w, newer_than=6) is None          # the disk checkpoint is newer: it is the resume
    assert w.read(3) is not None and w.read(4) is None
    assert snapshot.Writer(host_dir).read(3) is None           # nothing verified yet: nothing to send
    w.close()


def test_headers_in_a_directory_others_may_read_are_not_trusted(host_dir):
    w = snapshot.Writer(host_dir)
    w.submit(1, {"w": torch.ones(8)})
    w.close()
    assert snapshot.held(host_dir) == [(1, 0)]
    os.chmod(host_dir, 0o750)
    try:
        assert snapshot.held(host_dir) == []
    finally:
        os.chmod(host_dir, 0o700)


def test_the_directory_is_made_again_when_another_agent_removed_its_parent_in_between(host_dir, monkeypatch):
    """open_dir's retry: the host's directory vanishing once (another host's agent on this machine removed the run's
    empty directory) is made again; vanishing every time is an error, not a directory that is not there."""
    real, vanished = snapshot.make_private, []

    def once(p):
        if Path(p) == host_dir and not vanished:
            vanished.append(p)
            raise FileNotFoundError(p)
        return real(p)

    monkeypatch.setattr(snapshot, "make_private", once)
    assert snapshot.open_dir(host_dir) == host_dir and host_dir.is_dir() and vanished

    def always(p):
        if Path(p) == host_dir:
            raise FileNotFoundError(p)
        return real(p)

    monkeypatch.setattr(snapshot, "make_private", always)
    with pytest.raises(FileNotFoundError):
        snapshot.open_dir(host_dir)


def test_a_received_snapshot_that_cannot_be_kept_turns_snapshots_off_instead_of_failing_the_step(host_dir):
    """put (a snapshot received from another rank, kept for a second failure): the host's directory gone under the
    run (or /dev/shm full) is said in the writer's error; the training step goes on."""
    w = snapshot.Writer(host_dir)
    snapshot.remove(host_dir)
    w.put(3, b"\0" * 16, "raw", "0" * 64)
    assert w.error is not None and "FileNotFoundError" in w.error, w.error


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a 1 MiB tmpfs (root)")
def test_a_write_into_shared_memory_that_is_full_turns_snapshots_off_instead_of_ending_the_process(tmp_path,
                                                                                                  monkeypatch):
    """The slot's pages are allocated before the copy into its mapping: on a tmpfs too small for the state (a real
    1 MiB tmpfs, as /dev/shm when full) the write fails with the writer's error, the process and the step go on,
    and a state that fits is written there afterwards by a new writer."""
    import subprocess

    monkeypatch.setenv("PODRUN_SNAPSHOT_KEY", "k" * 64)
    mnt = tmp_path / "shm"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mnt)], check=True)
    try:
        w = snapshot.Writer(mnt / "run" / "h1")
        w.submit(1, {"x": torch.zeros(1 << 20)})               # 4 MiB into 1 MiB
        w.wait()
        assert w.error is not None and "No space left" in w.error, w.error
        assert snapshot.held(mnt / "run" / "h1") == []
        w.close()
        w = snapshot.Writer(mnt / "run" / "h1")
        w.submit(2, {"x": torch.ones(1000)})
        w.close()
        assert w.error is None and snapshot.held(mnt / "run" / "h1") == [(2, 0)], w.error
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
