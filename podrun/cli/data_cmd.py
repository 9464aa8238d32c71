"""The `data` commands: `podrun data bench` times a recipe's input pipeline alone on this host; `podrun data pack`
writes an image folder as tar shards."""
from __future__ import annotations

import click

from podrun.cli.render import print_json


@click.group("data")
def data() -> None:
    """Measure the input pipeline (decode and augmentation) on this host."""


@data.command("bench")
@click.option("--recipe", required=True, help="Recipe name or folder: its image size is the pipeline's.")
@click.option("--data", "data_path", required=True, type=click.Path(),
              help="An ImageNet-style folder (train/<class>/*.jpg), its shards from podrun data pack, or one split.")
@click.option("--workers", type=click.IntRange(min=0), multiple=True,
              help="Loader workers to time (repeatable; 0: in the rank's own thread). Default: 0, 1, 2, 4 ... "
                   "up to this host's cores.")
@click.option("--batch", type=click.IntRange(min=1), default=32, show_default=True, help="Images per batch.")
@click.option("--images", type=click.IntRange(min=1), default=256, show_default=True,
              help="Images timed per worker count (after one warm-up batch).")
@click.option("--decoder", type=click.Choice(["simplejpeg", "pil"]), default=None,
              help="Force a decoder (default: the fastest installed).")
@click.option("--bad-samples", type=click.Choice(["fail", "skip"]), default="fail", show_default=True,
              help="An image that does not decode: stop naming it, or skip it.")
@click.option("--json", "as_json", is_flag=True, help="Print the record as JSON.")
def bench(recipe, data_path, workers, batch, images, decoder, bad_samples, as_json) -> None:
    """Time a recipe's input pipeline (decode, random-resized crop, flip) with no model: images per second for
    each number of loader workers, and the decoder used.

    \b
      podrun data bench --recipe resnet50 --data /data/imagenet --workers 2
      podrun data bench --recipe resnet50 --data /data/imagenet --json
    """
    from podrun.specs import load_recipe
    from podrun.train.data_bench import bench as run_bench, default_counts
    from podrun.wire.worker_env import cpus_here

    spec = load_recipe(recipe)
    counts = list(workers) or default_counts(cpus_here())
    record = run_bench(data_path, spec.dataset.image_size, counts, batch=batch, images=images, decoder=decoder,
                       bad_samples=bad_samples)
    record["recipe"] = spec.name
    if as_json:
        print_json(record)
        return
    click.echo(f"{spec.name}: input pipeline on {record['data']} ({record['images_in_split']} images), "
               f"{record['image_size']} px, decoder {record['decoder']}, {record['cores']} core(s) here")
    click.echo(f"  {'workers':>7}  {'img/s':>8}  {'per worker':>10}  {'CPU ms/img':>10}")
    for row in record["rows"]:
        cpu = "-" if row["cpu_ms_per_image"] is None else f"{row['cpu_ms_per_image']:.2f}"
        click.echo(f"  {row['workers']:>7}  {row['images_per_second']:>8.1f}  "
                   f"{row['images_per_second_per_worker']:>10.1f}  {cpu:>10}")


@data.command("pack")
@click.argument("folder", type=click.Path())
@click.argument("out", type=click.Path())
@click.option("--shard-size", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Samples per shard (NNNNNN.tar of <key>.jpg + <key>.cls, WebDataset's layout).")
@click.option("--json", "as_json", is_flag=True, help="Print each split's shards (name, samples, sha256) as JSON.")
def pack(folder, out, shard_size, as_json) -> None:
    """Write an ImageNet-style FOLDER (train/ and val/ of class folders) as tar shards in OUT, with an index for
    random access (the same samples in the same order: a run on OUT trains as on FOLDER) and a SHA-256 per shard.

    \b
      podrun data pack /data/imagenet /scratch/imagenet-shards --shard-size 5000
      python recipes/resnet50/train.py --data /scratch/imagenet-shards
    """
    from podrun.train.shards import pack as run_pack, print_progress

    done = run_pack(folder, out, shard_size, None if as_json else print_progress)
    if as_json:
        print_json({split: {"classes": len(ix["classes"]), "samples": len(ix["samples"]["shard"]),
                            "shards": ix["shards"]} for split, ix in done.items()})
        return
    for split, ix in done.items():
        click.echo(f"{split}: {len(ix['samples']['shard'])} samples of {len(ix['classes'])} classes in "
                   f"{len(ix['shards'])} shard(s)")
