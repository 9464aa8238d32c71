"""torchrun's command line under `podrun launch`, against real torchrun on the same script: the canonical DDP
script of docs/launch.md gives the same output and torch variables, and torchrun's options mean the same
workers, ranks and env (the table in docs/launch.md)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from podrun.wire.worker_env import TORCHRUN_NAMES
from tests.harness.podrun_proc import PODRUN
from tests.ports import free_port

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
PREFIX = re.compile(r"^\[\d+(:\d+)? [^\]]+\] ")       # podrun's [instance:local_rank host] on each worker line
# the canonical script's two lines per rank (variable names are upper case, so a following "rank" ends a record)
RECORD = re.compile(r"rank \d+/\d+ local \d+: weights sum [0-9.]+\d|rank \d+: launcher set [A-Z0-9_ ]*[A-Z0-9_]")


def _canonical_script() -> str:
    """The DDP script as docs/launch.md shows it (the test runs what the docs show)."""
    text = (ROOT / "docs" / "launch.md").read_text(encoding="utf-8")
    after = text[text.index("**The canonical DDP script.**"):]
    return after[after.index("```python\n") + len("```python\n"):after.index("\n```", after.index("```python"))] + "\n"


def _base_env(**extra) -> dict[str, str]:
    """This environment less any launcher's variables, so each launcher's own are what the workers see."""
    env = {k: v for k, v in os.environ.items()
           if k not in TORCHRUN_NAMES and not k.startswith(("PODRUN_", "TORCHELASTIC_"))
           and k not in ("OMP_NUM_THREADS", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "PYTHONUNBUFFERED")}
    return {**env, **extra}


def _run(argv, cwd, env, timeout=240) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def torchrun(*args, cwd, env):
    return _run([sys.executable, "-m", "torch.distributed.run", *args], cwd, env)


def podrun(*args, cwd, env):
    return _run([*PODRUN, "launch", *args], cwd, env)


def test_canonical_ddp_script_same_output_and_env_keys_as_torchrun(tmp_path):
    """`podrun launch --no-prefix --nproc-per-node 2 ddp.py` and `torchrun --nproc-per-node 2 ddp.py`: the same
    lines (no [instance:rank host] prefix), which include each rank's sorted torch variable names."""
    (tmp_path / "ddp.py").write_text(_canonical_script())
    env = _base_env()
    # a free port, not torchrun's 29500, which other runs on this machine may hold; the names are compared
    tr = torchrun("--master-port", str(free_port(2)), "--nproc-per-node", "2", "ddp.py", cwd=tmp_path, env=env)
    assert tr.returncode == 0, tr.stdout + tr.stderr
    pr = podrun("--runs-dir", str(tmp_path / "runs"), "--no-prefix", "--nproc-per-node", "2", "ddp.py", cwd=tmp_path,
                env=env)
    assert pr.returncode == 0, pr.stdout + pr.stderr
    # torchrun's workers share one pipe, so one rank's line can be split by another's ("...11.715523rank 1/2
    # ...", then an empty line): its lines are read back as records; podrun's must be whole lines already
    tr_lines = sorted(RECORD.findall(tr.stdout))
    pr_lines = sorted(pr.stdout.splitlines())
    assert len(tr_lines) == 4 and any("launcher set" in line and "TORCHELASTIC_RUN_ID" in line for line in tr_lines)
    assert pr_lines == tr_lines


def _dumps(d: Path, n: int) -> list[dict[str, str]]:
    files = sorted(d.glob("*.json"), key=lambda p: int(p.stem))
    assert [int(p.stem) for p in files] == list(range(n)), files
    return [json.loads(p.read_text()) for p in files]


SAME = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
        "ROLE_WORLD_SIZE", "TORCHELASTIC_MAX_RESTARTS")


