"""Real forward/backward passes on small inputs: shapes, norms, G16 structure, seeds, bf16, channels_last."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from podrun import models
from podrun.models.efficientnet import MBConv
from podrun.models.layers import StochasticDepth
from podrun.models.vit import SelfAttention

pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]

CNN_CASES = {
    "resnet18": ({}, 64),
    "resnet18_cifar": ({"stem": "cifar", "num_classes": 10}, 32),
    "resnet50_gn": ({"norm": "group", "zero_init_residual": True}, 64),
    "efficientnet_b0": ({}, 64),
    "efficientnet_b4_g16": ({}, 64),
}


def _name(key: str) -> str:
    return {"resnet18_cifar": "resnet18", "resnet50_gn": "resnet50"}.get(key, key)


@pytest.fixture(scope="module")
def built():
    """Each small-input model once per module (seeded), with the input size it is tested at."""
    out = {}
    for key, (kw, px) in CNN_CASES.items():
        torch.manual_seed(0)
        out[key] = (models.build(_name(key), **kw), px, kw.get("num_classes", 1000))
    torch.manual_seed(0)
    out["vit_b16_224"] = (models.build("vit_b16"), 224, 1000)
    torch.manual_seed(0)
    out["vit_b16_pooled_32"] = (models.build("vit_b16", image_size=32, classifier="pooled",
                                             num_classes=10), 32, 10)
    return out


@pytest.mark.parametrize("key", [*CNN_CASES, "vit_b16_pooled_32"])
def test_forward_backward_shapes_and_grads(built, key):
    model, px, classes = built[key]
    model.train()
    model.zero_grad(set_to_none=True)
    x = torch.randn(2, 3, px, px)
    y = model(x)
    assert y.shape == (2, classes) and y.dtype == torch.float32
    loss = nn.functional.cross_entropy(y, torch.tensor([0, 1]))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{key}: no grad for {name}"
        assert torch.isfinite(p.grad).all(), f"{key}: non-finite grad for {name}"
    head = model.fc if hasattr(model, "fc") else (
        model.classifier[1] if hasattr(model, "features") else model.heads.head)
    assert head.weight.grad.abs().sum() > 0


def test_vit_at_native_224_token_classifier(built):
    model = built["vit_b16_224"][0].eval()
    with torch.no_grad():
        y = model(torch.randn(1, 3, 224, 224))
    assert y.shape == (1, 1000)
    assert model.encoder.pos_embedding.shape == (1, 197, 768)
    with pytest.raises(Exception, match="224"):
        model(torch.randn(1, 3, 160, 160))


def test_group_norm_variants_have_no_batchnorm(built):
    for key in ("resnet50_gn", "efficientnet_b4_g16"):
        mods = list(built[key][0].modules())
        assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in mods), key
        assert any(isinstance(m, nn.GroupNorm) for m in mods), key
    gns = [m for m in built["resnet50_gn"][0].modules() if isinstance(m, nn.GroupNorm)]
    assert all(m.num_groups == min(32, m.num_channels) for m in gns)
    assert all(m.num_groups == 4 for m in built["efficientnet_b4_g16"][0].modules()
               if isinstance(m, nn.GroupNorm))
    # the default builds do use BatchNorm
    assert any(isinstance(m, nn.BatchNorm2d) for m in built["resnet18"][0].modules())


def test_zero_init_residual_zeroes_last_norm_of_each_block(built):
    model = built["resnet50_gn"][0]
    assert all(float(b.bn3.weight.detach().abs().sum()) == 0 for layer in
               (model.layer1, model.layer2, model.layer3, model.layer4) for b in layer)
    assert float(model.bn1.weight.detach().sum()) == 64


def test_g16_group_size_16_and_expansion_4(built):
    model = built["efficientnet_b4_g16"][0]
    blocks = [b for b in model.modules() if isinstance(b, MBConv)]
    assert len(blocks) == 32  # B4: ceil([1,2,2,3,3,4,1] x 1.8)
    stage1 = list(model.features[1])
    for b in blocks:
        spatial = [m for m in b.block.modules() if isinstance(m, nn.Conv2d) and m.kernel_size[0] > 1]
        assert len(spatial) == 1
        conv = spatial[0]
        if b in stage1:
            assert b.expanded_channels == conv.in_channels  # expansion 1, no 1x1 expand conv
        else:
            assert b.expanded_channels == 4 * b.block[0][0].in_channels  # expansion 4, not 6
        if conv.in_channels % 16 == 0:
            assert conv.in_channels // conv.groups == 16, (conv, conv.groups)
        else:  # Graphcore's max(C // 16, 1): only stage 1's second block (24 channels) is like this
            assert (conv.in_channels, conv.groups) == (24, 1)
    grouped = sum(1 for b in blocks for m in b.modules() if isinstance(m, nn.Conv2d) and m.groups > 1)
    assert grouped == 31
    # torchvision's B0 keeps depthwise convs and expansion 6
    b0 = built["efficientnet_b0"][0]
    dw = [m for m in b0.modules() if isinstance(m, nn.Conv2d) and m.kernel_size[0] > 1 and m.groups > 1]
    assert dw and all(m.groups == m.in_channels for m in dw)
    assert b0.features[2][0].expanded_channels == 6 * 16


@pytest.mark.parametrize("name,kw", [
    ("resnet18", {"stem": "cifar", "num_classes": 10}),
    ("efficientnet_b4_g16", {"num_classes": 10}),
    ("vit_b16", {"image_size": 32, "num_classes": 10}),
])
def test_same_seed_gives_bitwise_equal_weights(name, kw):
    def state(seed):
        torch.manual_seed(seed)
        return models.build(name, **kw).state_dict()

    a, b, c = state(1234), state(1234), state(99)
    assert list(a) == list(b)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].is_floating_point())


@pytest.mark.parametrize("key", ["resnet18_cifar", "efficientnet_b4_g16", "vit_b16_pooled_32"])
def test_channels_last_and_bf16_autocast_match_fp32(built, key):
    model, px, classes = built[key]
    model.eval()
    x = torch.randn(2, 3, px, px)
    with torch.no_grad():
        ref = model(x)
        model.to(memory_format=torch.channels_last)
        try:
            cl = model(x.to(memory_format=torch.channels_last))
            with torch.autocast("cpu", dtype=torch.bfloat16):
                low = model(x.to(memory_format=torch.channels_last))
        finally:
            model.to(memory_format=torch.contiguous_format)
    torch.testing.assert_close(cl, ref, rtol=1e-4, atol=1e-4)
    assert low.dtype == torch.bfloat16 and low.shape == (2, classes)
    scale = float(ref.abs().max()) + 1e-6
    assert float((low.float() - ref).abs().max()) / scale < 0.1


def test_eval_is_deterministic_and_stochastic_depth_drops_rows_in_training(built):
    model, px, _ = built["efficientnet_b0"]
    model.eval()
    x = torch.randn(2, 3, px, px)
    with torch.no_grad():
        assert torch.equal(model(x), model(x))
    sd = StochasticDepth(0.5).train()
    torch.manual_seed(0)
    out = sd(torch.ones(256, 4, 2, 2))
    rows = out.flatten(1)
    assert set(rows.unique().tolist()) == {0.0, 2.0}
    assert all(len(r.unique()) == 1 for r in rows)  # whole samples dropped, survivors rescaled by 1/0.5
    assert torch.equal(sd.eval()(torch.ones(3, 2)), torch.ones(3, 2))
    probs = [b.stochastic_depth.p for b in model.modules() if isinstance(b, MBConv)]
    assert probs[0] == 0.0 and probs == sorted(probs) and max(probs) < 0.2


def test_sdpa_attention_matches_nn_multihead_attention():
    """Same parameter names as nn.MultiheadAttention (torchvision's), same numbers."""
    torch.manual_seed(0)
    ours = SelfAttention(64, 4).eval()
    ref = nn.MultiheadAttention(64, 4, batch_first=True).eval()
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(2, 5, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x, x, x, need_weights=False)[0], rtol=1e-5, atol=1e-5)


def test_state_dict_names_follow_torchvision(built):
    keys = {k: set(built[k][0].state_dict()) for k in ("resnet18", "efficientnet_b0", "vit_b16_224")}
    assert {"conv1.weight", "bn1.running_mean", "layer4.1.bn2.weight", "layer2.0.downsample.0.weight",
            "fc.weight"} <= keys["resnet18"]
    assert {"features.0.0.weight", "features.1.0.block.1.fc1.weight", "features.2.0.block.0.1.running_var",
            "features.8.0.weight", "classifier.1.weight"} <= keys["efficientnet_b0"]
    assert {"class_token", "conv_proj.weight", "encoder.pos_embedding",
            "encoder.layers.encoder_layer_11.self_attention.in_proj_weight",
            "encoder.layers.encoder_layer_0.self_attention.out_proj.bias",
            "encoder.layers.encoder_layer_0.mlp.3.weight", "encoder.ln.weight",
            "heads.head.weight"} <= keys["vit_b16_224"]
    assert "class_token" not in built["vit_b16_pooled_32"][0].state_dict()
