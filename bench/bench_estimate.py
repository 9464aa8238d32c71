"""The planner's estimate held against published throughput figures (Graphcore's performance results, NVIDIA
DeepLearningExamples, MMClassification on IPU-POD16), each named in CASES."""
from __future__ import annotations

from dataclasses import replace

from podrun.plan import Overrides, make_plan
from podrun.specs import DeviceSpec, LinkSpec, load_cluster, load_recipe

# (what, recipe, cluster, device model override, hosts, devices per host, global batch, published img/s,
#  source, calibrated): "calibrated" rows share the figure the recipe's per-device rate was taken from,
#  so they check the arithmetic, not the model; the others are predictions.
CASES = [
    ("G16-EfficientNet-B4, Bow Pod16", "efficientnet_b4", "ipu-pod16", None, None, None, None, 8936,
     "Graphcore performance results (Bow Pod16)", True),
    ("G16-EfficientNet-B4, Bow Pod64", "efficientnet_b4", "ipu-pod64", None, None, None, None, 34943,
     "Graphcore performance results (Bow Pod64)", False),
    ("G16-EfficientNet-B4, Bow Pod256", "efficientnet_b4", "ipu-pod256", None, None, None, None, 117641,
     "Graphcore performance results (Bow Pod256)", False),
    ("ResNet-50, Bow Pod16, batch 1920", "resnet50", "ipu-pod16", None, None, None, 1920, 42029,
     "Graphcore performance results (Bow Pod16)", True),
    ("ResNet-50, Bow Pod64, batch 2560", "resnet50", "ipu-pod64", None, None, None, 2560, 145287,
     "Graphcore performance results (Bow Pod64)", False),
    ("ResNet-50, Bow Pod256, batch 10240", "resnet50", "ipu-pod256", None, None, None, 10240, 425514,
     "Graphcore performance results (Bow Pod256)", False),
    ("ResNet-50, 8 x V100 AMP (one host)", "resnet50", "abci", "v100", 1, 8, 2048, 8322,
     "NVIDIA DeepLearningExamples", False),
    ("ResNet-50, 8 x A100 80GB AMP (one host)", "resnet50", "dgx-a100", "a100", 1, 8, 2048, 16621,
     "NVIDIA DeepLearningExamples", False),
    ("EfficientNet-B4, 8 x V100 AMP (one host)", "efficientnet_b4", "abci", "v100", 1, 8, 256, 1366,
     "NVIDIA DeepLearningExamples", False),
    ("EfficientNet-B4, 8 x A100 80GB AMP (one host)", "efficientnet_b4", "dgx-a100", "a100", 1, 8, 512, 2570,
     "NVIDIA DeepLearningExamples", False),
    ("ViT-B/16 fine-tune, IPU-POD16", "vit_b16", "ipu-pod16", None, None, None, None, 5800,
     "MMClassification on IPU-POD16 (5,600-6,000)", True),
]

# DGX A100: NVLink 3 (600 GB/s bidirectional per GPU), 8 x HDR 200 Gb/s (NVIDIA DGX A100 datasheet).
DGX_A100_INTRA = LinkSpec("NVLink 3 / NVSwitch", 2400, 3, "NVIDIA DGX A100 datasheet")


def predict(recipe, cluster, model, hosts, dph, gb):
    if cluster == "dgx-a100":
        c = load_cluster("dgx-h100")
        c = replace(c, name="dgx-a100", interconnect=replace(c.interconnect, intra_host=DGX_A100_INTRA))
    else:
        c = load_cluster(cluster)
    if model:
        c = replace(c, device=DeviceSpec(c.device.kind, model, c.device.memory_gb))
    if hosts:
        c = c.with_hosts(c.hosts[:hosts], dph)
    return make_plan(c, load_recipe(recipe), Overrides(global_batch=gb))


def run(quick: bool) -> list[dict]:
    rows = []
    for what, recipe, cluster, model, hosts, dph, gb, published, source, calibrated in CASES:
        p = predict(recipe, cluster, model, hosts, dph, gb)
        pred = p.estimate.images_per_second
        rows.append({
            "benchmark": "estimate vs published", "subject": what, "value": round(pred, 1),
            "peer": source, "peer_value": float(published), "ratio": round(pred / published, 3),
            "unit": "img/s", "note": ("calibration point" if calibrated else "prediction")
            + f"; efficiency {p.estimate.scaling_efficiency:.3f}, R={p.replicas} b={p.local_batch} GA={p.grad_accum}",
        })
    return rows
