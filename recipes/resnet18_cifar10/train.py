#!/usr/bin/env python
"""ResNet-18 (CIFAR stem) on CIFAR-10 or the offline digits set: the small recipe that trains on this machine.

    python recipes/resnet18_cifar10/train.py --data digits
    python -m torch.distributed.run --nproc-per-node 2 recipes/resnet18_cifar10/train.py --data digits
    podrun launch recipes/resnet18_cifar10 --data digits

With --data digits (scikit-learn's 8x8 digits, 1,438 training images, no download) the defaults are
16 px inputs (2x the source; 32 px costs 4x and adds nothing), 4 epochs and, unless a launcher's plan
sets it (PODRUN_GLOBAL_BATCH), global batch 64 (LR scaled by the recipe's rule): at the recipe's 256 an
epoch is only 5 updates. --image-size / --epochs / --global-batch override them; everything else comes
from recipe.yaml and the plan.
"""
import os
import sys

from podrun.train.recipe_main import main

HERE = os.path.dirname(os.path.abspath(__file__))
DIGITS_DEFAULTS = {"--image-size": "16", "--epochs": "4", "--global-batch": "64"}


def _given(argv, flag):
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def _argv(argv):
    if "digits" in argv or not _given(argv, "--data"):
        for flag, value in DIGITS_DEFAULTS.items():
            if flag == "--global-batch" and (os.environ.get("PODRUN_GLOBAL_BATCH") or _given(argv, "--local-batch")):
                continue
            if not _given(argv, flag):
                argv = argv + [flag, value]
    return argv


if __name__ == "__main__":
    sys.exit(main(HERE, _argv(sys.argv[1:]), default_data="digits"))
