"""ViT-B/16 in plain torch, parameter-for-parameter torchvision's vit_b_16, attention through SDPA.

State-dict names match torchvision's (``conv_proj``, ``class_token``, ``encoder.pos_embedding``,
``encoder.layers.encoder_layer_{i}.self_attention.in_proj_weight`` ...), so its checkpoints load.
``classifier='pooled'`` drops the class token and averages the patch tokens after the final LayerNorm
(pycls/Meta style): one token fewer in the position embedding and no class token, 2 x 768 = 1,536
parameters fewer (86,566,120 at 224 px, 1000 classes).
"""
from __future__ import annotations

import math
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from podrun.errors import SpecError


class SelfAttention(nn.Module):
    """Multi-head self-attention with nn.MultiheadAttention's parameter names, computed by SDPA."""

    def __init__(self, dim: int, num_heads: int, dropout: float = 0.0):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.dropout = dropout
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.in_proj_bias = nn.Parameter(torch.empty(3 * dim))
        self.out_proj = nn.Linear(dim, dim)
        nn.init.xavier_uniform_(self.in_proj_weight)
        nn.init.zeros_(self.in_proj_bias)
        nn.init.zeros_(self.out_proj.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, length, dim = x.shape
        qkv = F.linear(x, self.in_proj_weight, self.in_proj_bias)
        qkv = qkv.view(n, length, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        out = F.scaled_dot_product_attention(q, k, v,
                                             dropout_p=self.dropout if self.training else 0.0)
        return self.out_proj(out.transpose(1, 2).reshape(n, length, dim))


class MLPBlock(nn.Sequential):
    """Linear -> GELU -> Dropout -> Linear -> Dropout (torchvision's MLPBlock layout and init)."""

    def __init__(self, dim: int, mlp_dim: int, dropout: float):
        super().__init__(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Dropout(dropout),
                         nn.Linear(mlp_dim, dim), nn.Dropout(dropout))
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.normal_(m.bias, std=1e-6)


class EncoderBlock(nn.Module):
    """Pre-norm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(.))."""

    def __init__(self, num_heads: int, dim: int, mlp_dim: int, dropout: float, attention_dropout: float):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-6)
        self.self_attention = SelfAttention(dim, num_heads, attention_dropout)
        self.dropout = nn.Dropout(dropout)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = MLPBlock(dim, mlp_dim, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.self_attention(self.ln_1(x)))
        return x + self.mlp(self.ln_2(x))


class Encoder(nn.Module):
    """Position embedding, dropout, the blocks, final LayerNorm."""

    def __init__(self, seq_length: int, num_layers: int, num_heads: int, dim: int, mlp_dim: int,
                 dropout: float, attention_dropout: float):
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.empty(1, seq_length, dim).normal_(std=0.02))
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.Sequential(OrderedDict(
            (f"encoder_layer_{i}", EncoderBlock(num_heads, dim, mlp_dim, dropout, attention_dropout))
            for i in range(num_layers)))
        self.ln = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(self.layers(self.dropout(x + self.pos_embedding)))


class VisionTransformer(nn.Module):
    """torchvision's VisionTransformer with a 'token' or 'pooled' classifier."""

    def __init__(self, *, image_size: int = 224, patch_size: int = 16, num_layers: int = 12,
                 num_heads: int = 12, hidden_dim: int = 768, mlp_dim: int = 3072, dropout: float = 0.0,
                 attention_dropout: float = 0.0, num_classes: int = 1000, classifier: str = "token",
                 name: str = "vit"):
        super().__init__()
        if classifier not in ("token", "pooled"):
            raise SpecError(f"model {name}: classifier={classifier!r} is not one of 'token', 'pooled'",
                            hint="'token' is torchvision's class token; 'pooled' averages patch tokens")
        if not isinstance(image_size, int) or image_size < patch_size or image_size % patch_size:
            raise SpecError(f"model {name}: image_size={image_size!r} is not a positive multiple of "
                            f"the patch size {patch_size}",
                            hint=f"use e.g. {patch_size * max(1, round(image_size / patch_size)) if isinstance(image_size, int) else 224}")
        self.image_size = image_size
        self.patch_size = patch_size
        self.hidden_dim = hidden_dim
        self.classifier = classifier
        self.conv_proj = nn.Conv2d(3, hidden_dim, kernel_size=patch_size, stride=patch_size)
        seq_length = (image_size // patch_size) ** 2
        if classifier == "token":
            self.class_token = nn.Parameter(torch.zeros(1, 1, hidden_dim))
            seq_length += 1
        self.seq_length = seq_length
        self.encoder = Encoder(seq_length, num_layers, num_heads, hidden_dim, mlp_dim, dropout,
                               attention_dropout)
        self.heads = nn.Sequential(OrderedDict([("head", nn.Linear(hidden_dim, num_classes))]))

        fan_in = self.conv_proj.in_channels * patch_size * patch_size
        nn.init.trunc_normal_(self.conv_proj.weight, std=math.sqrt(1 / fan_in))
        nn.init.zeros_(self.conv_proj.bias)
        nn.init.zeros_(self.heads.head.weight)
        nn.init.zeros_(self.heads.head.bias)

    def _process_input(self, x: torch.Tensor) -> torch.Tensor:
        n, _c, h, w = x.shape
        torch._assert(h == self.image_size and w == self.image_size,
                      f"ViT built for {self.image_size} px images got {h}x{w}")
        x = self.conv_proj(x)  # n, hidden, h/p, w/p
        return x.flatten(2).transpose(1, 2)  # n, tokens, hidden

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self._process_input(x)
        if self.classifier == "token":
            x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1)
            return self.encoder(x)[:, 0]
        return self.encoder(x).mean(dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.heads(self.forward_features(x))


def vit_b16(num_classes: int = 1000, *, image_size: int = 224, classifier: str = "token",
            dropout: float = 0.0, attention_dropout: float = 0.0) -> VisionTransformer:
    """ViT-B/16: 12 layers, 12 heads, width 768, MLP 3072; 86,567,656 parameters at 224 px, 1000 classes."""
    return VisionTransformer(image_size=image_size, patch_size=16, num_layers=12, num_heads=12,
                             hidden_dim=768, mlp_dim=3072, dropout=dropout,
                             attention_dropout=attention_dropout, num_classes=num_classes,
                             classifier=classifier, name="vit_b16")
