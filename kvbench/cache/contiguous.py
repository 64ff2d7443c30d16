"""Contiguous kinds: the source document's concatenating cache and a preallocated static one."""

from __future__ import annotations

import torch
from torch import Tensor

from kvbench.cache.base import Cache
from kvbench.config import DecoderConfig


class ConcatCache(Cache):
    """The source document's cache: torch.cat on every append, copying the prefix each time."""

    kind = "concat"

    def __init__(self, config: DecoderConfig, batch: int = 1, capacity: int | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__(config, batch, capacity, device)
        empty = torch.empty(batch, config.kv_heads, 0, config.head_dim, dtype=config.dtype, device=self.device)
        self._keys = [empty] * config.layers
        self._values = [empty] * config.layers
        # New tensors are staged and swapped in by commit(), so a call that fails
        # part-way leaves the valid prefix untouched.
        self._staged_keys: list[Tensor] = list(self._keys)
        self._staged_values: list[Tensor] = list(self._values)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self.length == 0:
            k, v = k.contiguous(), v.contiguous()  # don't retain the whole qkv projection
        else:
            k = torch.cat((self._keys[layer], k), dim=-2)
            v = torch.cat((self._values[layer], v), dim=-2)
        self._staged_keys[layer], self._staged_values[layer] = k, v
        return k, v

    def commit(self, length: int) -> None:
        self._keys, self._staged_keys = self._staged_keys, list(self._staged_keys)
        self._values, self._staged_values = self._staged_values, list(self._staged_values)
        super().commit(length)

    def rollback(self) -> None:
        self._staged_keys, self._staged_values = list(self._keys), list(self._values)

    def keys(self, layer: int = 0) -> Tensor:
        return self._keys[layer]

    def values(self, layer: int = 0) -> Tensor:
        return self._values[layer]

    @property
    def reserved_bytes(self) -> int:
        return self.nbytes


class StaticCache(Cache):
    """Preallocated (B, KVH, capacity, D) per layer, written in place; reads see only 0..T-1."""

    kind = "static"

    def __init__(self, config: DecoderConfig, batch: int = 1, capacity: int | None = None, spare: int = 0,
                 device: torch.device | str | None = None) -> None:
        super().__init__(config, batch, capacity, device)
        # `spare` positions beyond the capacity are never valid (kvbench.models.compiled: no span is the whole buffer)
        shape = (batch, config.kv_heads, self.capacity + spare, config.head_dim)
        self._key_buffers = [torch.zeros(shape, dtype=config.dtype, device=self.device) for _ in range(config.layers)]
        self._value_buffers = [torch.zeros(shape, dtype=config.dtype, device=self.device) for _ in range(config.layers)]

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        start, new = self.length, k.shape[-2]
        keys, values = self._key_buffers[layer], self._value_buffers[layer]
        keys.narrow(2, start, new).copy_(k)  # beyond the valid prefix: invisible until commit
        values.narrow(2, start, new).copy_(v)
        return keys.narrow(2, 0, start + new), values.narrow(2, 0, start + new)

    def buffers(self, layer: int) -> tuple[Tensor, Tensor]:
        """One layer's whole key and value storage (B, KVH, capacity, D), for a step that writes it in place
        (kvbench.models.compiled); positions from `length` on are not valid."""
        return self._key_buffers[layer], self._value_buffers[layer]

    def keys(self, layer: int = 0) -> Tensor:
        return self._key_buffers[layer][:, :, : self.length]

    def values(self, layer: int = 0) -> Tensor:
        return self._value_buffers[layer][:, :, : self.length]

    @property
    def reserved_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self._key_buffers, *self._value_buffers))
