"""One rank of the runner (podrun.train.train) over real gloo that prints how many DDP wrappers are alive when
the process group is destroyed (argv: RANK WORLD PORT RUN_DIR). Run by tests/train/test_teardown.py."""
import gc
import os
import sys

rank, world, port, run_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE=str(world),
                  LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))

from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from podrun.train import runner  # noqa: E402
from podrun.train.config import TrainConfig  # noqa: E402
from tests.train.worker import tiny_gn_net  # noqa: E402

destroy = runner.destroy_distributed


def counting_destroy():
    print("ddp alive at destroy:", sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects()), flush=True)
    destroy()


runner.destroy_distributed = counting_destroy
gc.disable()      # a collection at a random moment would hide a wrapper kept only by a reference cycle
runner.train(TrainConfig(model=lambda num_classes=10: tiny_gn_net(num_classes), data="digits", image_size=8,
                         num_classes=10, steps=3, global_batch=2, lr=0.1, optimizer="sgd", eval_every=0,
                         console=False, resume=False, checkpoint_every=0, seed=3, run_dir=run_dir))
