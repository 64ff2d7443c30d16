"""The source document's random-weight decoder, generalised to layers and GQA.

Token and learned position embeddings, then pre-norm blocks (attention and a
feed-forward network, each with a residual), a final norm and an output head.
The model holds no per-request state: the cache is passed in and returned.
Shapes use one vocabulary: B batch, L new positions, T = offset + L positions
held, C width, H query heads, KVH key/value heads, D head width, V vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from kvbench.attention import causal_attention
from kvbench.cache import Cache, ConcatCache

# Re-exported: `from kvbench.model import DecoderConfig` is part of the public contract.
from kvbench.config import DTYPES, PRESETS, DecoderConfig, dtype_name, parse_dtype, preset_config

__all__ = ["DTYPES", "PRESETS", "Block", "Decoder", "DecoderConfig", "build_model", "dtype_name", "parse_dtype",
           "preset_config"]


class Block(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = config.heads, config.kv_heads, config.head_dim
        self.window = config.window
        self.norm1 = nn.LayerNorm(config.width)
        # One projection for q, k and v (as in the source document); k and v
        # get kv_heads heads each, so GQA shrinks this and the cache alike.
        self.qkv = nn.Linear(config.width, (config.heads + 2 * config.kv_heads) * config.head_dim)
        self.out = nn.Linear(config.width, config.width)
        self.norm2 = nn.LayerNorm(config.width)
        self.fc = nn.Linear(config.width, config.mlp_ratio * config.width)
        self.proj = nn.Linear(config.mlp_ratio * config.width, config.width)

    def forward(self, x: Tensor, cache: Cache, layer: int, offset: int) -> Tensor:
        # Functional calls on the modules' parameters: at one token per step the
        # per-call overhead of nn.Module.__call__ is a visible share of the step.
        B, L, C = x.shape
        H, KVH, D = self.heads, self.kv_heads, self.head_dim
        h = F.layer_norm(x, (C,), self.norm1.weight, self.norm1.bias)
        q, k, v = F.linear(h, self.qkv.weight, self.qkv.bias).split((H * D, KVH * D, KVH * D), dim=-1)
        q = q.view(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
        k = k.view(B, L, KVH, D).transpose(1, 2)  # (B, KVH, L, D)
        v = v.view(B, L, KVH, D).transpose(1, 2)
        k, v = cache.update(layer, k, v)  # (B, KVH, T, D), T = offset + L (fewer in a window's ring)
        y = causal_attention(q, k, v, offset, self.window, cache.key_positions)  # (B, H, L, D)
        x = x + F.linear(y.transpose(1, 2).reshape(B, L, C), self.out.weight, self.out.bias)
        h = F.layer_norm(x, (C,), self.norm2.weight, self.norm2.bias)
        # GPT-2's tanh GELU: exact (erf) GELU has a fixed ~17 us per call on small
        # CPU tensors that would dominate a one-token step of this tiny model.
        h = F.gelu(F.linear(h, self.fc.weight, self.fc.bias), approximate="tanh")
        return x + F.linear(h, self.proj.weight, self.proj.bias)


class Decoder(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.token = nn.Embedding(config.vocab_size, config.width)
        self.position = nn.Embedding(config.max_length, config.width)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.final = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab_size)

    def forward(self, ids: Tensor, cache: Cache | None = None) -> tuple[Tensor, Cache]:
        """ids (B, L) -> logits (B, L, V) and the cache, now holding L more positions."""
        B, L = check_token_ids(ids, self.config)
        if cache is None:
            cache = ConcatCache(self.config, batch=B)
        elif not isinstance(cache, Cache):
            raise ValueError(f"expected a kvbench Cache (see kvbench.cache.make_cache), got {type(cache).__name__}")
        offset = cache.length
        cache.check_append(self.config, batch=B, length=L)
        try:
            x = F.embedding(ids, self.token.weight)  # (B, L, C)
        except IndexError:  # only reached on bad ids; the happy path pays nothing
            raise ValueError(token_range_message(ids, self.config)) from None
        # Positions offset..offset+L-1 are a slice of the table (check_append kept them in range).
        x = x + self.position.weight[offset : offset + L]
        try:  # one transaction: the cache commits all L positions, or rolls back to where it was
            cache.reserve(L)  # paged caches allocate blocks here; nothing was mutated before
            for layer, block in enumerate(self.blocks):
                x = block(x, cache, layer, offset)
            cache.commit(L)
        except BaseException:  # whatever the failure, Ctrl-C included
            cache.rollback()
            raise
        x = F.layer_norm(x, (self.config.width,), self.final.weight, self.final.bias)
        return F.linear(x, self.head.weight, self.head.bias), cache


def check_token_ids(ids: Tensor, config: DecoderConfig) -> tuple[int, int]:
    if not isinstance(ids, Tensor):
        raise ValueError(f"ids must be a LongTensor of shape (batch, length), got {type(ids).__name__}")
    if ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"ids must have dtype int64, got {dtype_name(ids.dtype)}")
    if not ids.is_cpu:  # the model and every cache kind live on the CPU
        raise ValueError(f"ids must be on device cpu, where the model and its caches are, got device {ids.device}")
    if ids.dim() != 2:
        raise ValueError(f"ids must have shape (batch, length), got {ids.dim()} dimensions {tuple(ids.shape)}")
    batch, length = ids.shape
    if batch < 1 or length < 1:
        raise ValueError(f"at least one token is required: expected batch >= 1 and length >= 1, got shape {tuple(ids.shape)}")
    return batch, length


def token_range_message(ids: Tensor, config: DecoderConfig) -> str:
    low, high = int(ids.min()), int(ids.max())
    return f"token ids must be in [0, {config.vocab_size - 1}] for vocab_size {config.vocab_size}, got min {low} and max {high}"


def build_model(config: DecoderConfig | None = None, seed: int = 0) -> Decoder:
    """Random weights that depend only on (config, seed); eval mode, no gradients."""
    config = config or DecoderConfig()
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ValueError(f"seed must be an integer in [0, 2**63), got {seed!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Decoder(config)
    model = model.to(config.dtype).eval()
    model.requires_grad_(False)
    return model
