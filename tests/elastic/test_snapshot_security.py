"""No way in through the in-memory snapshots for another local user: real `podrun launch` runs (local transport,
one worker that restores at the start of each attempt and fails once) against a second user (nobody, via setpriv)
who plants the run's snapshot directories, or a symbolic link in their place, holding a slot whose pickle calls
os.system and whose header says update 999999; and slots changed between two attempts, refused by their MAC.

The tests give the run its snapshot key (--env PODRUN_SNAPSHOT_KEY, which replaces the one podrun makes) so that
the attacker can be handed the directory's name, which without the key cannot be known in advance; the planted
files sit also where a run keeps them without a key-derived name (/dev/shm/podrun-<run id>/<host>).
"""
from __future__ import annotations

import io
import os
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.attacker import AS_NOBODY, require_second_user
from tests.launch.helpers import podrun
from tests.ports import free_port

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]
VICTIM = str(Path(__file__).with_name("snapshot_victim.py"))
HOST = "localhost"


def as_attacker(script: str, data: bytes = b"") -> None:
    """Run ``script`` (sh) as uid/gid 65534 (nobody), ``data`` on its stdin; fails (never skips) when this machine
    cannot act as that second user."""
    require_second_user()
    cp = subprocess.run([*AS_NOBODY, "sh", "-c", script], input=data, capture_output=True, cwd="/", timeout=60,
                        check=False)
    assert cp.returncode == 0, cp.stderr.decode()


def evil_slot(marker: Path) -> tuple[bytes, bytes]:
    """(data, header) of a slot whose data is a torch.save pickle that runs ``touch MARKER`` when unpickled, its
    header naming update 999999 (with a made-up MAC)."""
    import json

    import torch

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {shlex.quote(str(marker))}",))

    buf = io.BytesIO()
    torch.save({"w": Evil(), "step": 999999}, buf)
    data = buf.getvalue()
    header = json.dumps({"step": 999999, "bytes": len(data), "kind": "torch", "mac": "poly1305",
                         "nonce": "0" * 32, "tag": "0" * 32}).encode()
    return data, header


def run_dirs(run_id: str, key: str) -> list[str]:
    """The run-level snapshot directories an attacker would plant: the key-derived one, and the one a run keeps
    without a key-derived name."""
    from podrun.wire import worker_env as penv

    dirs = [os.path.join("/dev/shm", f"podrun-{run_id}")]
    try:
        dirs.append(os.path.dirname(penv.snapshot_dir(run_id, HOST, key)))
    except TypeError:
        pass
    return dirs


def plant(target_dir: str, marker: Path) -> None:
    """As the attacker: ``target_dir``/HOST (both made by the attacker, open to all) with slot 0 = the evil slot."""
    data, header = evil_slot(marker)
    host = f"{target_dir}/{HOST}"
    q = shlex.quote
    as_attacker(f"mkdir -m 777 {q(target_dir)} {q(host)} && cat > {q(host)}/slot-0.pt && "
                f"cp {q(host)}/slot-0.pt {q(host)}/slot-0.bin && chmod 644 {q(host)}/slot-0.*", data)
    as_attacker(f"cat > {q(host)}/slot-0.json && chmod 644 {q(host)}/slot-0.json", header)


def launch(tmp_path: Path, run_id: str, key: str):
    return podrun("launch", "--hosts", HOST, "--devices-per-host", "1", "--max-restarts", "1", "--run-id", run_id,
                  "--runs-dir", str(tmp_path / "runs"), "--master-port", str(free_port(6)),
                  "--env", f"PODRUN_SNAPSHOT_KEY={key}", "--", sys.executable, VICTIM, timeout=240)


@pytest.fixture
def planted():
    """Removes what the attacker left in /dev/shm (the tests plant under names with a fresh run id)."""
    made: list[str] = []
    yield made
    for p in made:
        if os.path.islink(p):
            os.unlink(p)
        elif os.path.isdir(p):
            shutil.rmtree(p, ignore_errors=True)


@pytest.mark.parametrize("how", ["directories", "symlink"])
def test_planted_snapshot_directories_run_no_code_and_restore_nothing(tmp_path, planted, how):
    run_id, key = f"sec-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    marker = tmp_path / "planted-code-ran"
    targets = run_dirs(run_id, key)
    planted.extend(targets)
    for d in targets:
        if how == "directories":
            plant(d, marker)
        else:                          # the run's directory is a link to the attacker's, which holds the slot
            lure = f"/dev/shm/lure-{uuid.uuid4().hex[:8]}"
            planted.append(lure)
            plant(lure, marker)
            as_attacker(f"ln -s {shlex.quote(lure)} {shlex.quote(d)}")
    cp = launch(tmp_path, run_id, key)
    assert not marker.exists(), "the planted pickle ran"
    assert "999999" not in cp.stdout, cp.stdout
    assert cp.returncode == 0, cp.stderr
    # snapshots off on both attempts: the restart resumes from the disk checkpoint (update 1)
    assert "restored nothing" in cp.stdout and "restored 1 from checkpoint" in cp.stdout, cp.stdout + cp.stderr
    ours = targets[-1]
    owner = "nobody" if how == "directories" else "a symbolic link"
    assert f"snapshot directory {ours}" in cp.stderr and owner in cp.stderr and "uid 65534" in cp.stderr, cp.stderr
    for d in targets:                  # the other user's files are left alone
        host = Path(d) / HOST
        assert (host / "slot-0.json").exists() and os.lstat(d).st_uid == 65534, d


