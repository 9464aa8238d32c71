#!/usr/bin/env python
"""The efficientnet_b4 recipe: hyperparameters from recipe.yaml (rescaled by the plan when launched by podrun).

    python recipes/efficientnet_b4/train.py --data synthetic --steps 20 --global-batch 8
    python -m torch.distributed.run --nproc-per-node 8 recipes/efficientnet_b4/train.py --data /data/imagenet --amp bf16 --channels-last
    podrun launch recipes/efficientnet_b4 --data /data/imagenet
"""
import os
import sys

from podrun.train.recipe_main import main

HERE = os.path.dirname(os.path.abspath(__file__))

if __name__ == "__main__":
    sys.exit(main(HERE, sys.argv[1:], default_data="synthetic"))
