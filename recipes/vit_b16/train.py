#!/usr/bin/env python
"""The vit_b16 recipe: hyperparameters from recipe.yaml (rescaled by the plan when launched by podrun).

    python recipes/vit_b16/train.py --data synthetic --steps 20 --global-batch 8
    python -m torch.distributed.run --nproc-per-node 8 recipes/vit_b16/train.py --data /data/imagenet --fsdp --amp bf16
    podrun launch recipes/vit_b16 --data /data/imagenet
"""
import os
import sys

from podrun.train.recipe_main import main

HERE = os.path.dirname(os.path.abspath(__file__))

if __name__ == "__main__":
    sys.exit(main(HERE, sys.argv[1:], default_data="synthetic"))