def test_rendezvous_run_id_log_dir_and_module_rows(tmp_path):
    """--nnodes 1 --nproc-per-node 2 --rdzv-endpoint 127.0.0.1:P --rdzv-id ID --max-restarts 1 --log-dir D -m MODULE,
    under both: the same workers and ranks, MASTER_ADDR/MASTER_PORT from the endpoint, TORCHELASTIC_RUN_ID the
    id, the restarts; podrun's logs under D/ID-TIMESTAMP, as torchrun's under D/ID_RANDOM."""
    tr_dir, pr_dir = tmp_path / "tr", tmp_path / "pr"
    tr_dir.mkdir()
    pr_dir.mkdir()
    port = free_port(2)
    common = ["--nnodes", "1", "--nproc-per-node", "2", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "job7",
              "--max-restarts", "1"]
    env = _base_env(PYTHONPATH=str(ROOT))
    tr = torchrun(*common, "--log-dir", str(tmp_path / "trlogs"), "-m", "tests.runtime.env_dump", cwd=tmp_path,
                  env={**env, "ENV_DUMP_DIR": str(tr_dir)})
    assert tr.returncode == 0, tr.stdout + tr.stderr
    pr = podrun(*common, "--log-dir", str(tmp_path / "prlogs"), "-m", "tests.runtime.env_dump", cwd=tmp_path,
                env={**env, "ENV_DUMP_DIR": str(pr_dir)})
    assert pr.returncode == 0, pr.stdout + pr.stderr
    for t, p in zip(_dumps(tr_dir, 2), _dumps(pr_dir, 2)):
        for k in SAME:
            assert p[k] == t[k], (k, t[k], p[k])
        assert (t["MASTER_ADDR"], t["MASTER_PORT"]) == (p["MASTER_ADDR"], p["MASTER_PORT"]) == ("127.0.0.1", str(port))
        assert t["TORCHELASTIC_RUN_ID"] == p["TORCHELASTIC_RUN_ID"] == "job7"
        assert t["TORCHELASTIC_MAX_RESTARTS"] == "1"
    (run_dir,) = (tmp_path / "prlogs").iterdir()
    assert run_dir.name.startswith("job7-")     # no instance-0.log: the module prints nothing, and no note is due
    assert json.loads((run_dir / "summary.json").read_text())["max_restarts"] == 1
    assert any(p.name.startswith("job7") for p in (tmp_path / "trlogs").iterdir())


def test_standalone_nproc_auto_cpu_streams_and_no_python_rows(tmp_path):
    """torchrun --standalone --nproc-per-node cpu against podrun --standalone --nproc-per-node auto --tee 3
    --redirects 0 and podrun --nproc-per-node cpu --no-python PYTHON SCRIPT: one node, one worker per core of this
    machine (torchrun's auto is cpu without an accelerator), the same ranks; podrun's port is picked for the run."""
    dump = str(ROOT / "tests" / "runtime" / "env_dump.py")
    dirs = {k: tmp_path / k for k in ("tr", "auto", "cpu")}
    for d in dirs.values():
        d.mkdir()
    tr = torchrun("--standalone", "--nproc-per-node", "cpu", dump, cwd=tmp_path,
                  env=_base_env(ENV_DUMP_DIR=str(dirs["tr"])))
    assert tr.returncode == 0, tr.stdout + tr.stderr
    n = len(list(dirs["tr"].glob("*.json")))
    assert n == (os.cpu_count() or 1)
    runs = {"auto": ["--standalone", "--nproc-per-node", "auto", "--tee", "3", "--redirects", "0", dump],
            "cpu": ["--nproc-per-node", "cpu", "--no-python", sys.executable, dump]}
    for name, args in runs.items():
        pr = podrun("--runs-dir", str(tmp_path / f"runs-{name}"), *args, cwd=tmp_path,
                    env=_base_env(ENV_DUMP_DIR=str(dirs[name])))
        assert pr.returncode == 0, pr.stdout + pr.stderr
        for t, p in zip(_dumps(dirs["tr"], n), _dumps(dirs[name], n)):
            for k in SAME:
                assert p[k] == t[k], (name, k, t[k], p[k])
            assert p["MASTER_PORT"] not in ("0", "29500"), p["MASTER_PORT"]      # a port picked for the run


TUTORIAL = ROOT / "tests" / "launch" / "scripts" / "ddp_tutorial"
# the tutorial's two kinds of line: "[GPU0] Epoch 0 | Batchsize: 32 | Steps: 32" and "Epoch 0 | Training snapshot
# saved at snapshot.pt" (torchrun's workers share one pipe: its lines are read back as records)
TUTORIAL_RECORD = re.compile(r"\[GPU\d+\] Epoch \d+ \| Batchsize: \d+ \| Steps: \d+|Epoch \d+ \| Training snapshot "
                             r"saved at snapshot\.pt")


