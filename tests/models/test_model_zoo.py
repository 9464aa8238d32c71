"""The zoo's static surface: names, exact parameter counts (built on the meta device), info, option errors."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from podrun import models
from podrun.errors import PodrunError, SpecError

pytestmark = pytest.mark.torch

# torchvision's published counts (1000 classes); efficientnet_b4_g16 is this project's own figure.
EXPECTED = {
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "efficientnet_b0": 5_288_548,
    "efficientnet_b1": 7_794_184,
    "efficientnet_b2": 9_109_994,
    "efficientnet_b3": 12_233_232,
    "efficientnet_b4": 19_341_616,
    "efficientnet_b5": 30_389_784,
    "efficientnet_b6": 43_040_704,
    "efficientnet_b7": 66_347_960,
    "efficientnet_b4_g16": 19_328_168,
    "vit_b16": 86_567_656,
}


def meta_count(name: str, **kw) -> int:
    """Parameter count without allocating memory (meta tensors)."""
    with torch.device("meta"):
        return models.count_parameters(models.build(name, **kw))


def test_names_cover_the_required_models():
    assert set(models.names()) == set(EXPECTED)
    assert models.names()[:2] == ["resnet18", "resnet50"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_exact_parameter_count(name):
    assert meta_count(name) == EXPECTED[name]
    assert models.info(name)["params"] == EXPECTED[name]


@pytest.mark.parametrize("name,kw,expected", [
    # 7x7x3x64 = 9,408 stem weights become 3x3x3x64 = 1,728
    ("resnet18", {"stem": "cifar"}, 11_689_512 - 9_408 + 1_728),
    ("resnet50", {"norm": "group"}, 25_557_032),          # GroupNorm has BatchNorm's affine params
    ("efficientnet_b0", {"norm": "group"}, 5_288_548),
    # pooled: no class token and one position fewer: 2 x 768 fewer
    ("vit_b16", {"classifier": "pooled"}, 86_567_656 - 2 * 768),
    # position embeddings follow image_size: (384/16)^2 + 1 = 577 positions instead of 197
    ("vit_b16", {"image_size": 384}, 86_567_656 + (577 - 197) * 768),
    # 10 classes: the head shrinks from 512x1000+1000 to 512x10+10
    ("resnet18", {"num_classes": 10}, 11_689_512 - 513_000 + 5_130),
])
def test_option_parameter_counts(name, kw, expected):
    assert meta_count(name, **kw) == expected


def test_info_has_native_sizes_and_norms():
    sizes = {n: models.info(n)["image_size"] for n in models.names()}
    assert sizes["efficientnet_b0"] == 224 and sizes["efficientnet_b1"] == 240
    assert sizes["efficientnet_b2"] == 288 and sizes["efficientnet_b3"] == 300
    assert sizes["efficientnet_b4"] == 380 and sizes["efficientnet_b4_g16"] == 380
    assert sizes["resnet50"] == 224 and sizes["vit_b16"] == 224
    assert models.info("efficientnet_b4_g16")["norm"] == "group"
    assert models.info("resnet50")["norm"] == "batch"
    assert models.info("vit_b16")["family"] == "vit"


def test_names_and_info_do_not_import_torch():
    code = ("import sys; from podrun import models; models.names(); models.info('vit_b16'); "
            "assert 'torch' not in sys.modules, 'torch imported'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_options_lists_keyword_defaults():
    assert models.options("resnet50") == {"norm": "batch", "stem": "imagenet", "zero_init_residual": False}
    assert models.options("vit_b16")["classifier"] == "token"
    assert models.options("efficientnet_b4_g16")["norm"] == "group"


@pytest.mark.parametrize("call,words", [
    (lambda: models.build("resnet101"), ["unknown model 'resnet101'", "resnet18"]),
    (lambda: models.info("nope"), ["unknown model 'nope'"]),
    (lambda: models.build("resnet18", stem="tiny"), ["resnet18", "stem='tiny'"]),
    (lambda: models.build("resnet50", norm="layer"), ["resnet50", "norm='layer'"]),
    (lambda: models.build("resnet18", depth=3), ["resnet18", "unknown option(s) depth", "stem="]),
    (lambda: models.build("vit_b16", image_size=100), ["vit_b16", "image_size=100", "patch size 16"]),
    (lambda: models.build("vit_b16", classifier="cls"), ["vit_b16", "classifier='cls'"]),
    (lambda: models.build("resnet18", num_classes=0), ["resnet18", "num_classes=0"]),
    (lambda: models.build("efficientnet_b0", group_size=7), ["efficientnet_b0", "group_size=7"]),
])
def test_bad_options_raise_spec_error_with_hint(call, words):
    with pytest.raises(SpecError) as info:
        call()
    err = info.value
    assert isinstance(err, PodrunError) and err.exit_code == 2
    assert err.hint, "every model error carries a hint"
    for w in words:
        assert w in str(err), (w, str(err))
