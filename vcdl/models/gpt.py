"""A small decoder-only transformer language model (``gpt``), sized by keyword arguments.

GPT-2's shape (Radford et al. 2019), as nanoGPT writes it
(https://github.com/karpathy/nanoGPT): token and learned position
embeddings, pre-norm blocks of causal self-attention and an MLP (4x width,
GELU), a final LayerNorm, and the output layer tied to the token embedding.
Attention is :func:`torch.nn.functional.scaled_dot_product_attention` with
``is_causal=True`` (its flash or memory-efficient kernel on a GPU). The
model maps token ids ``(batch, time)`` to logits ``(batch, time, vocab)``;
the ``causal_lm`` objective (:mod:`vcdl.objectives`) trains it on next-token
prediction.

Sizes: ``vocab_size`` and ``context_length`` come from the data set's hints
(byte-level text: 256 and the rows' context); ``layers``, ``heads`` and
``width`` from the run's ``model.kwargs``. Parameters are initialised as in
GPT-2 (normal, std 0.02; residual projections scaled by 1/sqrt(2·layers)),
from torch's global RNG, so a seed gives the same model everywhere.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from vcdl.errors import ModelError


class SelfAttention(nn.Module):
    """Multi-head causal self-attention."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = SelfAttention(width, heads, dropout)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token ids ``(batch, time)`` -> next-token logits ``(batch, time, vocab_size)``."""

    def __init__(
        self,
        vocab_size: int,
        context_length: int,
        layers: int,
        heads: int,
        width: int,
        dropout: float,
    ) -> None:
        super().__init__()
        self.context_length = context_length
        self.tokens = nn.Embedding(vocab_size, width)
        self.positions = nn.Embedding(context_length, width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(width, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size, bias=False)
        self.head.weight = self.tokens.weight  # tied: one matrix in and out
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.context_length:
            raise ValueError(
                f"sequence of {t} tokens is longer than the context {self.context_length}"
            )
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tokens(idx) + self.positions(pos))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def gpt(
    vocab_size: int = 256,
    context_length: int = 128,
    layers: int = 4,
    heads: int = 4,
    width: int = 128,
    dropout: float = 0.0,
) -> nn.Module:
    """A decoder-only transformer (see the module docstring)."""
    for name, value in (
        ("vocab_size", vocab_size),
        ("context_length", context_length),
        ("layers", layers),
        ("heads", heads),
        ("width", width),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ModelError(f"gpt: {name} must be a positive integer, got {value!r}")
    if width % heads:
        raise ModelError(f"gpt: width {width} must be a multiple of heads {heads}")
    if not 0.0 <= dropout < 1.0:
        raise ModelError(f"gpt: dropout must be in [0, 1), got {dropout}")
    return GPT(vocab_size, context_length, layers, heads, width, dropout)
