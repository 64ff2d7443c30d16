"""The quantized kinds: keys and values stored as int8 or int4 with their scales, KIVI-style.

KIVI (Liu et al. 2024, "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache")
quantizes keys per channel -- their outliers sit in a few channels, so each channel of a
group of `group_size` tokens gets its own scale -- and values per token, over groups of
channels. The newest positions stay in full precision (at least `residual` of them): a
group of `group_size` tokens is quantized once it is no longer among the newest, so the
store only ever grows by whole groups and a quantized value is never quantized twice.

Quantization is asymmetric min-max: q = round((x - min) / scale), scale = (max - min) /
(2^bits - 1), and x ~ q * scale + min. Scales and minimums are float16 (as in KIVI);
int4 packs two values per byte. Attention reads dequantized keys and values, rebuilt from
the store at every step: eager PyTorch has no kernel that attends to int8 directly, so
that rebuild is the time this layout pays for its bytes, and its transient copy shows in
peak memory, not in the retained bytes.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from kvbench import modes
from kvbench.cache.base import Cache
from kvbench.config import DecoderConfig
from kvbench.kinds import GROUP_SIZE, RESIDUAL, check_quantized_options

SCALE_DTYPE = torch.float16  # kvbench.kinds.SCALE_BYTES each


class QuantizedCache(Cache):
    """Keys per channel and values per token in `bits`-bit integers, the newest positions in full precision."""

    kind = "quantized-int8"
    bits = modes.SPECS[kind].bits  # the spec also holds its drift limits, by family

    def __init__(self, config: DecoderConfig, batch: int = 1, capacity: int | None = None,
                 group_size: int = GROUP_SIZE, residual: int = RESIDUAL, recent_positions: int | None = None,
                 device: torch.device | str | None = None) -> None:
        """`recent_positions`: how many full-precision positions to allocate up front (default, and at least,
        min(capacity, residual + group_size)). A chunk appended to a window that cannot take it grows the window
        for good, so a server that prefills long chunks passes the peak its chunk rule reaches
        (kvbench.admission.quantized_window): then what it reserves is what the cache allocates, from the start."""
        super().__init__(config, batch, capacity, device)
        self.drift_limits = modes.spec(self.kind).limits_for(config)  # this cache's model's family's
        check_quantized_options(self.bits, config.head_dim, group_size, residual)
        least = min(self.capacity, residual + group_size)
        recent_positions = least if recent_positions is None else recent_positions
        if isinstance(recent_positions, bool) or not isinstance(recent_positions, int) or not (
                least <= recent_positions <= self.capacity):
            raise ValueError(f"recent_positions must be an integer in [{least}, capacity {self.capacity}], "
                             f"got {recent_positions!r}")
        D = config.head_dim
        self.group_size, self.residual = group_size, residual
        self.value_group = math.gcd(group_size, D)
        self.levels = 2**self.bits - 1
        stored = group_size * max(0, (self.capacity - residual) // group_size)
        lead = (config.layers, batch, config.kv_heads)
        packed = D * self.bits // 8
        self._key_codes = torch.zeros(*lead, stored, packed, dtype=torch.uint8, device=self.device)
        self._value_codes = torch.zeros(*lead, stored, packed, dtype=torch.uint8, device=self.device)
        self._key_scales = torch.zeros(*lead, stored // group_size, 2, D, dtype=SCALE_DTYPE,
                                       device=self.device)  # [scale, minimum]
        self._value_scales = torch.zeros(*lead, stored, D // self.value_group, 2, dtype=SCALE_DTYPE,
                                         device=self.device)
        self._recent = torch.zeros(*lead, 2, recent_positions, D, dtype=config.dtype, device=self.device)
        self.quantized = 0  # positions in the integer store; the rest (length - quantized) are recent

    # -- the protocol ---------------------------------------------------------------------

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Stage the new positions among the recent ones; return every position, dequantized."""
        recent, new = self.length - self.quantized, k.shape[-2]
        if recent + new > self._recent.shape[-2]:  # a long chunk: grow, keeping what is committed
            grown = torch.zeros(*self._recent.shape[:-2], recent + new, self._recent.shape[-1],
                                dtype=self._recent.dtype, device=self.device)
            grown[..., :recent, :] = self._recent[..., :recent, :]
            self._recent = grown
        self._recent[layer, :, :, 0, recent : recent + new] = k  # beyond the committed ones: invisible until commit
        self._recent[layer, :, :, 1, recent : recent + new] = v
        return self._read(layer, self.length + new)

    def commit(self, length: int) -> None:
        """The new positions are valid; whole groups that are no longer among the newest get quantized."""
        total = self.length + length
        groups = max(0, (total - self.quantized - self.residual) // self.group_size)
        if groups:
            self._quantize(self.quantized, groups * self.group_size)
        super().commit(length)

    # -- reading --------------------------------------------------------------------------

    def _read(self, layer: int, end: int) -> tuple[Tensor, Tensor]:
        """Positions 0..end-1 of one layer as (B, KVH, end, D) keys and values in the model's dtype."""
        B, KVH, D, stored = self.batch, self.config.kv_heads, self.config.head_dim, self.quantized
        keys = torch.empty(B, KVH, end, D, dtype=self.config.dtype, device=self.device)
        values = torch.empty(B, KVH, end, D, dtype=self.config.dtype, device=self.device)
        if stored:
            self._dequantize_keys(layer, stored, keys[:, :, :stored])
            self._dequantize_values(layer, stored, values[:, :, :stored])
        keys[:, :, stored:] = self._recent[layer, :, :, 0, : end - stored]
        values[:, :, stored:] = self._recent[layer, :, :, 1, : end - stored]
        return keys, values

    def keys(self, layer: int = 0) -> Tensor:
        """Valid keys of one layer, as attention sees them (dequantized)."""
        return self._read(layer, self.length)[0]

    def values(self, layer: int = 0) -> Tensor:
        return self._read(layer, self.length)[1]

    @property
    def nbytes(self) -> int:
        """Integer codes, scales and minimums of the quantized positions, and the recent ones, from the tensors."""
        stored, groups = self.quantized, self.quantized // self.group_size
        parts = (self._key_codes[..., :stored, :], self._value_codes[..., :stored, :],
                 self._key_scales[..., :groups, :, :], self._value_scales[..., :stored, :, :],
                 self._recent[..., : self.length - stored, :])
        return sum(part.numel() * part.element_size() for part in parts)

    @property
    def quantized_positions(self) -> int:
        """Positions in the integer store; the newest (length - this) are still in full precision."""
        return self.quantized

    @property
    def reserved_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self._key_codes, self._value_codes, self._key_scales,
                                                          self._value_scales, self._recent))

    # -- the codes ------------------------------------------------------------------------

    def _quantize(self, start: int, count: int) -> None:
        """Move recent positions [0, count) of every layer into the store at [start, start + count)."""
        G, D = self.group_size, self.config.head_dim
        recent = self._recent[..., :count, :].float()  # (layers, B, KVH, 2, count, D)
        keys = recent[..., 0, :, :].unflatten(-2, (count // G, G))  # per channel over G tokens
        low, high = keys.amin(dim=-2, keepdim=True), keys.amax(dim=-2, keepdim=True)
        scale, low = self._scales(low, high)
        self._key_scales[..., start // G : (start + count) // G, 0, :] = scale.squeeze(-2).to(SCALE_DTYPE)
        self._key_scales[..., start // G : (start + count) // G, 1, :] = low.squeeze(-2).to(SCALE_DTYPE)
        self._key_codes[..., start : start + count, :] = self._pack(self._codes(keys, scale, low).flatten(-3, -2))
        values = recent[..., 1, :, :].unflatten(-1, (D // self.value_group, self.value_group))  # per token
        low, high = values.amin(dim=-1, keepdim=True), values.amax(dim=-1, keepdim=True)
        scale, low = self._scales(low, high)
        self._value_scales[..., start : start + count, :, 0] = scale.squeeze(-1).to(SCALE_DTYPE)
        self._value_scales[..., start : start + count, :, 1] = low.squeeze(-1).to(SCALE_DTYPE)
        self._value_codes[..., start : start + count, :] = self._pack(self._codes(values, scale, low).flatten(-2))
        kept = self._recent[..., count:, :].clone()  # the rest of the recent positions move to the front
        self._recent[..., : kept.shape[-2], :] = kept
        self.quantized = start + count

    def _scales(self, low: Tensor, high: Tensor) -> tuple[Tensor, Tensor]:
        """float16-rounded scale and minimum, so that quantizing and dequantizing use the same numbers."""
        scale = ((high - low) / self.levels).to(SCALE_DTYPE).float().clamp_min(torch.finfo(SCALE_DTYPE).tiny)
        return scale, low.to(SCALE_DTYPE).float()

    def _codes(self, x: Tensor, scale: Tensor, low: Tensor) -> Tensor:
        return ((x - low) / scale).round_().clamp_(0, self.levels).to(torch.uint8)

    def _pack(self, codes: Tensor) -> Tensor:
        """(…, D) codes to (…, D * bits / 8) bytes: int4 puts an even channel low, the next high."""
        if self.bits == 8:
            return codes
        pairs = codes.unflatten(-1, (-1, 2))
        return pairs[..., 0] | (pairs[..., 1] << 4)

    def _unpack(self, packed: Tensor) -> Tensor:
        if self.bits == 8:
            return packed
        return torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2)

    def _dequantize_keys(self, layer: int, stored: int, out: Tensor) -> None:
        G = self.group_size
        codes = self._unpack(self._key_codes[layer, ..., :stored, :]).unflatten(-2, (stored // G, G))
        scales = self._key_scales[layer, ..., : stored // G, :, :].to(out.dtype)  # (B, KVH, groups, 2, D)
        scale, low = scales[..., 0:1, :], scales[..., 1:2, :]
        torch.addcmul(low, codes.to(out.dtype), scale, out=out.unflatten(-2, (stored // G, G)))

    def _dequantize_values(self, layer: int, stored: int, out: Tensor) -> None:
        codes = self._unpack(self._value_codes[layer, ..., :stored, :]).unflatten(-1, (-1, self.value_group))
        scales = self._value_scales[layer, ..., :stored, :, :].to(out.dtype)  # (B, KVH, stored, groups, 2)
        scale, low = scales[..., 0:1], scales[..., 1:2]
        torch.addcmul(low, codes.to(out.dtype), scale, out=out.unflatten(-1, (-1, self.value_group)))


class QuantizedInt4Cache(QuantizedCache):
    kind = "quantized-int4"
    bits = modes.SPECS[kind].bits
