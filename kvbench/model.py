"""The random-weight decoders: the source document's block (gpt2) and Llama's (llama), layers and GQA.

Token embeddings, then pre-norm blocks (attention and a feed-forward network, each with a
residual), a final norm and an output head. The gpt2 family adds learned position
embeddings to the tokens; the llama family rotates queries and keys by their absolute
positions (RoPE) before the cache stores them, so every cache kind holds rotated keys and
none needs to know the family. The model holds no per-request state: the cache is passed
in and returned. Shapes use one vocabulary: B batch, L new positions, T = offset + L
positions held, C width, H query heads, KVH key/value heads, D head width, I intermediate
(MLP) width, V vocabulary.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from kvbench.attention import attention_scores, causal_attention
from kvbench.cache import Cache, ConcatCache

# Re-exported: `from kvbench.model import DecoderConfig` is part of the public contract; a preset's model is
# built from here (PRESETS, preset_config).
from kvbench.config import PRESETS, DecoderConfig, RopeScaling, dtype_name, preset_config

__all__ = ["PRESETS", "Block", "Decoder", "DecoderConfig", "LlamaBlock", "RMSNorm", "apply_rotary", "build_model",
           "decoder_with_weights", "preset_config", "rms_norm", "rotary_tables"]


class Block(nn.Module):
    """The gpt2 family's block: the source document's, with GQA and its layer's window."""

    def __init__(self, config: DecoderConfig, layer: int = 0) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = config.heads, config.kv_heads, config.head_dim
        self.window, self.eps, self.sinks = config.layer_windows[layer], config.norm_eps, config.sinks
        self.norm1 = nn.LayerNorm(config.width, eps=config.norm_eps)
        # One projection for q, k and v (as in the source document); k and v
        # get kv_heads heads each, so GQA shrinks this and the cache alike.
        self.qkv = nn.Linear(config.width, (config.heads + 2 * config.kv_heads) * config.head_dim)
        self.out = nn.Linear(config.heads * config.head_dim, config.width)
        self.norm2 = nn.LayerNorm(config.width, eps=config.norm_eps)
        self.fc = nn.Linear(config.width, config.intermediate_size)
        self.proj = nn.Linear(config.intermediate_size, config.width)

    def forward(self, x: Tensor, cache: Cache, layer: int, offset: int, rotary: None = None) -> Tensor:
        # Functional calls on the modules' parameters: at one token per step the
        # per-call overhead of nn.Module.__call__ is a visible share of the step.
        B, L, C = x.shape
        H, KVH, D = self.heads, self.kv_heads, self.head_dim
        h = F.layer_norm(x, (C,), self.norm1.weight, self.norm1.bias, self.eps)
        q, k, v = F.linear(h, self.qkv.weight, self.qkv.bias).split((H * D, KVH * D, KVH * D), dim=-1)
        q = q.view(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
        k = k.view(B, L, KVH, D).transpose(1, 2)  # (B, KVH, L, D)
        v = v.view(B, L, KVH, D).transpose(1, 2)
        k, v = cache.update(layer, k, v)  # (B, KVH, T, D), T = offset + L (fewer in a window's ring)
        y = causal_attention(q, k, v, offset, self.window, cache.key_positions, cache.key_mask,
                             self.sinks, cache.key_lengths)  # (B, H, L, D)
        if cache.wants_scores is not None:  # only a cache that scores its positions pays for the weights
            cache.observe(layer, attention_scores(q, k, offset, self.window, cache.key_positions, cache.key_mask,
                                                  self.sinks, cache.wants_scores))
        x = x + F.linear(y.transpose(1, 2).reshape(B, L, H * D), self.out.weight, self.out.bias)
        h = F.layer_norm(x, (C,), self.norm2.weight, self.norm2.bias, self.eps)
        # GPT-2's tanh GELU: exact (erf) GELU has a fixed ~17 us per call on small
        # CPU tensors that would dominate a one-token step of this tiny model.
        h = F.gelu(F.linear(h, self.fc.weight, self.fc.bias), approximate="tanh")
        return x + F.linear(h, self.proj.weight, self.proj.bias)


class RMSNorm(nn.Module):
    """A weight per channel; the blocks call rms_norm on it."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))  # device-less as nn.Linear's: moved with the module


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension: torch's one call, where the
    written-out formula takes six (the same float32 numbers as transformers')."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def llama3_frequencies(inverse: Tensor, scaling: RopeScaling) -> Tensor:
    """Llama 3.1's stretch of the rotary frequencies: long wavelengths slowed by `factor`, short ones kept,
    the band between interpolated (the published reference's arithmetic, in float32)."""
    wavelength = 2 * math.pi / inverse
    low, high = scaling.original_max_length / scaling.low_freq_factor, scaling.original_max_length / scaling.high_freq_factor
    stretched = torch.where(wavelength > low, inverse / scaling.factor, inverse)
    smooth = (scaling.original_max_length / wavelength - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor)
    between = ~(wavelength < high) * ~(wavelength > low)
    return torch.where(between, (1 - smooth) * stretched / scaling.factor + smooth * stretched, stretched)


def rotary_tables(config: DecoderConfig, device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """cos and signed sin (max_length, 1, D) of every position, in float32 (the model casts them to its dtype);
    the 1 broadcasts over heads.

    Channel i turns with channel i + D/2 at frequency i (transformers' "half" layout, so
    published weights need no permutation). sin carries the rotation's sign, -sin on the
    first half, so that apply_rotary needs a roll where rotate_half needs four ops.
    """
    D = config.head_dim  # device None: torch's default, so that a model built under torch.device("meta") stays there
    inverse = 1.0 / (config.rope_theta ** (torch.arange(0, D, 2, dtype=torch.float, device=device) / D))  # (D/2,)
    if config.rope_scaling is not None:
        inverse = llama3_frequencies(inverse, config.rope_scaling)
    angles = torch.arange(config.max_length, dtype=torch.float, device=device)[:, None] * inverse  # (max_length, D/2)
    sign = torch.cat((-torch.ones(D // 2, device=device), torch.ones(D // 2, device=device)))
    angles = torch.cat((angles, angles), dim=-1)[:, None]  # (max_length, 1, D)
    return angles.cos(), angles.sin() * sign


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (B, L, heads, D) rotated to its positions; cos, sin (L, 1, D) from rotary_tables at those positions.
    Equals x * cos + rotate_half(x) * sin with rotate_half(x) = (-x2, x1): roll gives (x2, x1), sin the sign."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


class LlamaBlock(nn.Module):
    """The llama family's block (Llama, Qwen2, Mistral): RMSNorm, rotary GQA attention, RMSNorm, SwiGLU."""

    def __init__(self, config: DecoderConfig, layer: int = 0) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = config.heads, config.kv_heads, config.head_dim
        self.window, self.eps = config.layer_windows[layer], config.norm_eps  # this layer's window, or None
        self.sinks = config.sinks  # with a window: the first positions every query sees too
        C, HD = config.width, config.heads * config.head_dim
        self.norm1 = RMSNorm(C)
        # q, k and v in one matmul, as gate and up below: one call instead of three (or two) per step.
        self.qkv = nn.Linear(C, HD + 2 * config.kv_heads * config.head_dim, bias=config.qkv_bias)  # Qwen2's biases
        self.out = nn.Linear(HD, C, bias=False)
        self.norm2 = RMSNorm(C)
        self.gate_up = nn.Linear(C, 2 * config.intermediate_size, bias=False)
        self.down = nn.Linear(config.intermediate_size, C, bias=False)

    def forward(self, x: Tensor, cache: Cache, layer: int, offset: int, rotary: tuple[Tensor, Tensor]) -> Tensor:
        B, L, C = x.shape
        H, KVH, D = self.heads, self.kv_heads, self.head_dim
        qkv = F.linear(rms_norm(x, self.norm1.weight, self.eps), self.qkv.weight, self.qkv.bias)
        qkv = qkv.view(B, L, H + 2 * KVH, D)
        qk = apply_rotary(qkv[:, :, : H + KVH], *rotary)  # q and k at once, to positions offset..offset+L-1
        q, k = qk.transpose(1, 2).split((H, KVH), dim=1)  # (B, H, L, D), (B, KVH, L, D): k rotated before it is kept
        v = qkv[:, :, H + KVH :].transpose(1, 2)  # (B, KVH, L, D)
        k, v = cache.update(layer, k, v)  # (B, KVH, T, D), T = offset + L (fewer in a window's ring)
        y = causal_attention(q, k, v, offset, self.window, cache.key_positions, cache.key_mask,
                             self.sinks, cache.key_lengths)  # (B, H, L, D)
        if cache.wants_scores is not None:  # only a cache that scores its positions pays for the weights
            cache.observe(layer, attention_scores(q, k, offset, self.window, cache.key_positions, cache.key_mask,
                                                  self.sinks, cache.wants_scores))
        x = x + F.linear(y.transpose(1, 2).reshape(B, L, H * D), self.out.weight)
        gate, up = F.linear(rms_norm(x, self.norm2.weight, self.eps), self.gate_up.weight).chunk(2, dim=-1)  # (B, L, I)
        return x + F.linear(F.silu(gate) * up, self.down.weight)


class Decoder(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.token = nn.Embedding(config.vocab_size, config.width)
        if config.family == "gpt2":  # learned positions, LayerNorm, a head of its own with a bias
            self.position = nn.Embedding(config.max_length, config.width)
            self.blocks = nn.ModuleList(Block(config, layer) for layer in range(config.layers))
            self.final = nn.LayerNorm(config.width, eps=config.norm_eps)
            self.head = nn.Linear(config.width, config.vocab_size)
        else:  # rotary positions (tables, computed once, not weights), RMSNorm, a head without bias or tied
            with torch.no_grad():  # std 1/sqrt(C), not 1: a tied head then gives logits of order one, as an untied one
                self.token.weight.mul_(config.width**-0.5)
            self.blocks = nn.ModuleList(LlamaBlock(config, layer) for layer in range(config.layers))
            self.final = RMSNorm(config.width)
            self.head = None if config.tie_embeddings else nn.Linear(config.width, config.vocab_size, bias=False)
            cos, sin = rotary_tables(config)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

    @property
    def device(self) -> torch.device:
        """Where its weights are: its caches and its ids must be there too (make_cache(..., device=model.device))."""
        return self.token.weight.device

    def forward(self, ids: Tensor, cache: Cache | None = None) -> tuple[Tensor, Cache]:
        """ids (B, L) -> logits (B, L, V) and the cache, now holding L more positions."""
        embedding = self.token.weight  # read once: a module attribute costs microseconds at one token a step
        device = embedding.device
        B, L = check_token_ids(ids, self.config, device)
        if cache is None:
            cache = ConcatCache(self.config, batch=B, device=device)
        elif not isinstance(cache, Cache):
            raise ValueError(f"expected a kvbench Cache (see kvbench.cache.make_cache), got {type(cache).__name__}")
        elif cache.device != device:
            raise ValueError(f"cache device mismatch: the model is on device {device}, the cache on device {cache.device}")
        offset = cache.length
        cache.check_append(self.config, batch=B, length=L)
        try:
            x = F.embedding(ids, embedding)  # (B, L, C)
        except IndexError:  # only reached on bad ids; the happy path pays nothing
            raise ValueError(token_range_message(ids, self.config)) from None
        # Positions offset..offset+L-1 are a slice of a table (check_append kept them in range).
        rotary, rows = None, cache.row_positions  # rows: (B, L) when a batch of requests sits at its own lengths
        if self.config.family == "gpt2":
            x = x + (self.position.weight[offset : offset + L] if rows is None else self.position.weight[rows])
        elif rows is None:
            rotary = (self.cos[offset : offset + L], self.sin[offset : offset + L])  # (L, 1, D) each
        else:
            rotary = (self.cos[rows], self.sin[rows])  # (B, L, 1, D) each: every row at its own positions
        try:  # one transaction: the cache commits all L positions, or rolls back to where it was
            cache.reserve(L)  # paged caches allocate blocks here; nothing was mutated before
            for layer, block in enumerate(self.blocks):
                x = block(x, cache, layer, offset, rotary)
            cache.commit(L)
        except BaseException:  # whatever the failure, Ctrl-C included
            cache.rollback()
            raise
        return self.logits(x), cache

    def logits(self, x: Tensor) -> Tensor:
        """(B, L, C) -> (B, L, V): the final norm and the head."""
        if self.config.family == "gpt2":
            x = F.layer_norm(x, (self.config.width,), self.final.weight, self.final.bias, self.config.norm_eps)
            return F.linear(x, self.head.weight, self.head.bias)
        x = rms_norm(x, self.final.weight, self.config.norm_eps)
        return F.linear(x, self.token.weight if self.head is None else self.head.weight)


def check_token_ids(ids: Tensor, config: DecoderConfig, device: torch.device = torch.device("cpu")) -> tuple[int, int]:
    if not isinstance(ids, Tensor):
        raise ValueError(f"ids must be a LongTensor of shape (batch, length), got {type(ids).__name__}")
    if ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"ids must have dtype int64, got {dtype_name(ids.dtype)}")
    if ids.device != device:  # the embedding would fail later, with a message that names neither device
        raise ValueError(f"ids must be on device {device}, where the model and its caches are, got device {ids.device}")
    if ids.dim() != 2:
        raise ValueError(f"ids must have shape (batch, length), got {ids.dim()} dimensions {tuple(ids.shape)}")
    batch, length = ids.shape
    if batch < 1 or length < 1:
        raise ValueError(f"at least one token is required: expected batch >= 1 and length >= 1, got shape {tuple(ids.shape)}")
    return batch, length


def token_range_message(ids: Tensor, config: DecoderConfig) -> str:
    low, high = int(ids.min()), int(ids.max())
    return f"token ids must be in [0, {config.vocab_size - 1}] for vocab_size {config.vocab_size}, got min {low} and max {high}"


def decoder_with_weights(config: DecoderConfig, weights: dict[str, Tensor]) -> Decoder:
    """A Decoder of `config` holding `weights` (a state dict; the tensors themselves, not copies) in eval mode:
    a trained model's, or another config's of the same shapes (a window added). Nothing is initialised at random
    first: the modules are built on the meta device and the rotary tables computed afterwards."""
    with torch.device("meta"):
        model = Decoder(config)
    model.load_state_dict(weights, strict=True, assign=True)
    if config.family != "gpt2":
        model.cos, model.sin = (table.to(config.dtype) for table in rotary_tables(config, model.device))
    model.eval().requires_grad_(False)
    return model


def build_model(config: DecoderConfig | None = None, seed: int = 0, device: torch.device | str | None = None) -> Decoder:
    """Random weights that depend only on (config, seed), whatever the device: drawn on the CPU, then moved to
    `device` (None: the CPU); eval mode, no gradients."""
    config = config or DecoderConfig()
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ValueError(f"seed must be an integer in [0, 2**63), got {seed!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Decoder(config)
    model = model.to(config.dtype).eval()
    if device is not None:
        model = model.to(device)
    model.requires_grad_(False)
    return model
