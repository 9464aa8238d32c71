"""podrun.safefs against a second local user (nobody, through setpriv: real files of another owner, real links, a real
FIFO): what it makes is private from its creation, it writes through no link and into no one else's file, and it
trusts no file or directory another user could have written."""
from __future__ import annotations

import os
import stat
import threading
import time

import pytest

from podrun import safefs
from tests.attacker import as_nobody, shared  # noqa: F401


def mode(p) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_a_written_file_is_private_from_its_creation_and_replaces_the_old_inode(tmp_path):
    """While a file is being written, no name in its directory is ever readable by others; the file lands whole
    under a new inode (a handle held on the old file reads the old bytes), with the mode asked for."""
    old_umask = os.umask(0)
    try:
        target = tmp_path / "job.sh"
        target.write_text("old\n")
        os.chmod(target, 0o644)
        held = open(target)                      # noqa: SIM115 - the other user's handle on the earlier file
        seen = set()
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                for n in os.listdir(tmp_path):
                    try:
                        seen.add((n, mode(tmp_path / n)))
                    except FileNotFoundError:
                        pass

        t = threading.Thread(target=watch)
        t.start()
        try:
            for _ in range(20):
                with safefs.replacing(target, "job script") as f:
                    f.write(b"secret\n")
                    time.sleep(0.002)
        finally:
            stop.set()
            t.join()
        assert target.read_text() == "secret\n" and mode(target) == 0o600
        assert held.read() == "old\n"
        assert {m for n, m in seen if n != "job.sh"} <= {0o600}, seen
        assert any(n.startswith(".job.sh.tmp-") for n, _ in seen), seen   # the watcher saw the temp files
        assert sorted(os.listdir(tmp_path)) == ["job.sh"]
        safefs.write_file(target, "x", "job script", mode=0o700)
        assert mode(target) == 0o700
    finally:
        os.umask(old_umask)


def test_no_write_goes_through_a_link_or_into_another_users_file_or_directory(shared):
    """The other user plants a link to a file of ours, pre-creates a file at the name, or owns the directory (0777,
    no sticky bit): each write is refused (UnsafePath, naming the path and the owner) and nothing of ours changes."""
    victim = shared / "victim"
    victim.write_text("mine\n")
    os.chmod(shared, 0o1777)
    as_nobody(f"ln -s {victim} {shared}/link && touch {shared}/theirs && mkdir -m 777 {shared}/open")
    for target, why in ((shared / "link", "symbolic link"), (shared / "theirs", "nobody"),
                        (shared / "open" / "f", "nobody")):
        with pytest.raises(safefs.UnsafePath) as e:
            safefs.write_file(target, "secret", "job script")
        assert str(target.parent if target.parent != shared else target) in e.value.message and why in \
            e.value.message, e.value.message
    assert victim.read_text() == "mine\n" and os.path.getsize(shared / "theirs") == 0
    assert os.listdir(shared / "open") == []
    log = shared / "log"
    log.write_text("first\n")
    os.chmod(log, 0o600)
    with safefs.open_log(log) as f:              # a log of ours is appended to, never written over
        f.write("second\n")
    assert log.read_text() == "first\nsecond\n"
    with pytest.raises(safefs.UnsafePath):       # an append log through the other user's file or link
        safefs.open_private(shared / "theirs")
    with pytest.raises(OSError):
        safefs.open_private(shared / "link")
    os.chmod(victim, 0o600)
    with pytest.raises(safefs.UnsafePath, match="symbolic link"):     # a mode is never set through a link
        safefs.set_mode(shared / "link", 0o666)
    assert victim.read_text() == "mine\n" and mode(victim) == 0o600
    with pytest.raises(safefs.UnsafePath, match="cannot write the job script .*: File name too long"):
        safefs.write_file(shared / ("x" * 250), "secret", "job script")
    safefs.write_file(shared / "ok", "fine", "file")     # a sticky directory of root's: /tmp's rule
    assert (shared / "ok").read_text() == "fine"


def test_directories_are_made_private_or_refused_with_their_owner_and_mode(shared, tmp_path, monkeypatch):
    d = safefs.make_dirs(tmp_path / "a" / "b" / "c", "checkpoint directory")
    assert mode(d) == 0o700 and mode(tmp_path / "a") == 0o755
    os.chmod(d, 0o770)
    with pytest.raises(safefs.UnsafePath) as e:
        safefs.make_dir(d, "checkpoint directory")
    assert "0770" in e.value.message and "others may write" in e.value.message and "chmod" in e.value.hint
    os.chmod(d, 0o750)
    with pytest.raises(safefs.UnsafePath, match="others may read"):
        safefs.make_dir(d, "checkpoint directory")
    assert safefs.make_dir(d, "runs directory", shared_read=True) == d
    as_nobody(f"mkdir -m 700 {shared}/theirs && mkdir -m 777 {shared}/swap && ln -s {shared}/swap {shared}/a")
    with pytest.raises(safefs.UnsafePath, match="nobody"):
        safefs.make_dir(shared / "theirs", "checkpoint directory")
    assert "belongs to nobody" in safefs.dir_problem(shared / "theirs", shared_read=True, root_ok=True)
    with pytest.raises(safefs.UnsafePath, match="symbolic link"):
        safefs.make_dirs(shared / "a" / "b", "checkpoint directory")
    assert os.listdir(shared / "swap") == []
    with pytest.raises(safefs.UnsafePath, match="cannot create the checkpoint directory .*No such file"):
        safefs.make_dir(tmp_path / "missing" / "d", "checkpoint directory")
    t = safefs.make_temp_dir("podrun-t-", str(tmp_path))
    taken = tmp_path / ("podrun-t-" + "00" * 6)                     # a name drawn twice: the next one is drawn
    taken.mkdir()
    draws = iter([b"\0" * 6])
    real = os.urandom
    monkeypatch.setattr(safefs.os, "urandom", lambda n: next(draws, None) or real(n))
    assert safefs.make_temp_dir("podrun-t-", str(tmp_path)) not in (str(taken), t)
    monkeypatch.undo()
    assert mode(t) == 0o700 and os.path.basename(t) != os.path.basename(safefs.make_temp_dir("podrun-t-", str(tmp_path)))


