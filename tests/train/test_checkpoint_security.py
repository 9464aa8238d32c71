"""No way in through the checkpoints for another local user (nobody, via setpriv): a checkpoint directory that user
made, one a group or others may write, or a link of theirs is refused before training with nothing written into it;
links planted at the names a save or a record used to write through are never followed; a checkpoint file of
theirs in our directory, sealed with podrun's unkeyed digest, is never resumed from, and the run says why."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from podrun.train import checkpoint as ckpt
from podrun.rundir.metrics import read_metrics
from tests.attacker import NOBODY, as_nobody, require_second_user, shared  # noqa: F401
from tests.train.train_procs import WORKER, outside_env, train_opts

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]
HOST = socket.gethostname()


def _opts(run_dir, **kw) -> dict:
    return train_opts(run_dir, **{"steps": 4, "seed": 5, "checkpoint_every": 2, **kw})


def _run(opts: dict) -> tuple[int, str]:
    """One real worker (world 1) training the tiny model of tests/train/worker.py; (exit code, its output)."""
    cp = subprocess.run([sys.executable, str(WORKER), json.dumps(opts)], env=outside_env(OMP_NUM_THREADS="1"),
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    return cp.returncode, cp.stdout


def test_a_checkpoint_dir_another_user_made_or_may_write_is_refused_with_nothing_written(tmp_path, shared):
    require_second_user()
    theirs, ours, link = shared / "theirs", shared / "ours", shared / "link"
    as_nobody(f"mkdir -m 777 {theirs} && ln -s {theirs} {link}")
    ours.mkdir(mode=0o700)
    os.chmod(ours, 0o770)                          # a group project directory: the group may write
    for d, why in ((theirs, "belongs to nobody (uid 65534)"), (ours, "(owner root (uid 0)) is mode 0770"),
                   (link, "is a symbolic link (owner nobody (uid 65534))")):
        run_dir = tmp_path / d.name
        rc, out = _run(_opts(run_dir, checkpoint_dir=str(d)))
        assert rc == 2 and "Traceback" not in out, out[-3000:]
        line = next((ln for ln in out.splitlines() if "refusing the checkpoint directory" in ln), out[-3000:])
        assert f"{d} {why}" in line and "chmod go-w" in out, line
        assert os.listdir(d) == [], f"written into {d}: {os.listdir(d)}"
        assert not (run_dir / "metrics.jsonl").exists(), "the refused run trained"


def test_links_planted_where_a_save_or_a_record_wrote_are_never_followed(tmp_path, shared):
    """Our private directory, open to others for a moment: nobody plants links to a file of ours at the temporary
    names checkpoint.save took (.ckpt-<step>.pt.tmp-<host>-<pid>, the pid public in /proc), at config.json's
    temporary name and at metrics.jsonl. The file is never written; the checkpoints and config.json land."""
    import torch

    from podrun.errors import PodrunError
    from podrun.train.config import TrainConfig, write_config
    from podrun.rundir.metrics import MetricsWriter

    victim = tmp_path / "victim"
    victim.write_bytes(b"the user's own file\n")
    d = shared / "ck"
    d.mkdir(mode=0o700)
    os.chmod(d, 0o777)
    names = [f".ckpt-{step:09d}.pt.tmp-{HOST}-{os.getpid()}" for step in (1, 2)] + ["config.json.tmp",
                                                                                   "metrics.jsonl"]
    as_nobody(" && ".join(f"ln -s {victim} {d / n}" for n in names))
    os.chmod(d, 0o700)
    for step in (1, 2):
        saved = ckpt.save({"step": step, "w": torch.full((1000,), float(step))}, d, step, keep=2)
        assert saved.is_file() and not saved.is_symlink() and os.stat(saved).st_mode & 0o777 == 0o600
    write_config(d, TrainConfig(), {})
    assert not (d / "config.json").is_symlink() and json.loads((d / "config.json").read_text())["config"]
    with pytest.raises(PodrunError, match="metrics.jsonl is a symbolic link"):
        MetricsWriter(d, console=False)            # refused, never appended through
    assert victim.read_bytes() == b"the user's own file\n"
    found, bad = ckpt.newest_good(d)
    assert found is not None and found[1]["step"] == 2 and bad == [], bad


def test_a_checkpoint_file_of_another_user_is_never_resumed_from(tmp_path):
    """The newest checkpoint, a valid one with podrun's (unkeyed) digest, handed to nobody in our private
    directory: the resume passes over it saying why, on the console and in its record, and takes the one before."""
    require_second_user()
    run_dir = tmp_path / "r"
    rc, out = _run(_opts(run_dir))
    assert rc == 0, out[-3000:]
    older, newest = ckpt.list_checkpoints(run_dir / "checkpoints")
    assert ckpt.verify(newest.read_bytes()) is None
    os.chown(newest, NOBODY, NOBODY)
    rc, out = _run(_opts(run_dir, steps=2))        # resumes at the end of its steps: the final save, no training
    assert rc == 0, out[-3000:]
    assert f"checkpoint {newest} passed over: not trusted: {newest} belongs to nobody (uid 65534)" in out, out[-3000:]
    resume = [r for r in read_metrics(run_dir) if r.get("event") == "resume"][-1]
    assert resume["step"] == 2 and resume["path"] == str(older), resume
    assert [r["path"] for r in resume["rejected"]] == [str(newest)] and "nobody" in resume["rejected"][0]["why"]
