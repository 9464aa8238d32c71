"""Contract test of the IPU path against a FAKE poptorch (tests/train/fake_poptorch; poptorch is not on PyPI):
one worker per instance, poptorch options from the env contract, uint8 in, one call per weight update, the data
through poptorch's DataLoader in async mode with podrun's global batches."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch


HERE = Path(__file__).parent
WORKER = HERE / "worker.py"


@pytest.mark.timeout(90)
def test_fake_poptorch_contract_two_instances_worth_of_env_and_its_async_dataloader(tmp_path):
    log = tmp_path / "poptorch.jsonl"
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PODRUN_", "SLURM_", "OMPI_", "PMI_", "POPDIST_"))
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    # instance 1 of 2 on an IPU plan: 8 replicas, 4 per instance, local batch 2, GA 3 (global 48)
    env.update(PYTHONPATH=os.pathsep.join([str(HERE / "fake_poptorch"), env.get("PYTHONPATH", "")]),
               FAKE_POPTORCH_LOG=str(log), OMP_NUM_THREADS="1",
               PODRUN_NUM_INSTANCES="2", PODRUN_INSTANCE_INDEX="1", PODRUN_NUM_REPLICAS="8",
               PODRUN_LOCAL_REPLICAS="4", PODRUN_REPLICA_OFFSET="4", PODRUN_DEVICES_PER_REPLICA="1",
               PODRUN_LOCAL_BATCH="2", PODRUN_GRAD_ACCUM="3", PODRUN_GLOBAL_BATCH="48",
               RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", GROUP_RANK="1",
               POPDIST_NUM_INSTANCES="2", POPDIST_INSTANCE_INDEX="1")
    opts = dict(data="digits", image_size=8, num_classes=10, steps=3, lr=0.1, optimizer="lars", run_dir=str(run),
                console=False, checkpoint_every=0, eval_every=0)
    out = subprocess.run([sys.executable, str(WORKER), json.dumps(opts)], env=env, capture_output=True,
                         text=True, timeout=80)
    assert out.returncode == 0, out.stdout + out.stderr
    calls = [json.loads(l) for l in log.read_text().splitlines()]
    made = [c for c in calls if c["call"] == "trainingModel"][0]
    assert made["options"]["replication_factor"] == 4
    assert made["options"]["gradient_accumulation"] == 3
    assert made["options"]["process"] == [1, 2]
    assert made["optimizer"] == "SGD"                 # no LARS in poptorch: SGD with the same momentum
    runs = [c for c in calls if c["call"] == "run"]
    assert len(runs) == 3
    assert all(r["batch"] == [2 * 3 * 4, 3, 8, 8] and r["dtype"] == "uint8" and r["micro"] == 2 for r in runs)
    # poptorch's own DataLoader in async mode reads the instance's whole step a call, not partitioned again
    (dl,) = [c for c in calls if c["call"] == "DataLoader"]
    assert (dl["mode"], dl["batch_size"], dl["combined"], dl["shuffle"], dl["auto_distributed_partitioning"]) == \
        ("async", 2, 2 * 3 * 4, False, False), dl
    # ... of the same samples in the same order as podrun's Loader for this instance (replicas 4-7 of 8)
    from podrun.train.config import TrainConfig
    from podrun.train.data import Loader, Shard, digits

    expected = []
    for _, _, micro in Loader(digits(8)[0], Shard(local_batch=2, grad_accum=3, replicas=8, replica_offset=4,
                                                  local_replicas=4), seed=TrainConfig.seed, prefetch=0):
        x, y = torch.cat([m[0] for m in micro]), torch.cat([m[1] for m in micro])
        expected.append((int(x.long().sum()), y.tolist()))
        if len(expected) == 3:
            break
    assert [(r["checksum"], r["labels"]) for r in runs] == expected
    assert [c["call"] for c in calls][-2:] == ["copyWeightsToHost", "detachFromDevice"]
    summary = json.loads(out.stdout.split("SUMMARY ", 1)[1])
    assert summary["global_batch"] == 48 and summary["replicas"] == 8
    # instance 1 is not the main instance: it writes no metrics (instance 0 does)
    assert not (run / "metrics.jsonl").exists()