def _tutorial_dir(path: Path) -> Path:
    path.mkdir()
    (path / "multinode.py").write_text((TUTORIAL / "multinode.py").read_text())
    return path


def test_ddp_tutorial_multinode_command_runs_as_under_torchrun_and_its_rdzv_id_twice(tmp_path):
    """The DDP tutorial's command (pytorch/examples distributed/ddp-tutorial-series; multinode.py here is a CPU
    stand-in with the tutorial's command line and lines, see its docstring), `--nnodes=1 --nproc_per_node=2 --rdzv_id=456 --rdzv_backend=c10d --rdzv_endpoint=localhost:P
    multinode.py 2 1`, under torchrun and podrun: the same lines. Run again with the same --rdzv_id it runs again
    (a rendezvous id is not a run directory's name): two run directories 456-..."""
    tr_dir, pr_dir = _tutorial_dir(tmp_path / "tr"), _tutorial_dir(tmp_path / "pr")
    runs = tmp_path / "runs"

    def args():
        return ["--nnodes=1", "--nproc_per_node=2", "--rdzv_id=456", "--rdzv_backend=c10d",
                f"--rdzv_endpoint=localhost:{free_port(2)}", "multinode.py", "2", "1"]

    env = _base_env()
    tr = torchrun(*args(), cwd=tr_dir, env=env)
    assert tr.returncode == 0, tr.stdout + tr.stderr
    pr = podrun("--runs-dir", str(runs), *args(), cwd=pr_dir, env=env)
    assert pr.returncode == 0, pr.stdout + pr.stderr
    tr_lines = sorted(TUTORIAL_RECORD.findall(tr.stdout))
    pr_lines = sorted(PREFIX.sub("", line) for line in pr.stdout.splitlines())
    assert len(tr_lines) == 6 and "[GPU1] Epoch 1 | Batchsize: 32 | Steps: 32" in tr_lines, tr_lines
    assert pr_lines == tr_lines
    again = podrun("--runs-dir", str(runs), *args(), cwd=pr_dir, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "Resuming training from snapshot at Epoch 1" in again.stdout
    dirs = sorted(p.name for p in runs.iterdir())
    assert len(dirs) == 2 and all(d.startswith("456-") for d in dirs), dirs


def test_pet_variables_rdzv_backend_role_and_rdzv_id_as_torchrun(tmp_path):
    """torchrun reads each option from PET_<NAME>, a flag winning over its variable. PET_NPROC_PER_NODE=1 with
    --standalone: one worker under both. PET_NPROC_PER_NODE=3 PET_ROLE=trainer PET_MAX_RESTARTS=1 with
    --nproc_per_node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:P --rdzv-id 456: two workers, ROLE_NAME
    trainer, one restart, TORCHELASTIC_RUN_ID 456, MASTER_ADDR the endpoint's host, under both."""
    dump = str(ROOT / "tests" / "runtime" / "env_dump.py")
    cases = {
        "one": ({"PET_NPROC_PER_NODE": "1"}, ["--standalone"]),
        "two": ({"PET_NPROC_PER_NODE": "3", "PET_ROLE": "trainer", "PET_MAX_RESTARTS": "1"},
                ["--nproc_per_node", "2", "--rdzv-backend", "c10d", "--rdzv-id", "456"]),
    }
    for name, (pet, args) in cases.items():
        out = {}
        for who, run in (("tr", torchrun), ("pr", podrun)):
            d = tmp_path / f"{name}-{who}"
            d.mkdir()
            extra = [] if name == "one" else ["--rdzv-endpoint", f"127.0.0.1:{free_port(2)}"]
            pre = ["--runs-dir", str(tmp_path / "runs")] if who == "pr" else []
            res = run(*pre, *args, *extra, dump, cwd=tmp_path, env=_base_env(ENV_DUMP_DIR=str(d), **pet))
            assert res.returncode == 0, (name, who, res.stdout + res.stderr)
            out[who] = _dumps(d, 1 if name == "one" else 2)
        for t, p in zip(out["tr"], out["pr"]):
            for k in (*SAME, "ROLE_NAME"):
                assert p[k] == t[k], (name, k, t[k], p[k])
            if name == "two":
                assert t["ROLE_NAME"] == "trainer" and t["TORCHELASTIC_MAX_RESTARTS"] == "1"
                assert p["TORCHELASTIC_RUN_ID"] == t["TORCHELASTIC_RUN_ID"] == "456"
                # torchrun's c10d gives the workers another free port on the endpoint's host; podrun's workers
                # meet at the endpoint itself (docs/launch.md)
                assert p["MASTER_ADDR"] == "127.0.0.1"


def test_run_path_and_local_ranks_filter_as_torchrun(tmp_path):
    """`--nproc-per-node 3 --local-ranks-filter 0,2 --run-path /abs/lr.py`: the console shows local ranks 0 and 2,
    both streams, under both; podrun's run directory keeps rank 1's lines."""
    script = tmp_path / "lr.py"
    script.write_text("import os, sys\nprint('out', os.environ['LOCAL_RANK'], flush=True)\n"
                      "print('err', os.environ['LOCAL_RANK'], file=sys.stderr, flush=True)\n")
    args = ["--nproc-per-node", "3", "--local-ranks-filter", "0,2", "--run-path", str(script)]
    tr = torchrun("--master-port", str(free_port(2)), *args, cwd=tmp_path, env=_base_env())
    assert tr.returncode == 0, tr.stdout + tr.stderr
    pr = podrun("--runs-dir", str(tmp_path / "runs"), "--run-id", "r", *args, cwd=tmp_path, env=_base_env())
    assert pr.returncode == 0, pr.stdout + pr.stderr
    shown = re.compile(r"^(?:out|err) \d$", re.M)
    tr_lines = sorted(shown.findall(tr.stdout + tr.stderr))
    pr_lines = sorted(shown.findall("\n".join(PREFIX.sub("", line) for line in (pr.stdout + pr.stderr).splitlines())))
    assert tr_lines == ["err 0", "err 2", "out 0", "out 2"]
    assert pr_lines == tr_lines
    assert "out 1" in (tmp_path / "runs" / "r" / "instance-0.log").read_text()


STREAMS = 'import os, sys\nprint("out", os.environ["RANK"], flush=True)\nprint("err", os.environ["RANK"], file=sys.stderr)\n'


def _rank_files(log_dir: Path) -> dict[str, str]:
    """attempt_N/RANK/stdout.log|stderr.log under the one run directory in ``log_dir`` -> its text."""
    (run,) = [d for d in log_dir.iterdir() if d.is_dir()]
    return {str(f.relative_to(run)): f.read_text() for f in sorted(run.glob("attempt_*/*/*.log"))}


def test_log_dir_redirects_and_tee_lay_out_each_ranks_streams_as_torchrun(tmp_path):
    """--log-dir D --redirects 1 --tee 2 under both: each rank's stdout only in D/RUN/attempt_0/RANK/stdout.log (off
    the console), its stderr in stderr.log and on the console; the same files with the same lines."""
    (tmp_path / "streams.py").write_text(STREAMS)
    args = ["--nproc-per-node", "2", "--redirects", "1", "--tee", "2", "streams.py"]
    tr = torchrun("--standalone", "--log-dir", str(tmp_path / "tr"), *args, cwd=tmp_path, env=_base_env())
    assert tr.returncode == 0, tr.stdout + tr.stderr
    pr = podrun("--standalone", "--log-dir", str(tmp_path / "pr"), *args, cwd=tmp_path, env=_base_env())
    assert pr.returncode == 0, pr.stdout + pr.stderr
    files = _rank_files(tmp_path / "tr")
    assert files == _rank_files(tmp_path / "pr") and files["attempt_0/1/stdout.log"] == "out 1\n", files
    assert "out" not in tr.stdout + pr.stdout
    assert sorted(re.findall(r"err \d", tr.stderr)) == sorted(re.findall(r"err \d", pr.stderr)) == ["err 0", "err 1"]
