"""Key/value caches: one request's retained keys and values, held by the caller.

Every kind implements the same small protocol, which ``Decoder.forward`` drives:

    cache.check_append(config, batch, length)  # validate; raises ValueError, mutates nothing
    cache.reserve(length)                      # claim storage (paged allocates blocks here)
    k, v = cache.update(layer, k_new, v_new)   # per layer: stage new positions, return 0..T-1
    cache.commit(length)                       # the new positions become valid

Until ``commit`` the valid prefix is untouched, so a rejected call leaves the cache
exactly as it was. Shapes: (B, KVH, T, D) = batch, key/value heads, positions, head width.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from kvbench.model import DecoderConfig

CACHE_KINDS = ("concat", "static", "paged")


def expected_cache_bytes(config: DecoderConfig, batch: int, length: int) -> int:
    """Key plus value element storage for `length` positions: 2 * layers * B * KVH * T * D * elt."""
    element = torch.empty((), dtype=config.dtype).element_size()
    return 2 * config.layers * batch * config.kv_heads * length * config.head_dim * element


class Cache:
    """What every kind shares: ownership of one request, its length and its checks."""

    kind = "abstract"

    def __init__(self, config: DecoderConfig, batch: int = 1, capacity: int | None = None) -> None:
        capacity = config.max_length if capacity is None else capacity
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a positive integer, got {batch!r}")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or not 1 <= capacity <= config.max_length:
            raise ValueError(f"capacity must be an integer in [1, max_length={config.max_length}], got {capacity!r}")
        self.config = config
        self.batch = batch
        self.capacity = capacity
        self.length = 0

    def check_append(self, config: DecoderConfig, batch: int, length: int) -> None:
        """Raise ValueError (naming expected and actual) unless `length` positions can be appended."""
        mine = self.config
        for name in ("layers", "kv_heads", "head_dim", "dtype"):
            expected, actual = getattr(mine, name), getattr(config, name)
            if expected != actual:
                raise ValueError(f"cache {name} mismatch: cache was built with {name}={expected}, model has {name}={actual}")
        if mine != config:
            raise ValueError(f"cache was built for another model config: cache has {mine}, model has {config}")
        if batch != self.batch:
            raise ValueError(f"cache batch mismatch: cache holds batch {self.batch}, ids have batch {batch}")
        if self.length + length > self.capacity:
            raise ValueError(
                f"position capacity exceeded: cache holds {self.length} of {self.capacity} positions, "
                f"appending {length} needs {self.length + length}"
            )

    def reserve(self, length: int) -> None:
        self._staged = length

    def commit(self, length: int) -> None:
        self.length += length

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def keys(self, layer: int = 0) -> Tensor:
        """Valid keys of one layer, (B, KVH, T, D)."""
        raise NotImplementedError

    def values(self, layer: int = 0) -> Tensor:
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        """Bytes of key/value elements at valid positions, counted from the tensors."""
        return sum(
            t.numel() * t.element_size()
            for layer in range(self.config.layers)
            for t in (self.keys(layer), self.values(layer))
        )

    @property
    def reserved_bytes(self) -> int:
        """Bytes of key/value storage this cache holds, valid or not (>= nbytes)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(batch={self.batch}, length={self.length}, capacity={self.capacity})"


class ConcatCache(Cache):
    """The source document's cache: torch.cat on every append, copying the prefix each time."""

    kind = "concat"

    def __init__(self, config: DecoderConfig, batch: int = 1, capacity: int | None = None) -> None:
        super().__init__(config, batch, capacity)
        empty = torch.empty(batch, config.kv_heads, 0, config.head_dim, dtype=config.dtype)
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

    def __init__(self, config: DecoderConfig, batch: int = 1, capacity: int | None = None) -> None:
        super().__init__(config, batch, capacity)
        shape = (batch, config.kv_heads, self.capacity, config.head_dim)
        self._key_buffers = [torch.zeros(shape, dtype=config.dtype) for _ in range(config.layers)]
        self._value_buffers = [torch.zeros(shape, dtype=config.dtype) for _ in range(config.layers)]

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        start, end = self.length, self.length + k.shape[-2]
        keys, values = self._key_buffers[layer], self._value_buffers[layer]
        keys[:, :, start:end] = k  # beyond the valid prefix: invisible until commit
        values[:, :, start:end] = v
        return keys[:, :, :end], values[:, :, :end]

    def keys(self, layer: int = 0) -> Tensor:
        return self._key_buffers[layer][:, :, : self.length]

    def values(self, layer: int = 0) -> Tensor:
        return self._value_buffers[layer][:, :, : self.length]

    @property
    def reserved_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self._key_buffers, *self._value_buffers))


def make_cache(kind: str, config: DecoderConfig, batch: int = 1, capacity: int | None = None, **options) -> Cache:
    """A fresh, empty cache of `kind` for one request of `batch` sequences."""
    if kind == "concat":
        return ConcatCache(config, batch, capacity, **options)
    if kind == "static":
        return StaticCache(config, batch, capacity, **options)
    if kind == "paged":
        from kvbench.paged import PagedCache

        return PagedCache(config, batch, capacity, **options)
    raise ValueError(f"cache kind must be one of {list(CACHE_KINDS)}, got {kind!r}")