def test_a_slot_changed_between_attempts_is_refused_by_its_mac_and_the_checkpoint_used(tmp_path):
    """The victim script run as two attempts of one worker (the env contract set here, as the agent sets it), its
    two slots changed by one bit each in between: the second attempt refuses both, each in one line naming the
    slot, and resumes from the disk checkpoint."""
    from podrun.rundir.layout import snapshot_dir

    key = uuid.uuid4().hex
    host_dir = Path(snapshot_dir(f"sec-{uuid.uuid4().hex[:8]}", HOST, key))
    env = {**os.environ, "PODRUN_SNAPSHOT_KEY": key, "PODRUN_SNAPSHOT_DIR": str(host_dir),
           "PODRUN_RUN_DIR": str(tmp_path), "PODRUN_NUM_REPLICAS": "1", "RANK": "0", "WORLD_SIZE": "1",
           "LOCAL_RANK": "0",
           "PYTHONPATH": os.pathsep.join([str(Path(VICTIM).parents[2]), os.environ.get("PYTHONPATH", "")])}
    try:
        first = subprocess.run([sys.executable, VICTIM], env={**env, "PODRUN_RESTART_COUNT": "0"},
                               capture_output=True, text=True, timeout=120, check=False)
        assert first.returncode == 3 and "restored nothing" in first.stdout, first.stderr
        slots = sorted(host_dir.glob("slot-*.bin"))
        assert len(slots) == 2, slots
        assert {s.stat().st_mode & 0o777 for s in slots} == {0o600}
        assert {p.stat().st_mode & 0o777 for p in (host_dir, host_dir.parent)} == {0o700}
        for s in slots:                # one bit of each slot's last byte (a tensor's)
            data = bytearray(s.read_bytes())
            data[-1] ^= 1
            s.write_bytes(bytes(data))
        second = subprocess.run([sys.executable, VICTIM], env={**env, "PODRUN_RESTART_COUNT": "1"},
                                capture_output=True, text=True, timeout=120, check=False)
    finally:
        from podrun.runtime import snapshot

        snapshot.remove(host_dir)
    assert second.returncode == 0, second.stderr
    for s in slots:
        assert f"snapshot slot {s} " in second.stderr and "does not match its MAC" in second.stderr, second.stderr
    assert "restored 1 from checkpoint" in second.stdout, (second.stdout, second.stderr)


def test_the_run_key_reaches_the_workers_and_no_record_or_dry_run_shows_it(tmp_path):
    """One key per run, the same on every attempt, in every worker's environment; the run directory's files and
    --dry-run show its name with <redacted>, never its value."""
    seen = tmp_path / "keys"
    code = ("import os, sys; e = os.environ; "
            f"open({str(seen)!r}, 'a').write(e['PODRUN_SNAPSHOT_KEY'] + ' ' + e['PODRUN_SNAPSHOT_DIR'] + '\\n'); "
            "sys.exit(3 if e['PODRUN_RESTART_COUNT'] == '0' else 0)")
    args = ["launch", "--hosts", "localhost,127.0.0.2", "--devices-per-host", "1", "--max-restarts", "1",
            "--runs-dir", str(tmp_path / "runs"), "--master-port", str(free_port(6)), "--", sys.executable, "-c", code]
    cp = podrun(*args, timeout=240)
    assert cp.returncode == 0, cp.stderr
    lines = seen.read_text().split("\n")[:-1]
    assert len(lines) == 4, lines                         # 2 hosts x 2 attempts
    keys = {ln.split()[0] for ln in lines}
    assert len(keys) == 1 and len(next(iter(keys))) == 64, keys
    key = keys.pop()
    run = next((tmp_path / "runs").iterdir())
    for f in run.rglob("*"):
        if f.is_file():
            assert key not in f.read_text(errors="replace"), f
    assert "PODRUN_SNAPSHOT_KEY" in (run / "env.json").read_text()
    assert key not in cp.stdout + cp.stderr
    dry = podrun(*args[:1], "--dry-run", *args[1:], timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert "PODRUN_SNAPSHOT_KEY=<redacted>" in dry.stdout or '"PODRUN_SNAPSHOT_KEY": "<redacted>"' in dry.stdout, \
        dry.stdout
    assert not any(len(w) == 64 and all(c in "0123456789abcdef" for c in w)
                   for w in dry.stdout.replace("=", " ").replace('"', " ").split()), dry.stdout
