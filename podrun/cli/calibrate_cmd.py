"""`podrun calibrate`: measure a recipe on a cluster's hosts (rate, largest local batch, all-reduce) into a file."""
from __future__ import annotations

import click

from podrun.cli import types as t
from podrun.cli.options import host_options, pop_plan_options
from podrun.launch.transports import transport_choices
from podrun.specs.limits import MAX_BATCH


def _batches(ctx, param, value):
    if value is None:
        return ()
    try:
        out = tuple(sorted({int(v) for v in value.split(",") if v.strip()}))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a list of local batches such as 8,16,32", param=param) from None
    if not out or out[0] < 1:
        raise click.BadParameter(f"{value!r}: local batches are whole numbers of at least 1", param=param)
    return out


@click.command("calibrate")
@click.argument("recipe")
@host_options
@click.option("--device-memory", "device_memory_gb", type=t.DEVICE_MEMORY_GB,
              metavar="GB", help="The memory budget of one device for the largest-batch search (default: the "
                                 "cluster spec's device memory; on CPU the memory one worker may use).")
@click.option("--largest-batch", "largest_batch", type=click.IntRange(1, MAX_BATCH), default=None, metavar="N",
              help="The largest local batch that fits one device, when known: no memory search (the file says it "
                   "was given). Not with --device-memory.")
@click.option("--batches", callback=_batches, metavar="B,...",
              help="Local batches to time (default: those the recipe's plans pick on 1..N of the hosts).")
@click.option("--steps", type=click.IntRange(1, 1000), default=5, show_default=True,
              help="Timed training steps at each local batch (after one warm-up step).")
@click.option("--image-size", "image_size", type=click.IntRange(1, 100_000), default=None, metavar="PX",
              help="The inputs' side in pixels (default: the recipe's dataset.image_size). Give the size the run "
                   "trains at when it is not the recipe's: resnet18_cifar10's train.py trains --data digits at 16.")
@click.option("--data", "data", type=click.Path(), default=None, metavar="PATH",
              help="A sample of your data (an ImageNet-style folder or its shards from podrun data pack, at the same "
                   "path on every host): the recipe's decode and augmentation is timed on it at 0, 1, 2, 4 ... "
                   "loader workers up to the host's cores, and the plan counts input.")
@click.option("--input-images", "input_images", type=click.IntRange(1, 1_000_000), default=128, show_default=True,
              metavar="N", help="Images timed per loader worker count (with --data).")
@click.option("--name", help="The calibration's name under RUNS_DIR/calibrations (default: RECIPE-CLUSTER).")
@click.option("--runs-dir", default="runs", show_default=True, help="Where run directories and calibrations go.")
@click.option("--transport", type=click.Choice(transport_choices()),
              help="How the workers start (as podrun launch: local here, srun in Slurm, else ssh).")
@click.option("--ssh-config", type=click.Path(dir_okay=False), help="OpenSSH client config (default ~/.ssh/config).")
@click.option("--python", "python", help="Python on the hosts (default: this one).")
@click.option("--master-port", type=t.PORT, default=None, help="Rendezvous port (as podrun launch).")
@click.option("--json", "as_json", is_flag=True, help="Print the calibration as JSON on stdout.")
def calibrate(recipe, as_json, **options):
    """Measure RECIPE on the hosts: the rate per device at the plans' local batches, the largest local batch that
    fits a device's memory, all-reduce bus bandwidth and latency within and between hosts, and with --data the
    input pipeline's rate by loader workers. The file
    (RUNS_DIR/calibrations/NAME.yaml) feeds `podrun plan --calibration NAME`.

    \b
    podrun calibrate --device-memory 1 recipes/resnet18_cifar10
    podrun calibrate --hosts h1,h2,h3,h4 --devices-per-host 1 \\
        --device-memory 1 resnet18_cifar10
    podrun calibrate --device-memory 1 --data /data/imagenet resnet50
    podrun plan --calibration resnet18_cifar10-local resnet18_cifar10
    """
    from podrun.calibrate.run import CalibrateOptions, calibrate as run_calibration, summary_rows
    from podrun.cli.render import print_json

    cal, path = run_calibration(CalibrateOptions(recipe=recipe, plan=pop_plan_options(options), **options))
    if as_json:
        print_json({**cal.to_dict(), "file": str(path)})
        return
    from podrun.cli.render import console, kv_table

    console().print(kv_table(f"calibration {path.stem}: {cal.recipe} on {cal.cluster}, {cal.measured_at}",
                             summary_rows(cal)))
    click.echo(f"written: {path}  (podrun plan --calibration {path.stem} ...)")
