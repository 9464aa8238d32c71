"""A worker script the tests start as real processes (torchrun-style env): a tiny GroupNorm CNN through podrun.train."""
from __future__ import annotations

import json
import sys

import torch
from torch import nn


def tiny_gn_net(num_classes: int = 10) -> nn.Module:
    """Two convs with GroupNorm (batch-independent) and a linear head; ~5k parameters."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.GroupNorm(4, 32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes),
    )


def main() -> int:
    """One run's options (a JSON object), or several runs one after another in this process (a JSON list: each
    after the first names the free port its process group meets on, "master_port")."""
    import os

    from podrun.errors import PodrunError
    from podrun.train import TrainConfig, train

    given = json.loads(sys.argv[1])
    for opts in given if isinstance(given, list) else [given]:
        if "master_port" in opts:
            os.environ["MASTER_PORT"] = str(opts.pop("master_port"))
        model = opts.pop("model", "tiny")
        cfg = TrainConfig(model=tiny_gn_net if model == "tiny" else model, **opts)
        try:
            summary = train(cfg)
        except PodrunError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            return exc.exit_code
        print("SUMMARY " + json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main())
