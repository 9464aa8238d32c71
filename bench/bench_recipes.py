"""CPU training throughput per recipe: each recipe's real train.py vs a plain torch loop on the same model.

Both run as fresh processes with 2 threads, one after the other in each repeat (interleaved), at small
image sizes so a step takes well under a second on this machine. The subject is the whole recipe as a
user runs it (its optimiser such as LARS, its schedule, label smoothing, mixup/cutmix, uint8 synthetic
data normalised on the device, metrics); the peer is model + cross-entropy + SGD on a fixed float
batch, the floor any runner pays. Throughput is the median of the per-step images/s after 2 warm-up
steps.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# recipe -> (image size, global batch) small enough for CPU
SIZES = {"resnet18_cifar10": (32, 32), "resnet50": (64, 8), "efficientnet_b4": (64, 8), "vit_b16": (64, 8)}

PLAIN = r"""
import json, sys, time, torch
from podrun import models
from podrun.specs import load_recipe
name, size, batch, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(2); torch.manual_seed(0)
r = load_recipe(name)
kw = {k: v for k, v in (("norm", r.model.norm), ("stem", r.model.stem), ("classifier", r.model.classifier)) if v}
if "image_size" in models.options(r.model.name):
    kw["image_size"] = size
m = models.build(r.model.name, r.dataset.num_classes, **kw)
opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(batch, 3, size, size); y = torch.randint(0, r.dataset.num_classes, (batch,))
rates = []
for _ in range(steps):
    t = time.perf_counter()
    torch.nn.functional.cross_entropy(m(x), y).backward(); opt.step(); opt.zero_grad(set_to_none=True)
    rates.append(batch / (time.perf_counter() - t))
print(json.dumps(rates))
"""


def _recipe_rates(name: str, size: int, batch: int, steps: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, str(ROOT / "recipes" / name / "train.py"), "--data", "synthetic", "--steps", str(steps),
                "--global-batch", str(batch), "--image-size", str(size), "--threads", "2", "--device", "cpu",
                "--eval-every", "0", "--log-every", "1", "--quiet", "--run-dir", tmp, "--no-resume"]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PODRUN_", "RANK", "WORLD_SIZE", "MASTER_"))}
        subprocess.run(argv, check=True, capture_output=True, text=True, timeout=600, env=env, cwd=tmp)
        rows = [json.loads(l) for l in open(Path(tmp) / "metrics.jsonl")]
        return [r["images_per_sec"] for r in rows if r.get("kind") == "step"]


def _plain_rates(name: str, size: int, batch: int, steps: int) -> list[float]:
    out = subprocess.run([sys.executable, "-c", PLAIN, name, str(size), str(batch), str(steps)], check=True,
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(quick: bool) -> list[dict]:
    steps, repeats = (5, 1) if quick else (10, 2)
    names = ["resnet18_cifar10", "vit_b16"] if quick else list(SIZES)
    rows = []
    for name in names:
        size, batch = SIZES[name]
        ours, plain = [], []
        for _ in range(repeats):
            ours += _recipe_rates(name, size, batch, steps)[2:]
            plain += _plain_rates(name, size, batch, steps)[2:]
        a, b = statistics.median(ours), statistics.median(plain)
        rows.append({"benchmark": "CPU train throughput per recipe", "subject": f"{name} train.py",
                     "value": round(a, 2), "peer": "plain torch loop, same model", "peer_value": round(b, 2),
                     "ratio": round(a / b, 3), "unit": "img/s",
                     "note": f"{size} px, batch {batch}, 2 threads, {repeats} x {steps} steps, synthetic data"})
    return rows
