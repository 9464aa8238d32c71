"""The recipes' runner (podrun.train) on a tiny GroupNorm CNN where rank SLOW_RANK's forward pass takes EXTRA
seconds more (argv: TRAIN_CONFIG_JSON SLOW_RANK EXTRA): a straggler inside the real training loop."""
import json
import os
import sys
import time

import torch
from torch import nn

from podrun.train import TrainConfig, train
from tests.train.worker import tiny_gn_net

opts, slow_rank, extra = json.loads(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])


class Slow(nn.Module):
    def forward(self, x):
        if int(os.environ["RANK"]) == slow_rank and self.training:
            time.sleep(extra)
        return x


torch.set_num_threads(1)
train(TrainConfig(model=lambda num_classes=10: nn.Sequential(Slow(), tiny_gn_net(num_classes)), **opts))