def test_a_trusted_file_is_read_only_when_no_one_else_could_have_written_it(shared, tmp_path):
    ours = tmp_path / "launch.json"
    ours.write_text("{}")
    assert safefs.read_trusted(ours, "launch record", limit=10) == b"{}"
    with pytest.raises(safefs.UnsafePath, match="larger than 1"):
        safefs.read_trusted(ours, "launch record", limit=1)
    os.chmod(ours, 0o666)
    with pytest.raises(safefs.UnsafePath, match="others may change it"):
        safefs.read_trusted(ours, "launch record", limit=10)
    os.chmod(ours, 0o600)
    os.symlink(ours, tmp_path / "link")
    with pytest.raises(safefs.UnsafePath, match="symbolic link"):
        safefs.read_trusted(tmp_path / "link", "launch record", limit=10)
    as_nobody(f"mkdir -m 755 {shared}/run && echo '{{}}' > {shared}/run/launch.json && chmod 644 {shared}/run/launch.json")
    with pytest.raises(safefs.UnsafePath, match="nobody"):
        safefs.read_trusted(shared / "run" / "launch.json", "launch record", limit=10)
    assert "nobody" in safefs.trusted_problem(shared / "run" / "launch.json")
    group = tmp_path / "group"
    group.mkdir()
    (group / "f").write_text("x")
    os.chmod(group, 0o770)
    with pytest.raises(safefs.UnsafePath, match="written by others"):
        safefs.read_trusted(group / "f", "checkpoint", limit=10)
    assert safefs.trusted_problem(ours) is None
    plan = tmp_path / "plan.json"                    # a plan of thousands of hosts is a few MB: read back whole
    plan.write_bytes(b" " * (8 << 20))
    assert len(safefs.read_trusted(plan, "plan", limit=safefs.RECORD_LIMIT)) == 8 << 20


def test_a_file_the_user_names_must_be_a_regular_file_and_is_never_waited_on(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    for path, why in ((fifo, "FIFO"), ("/dev/zero", "device"), (tmp_path, "directory")):
        with pytest.raises(safefs.UnsafePath, match=why):
            safefs.read_user_file(path, "--hostfile", limit=100)
    # a FIFO opened with no writer blocks for ever and /dev/zero never ends: any bound tells a wait from none,
    # and 60 s holds on a loaded machine (the checks themselves are a few system calls)
    assert time.monotonic() - t0 < 60
    with pytest.raises(safefs.UnsafePath, match=r"--hostfile .*missing: cannot read it \(No such file"):
        safefs.read_user_file(tmp_path / "missing", "--hostfile", limit=100)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    with pytest.raises(safefs.UnsafePath, match="larger than 100"):
        safefs.read_user_file(big, "--hostfile", limit=100)
    assert safefs.read_user_file(big, "--hostfile", limit=101) == b"x" * 101


def test_a_directory_of_the_other_user_on_the_way_is_refused_whatever_its_mode(shared):
    """A directory of the other user on the way (mode 0755: no one else may write it, but its owner may swap what is
    in it) makes every path below it untrusted: a run's directory made there, a trusted file read there, a recipe
    found there; this user's own directory of the same mode is fine."""
    as_nobody(f"mkdir -m 755 {shared}/theirs")
    below = shared / "theirs" / "mine"
    below.mkdir(mode=0o755)                  # root may create in it; the other user may still rename it away
    (below / "f.json").write_text("{}")
    assert "theirs belongs to nobody" in (safefs.ancestor_problem(below / "runs") or "")
    with pytest.raises(safefs.UnsafePath, match="theirs belongs to nobody"):
        safefs.make_dirs(below / "runs" / "r1", "run directory")
    with pytest.raises(safefs.UnsafePath, match="theirs belongs to nobody"):
        safefs.read_trusted(below / "f.json", "plan", limit=100)
    assert "theirs belongs to nobody" in (safefs.input_problem(below / "f.json") or "")
    mine = shared / "mine"
    mine.mkdir(mode=0o755)
    (mine / "f.json").write_text("{}")
    assert safefs.ancestor_problem(mine / "runs") is None and safefs.input_problem(mine / "f.json") is None
    assert safefs.read_trusted(mine / "f.json", "plan", limit=100) == b"{}"
