"""What every cache kind shares: ownership of one request, its length, its checks, its protocol.

``Decoder.forward`` drives every kind through the same four calls:

    cache.check_append(config, batch, length)  # validate; raises ValueError, mutates nothing
    cache.reserve(length)                      # claim storage (paged allocates blocks here)
    k, v = cache.update(layer, k_new, v_new)   # per layer: stage new positions, return 0..T-1
    cache.commit(length)                       # the new positions become valid
    cache.rollback()                           # instead of commit, on any failure after reserve

Until ``commit`` the valid prefix is untouched and ``rollback`` undoes what ``reserve`` and
``update`` did, so a rejected or failed call leaves the cache exactly as it was. ``release()`` ends the request (a pool takes its blocks back; other
kinds have nothing to return). Shapes: (B, KVH, T, D) = batch, key/value heads, positions,
head width.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kvbench.config import DecoderConfig, positive_int
from kvbench.kinds import expected_cache_bytes

__all__ = ["Cache", "ceil_div", "expected_cache_bytes"]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class Cache:
    """What every kind shares: ownership of one request, its length and its checks."""

    kind = "abstract"  # the name of its mode (kvbench.modes), whose spec says what the gate and memory expect of it
    key_positions: Tensor | None = None  # absolute positions of the keys update() returned, when not 0..T-1
    # A batch of requests at their own lengths (kvbench.cache.batch) sets both; one request leaves them None.
    row_positions: Tensor | None = None  # (B, L) absolute position of every new token, row by row
    key_mask: Tensor | None = None  # (B, 1, L, S) True where a query may attend: each row's own keys, no padding
    device = torch.device("cpu")  # where its storage lives: the model's device (make_cache(..., device=))

    def __init__(self, config: DecoderConfig, batch: int = 1, capacity: int | None = None,
                 device: torch.device | str | None = None) -> None:
        capacity = config.max_length if capacity is None else capacity
        positive_int("batch", batch)
        if isinstance(capacity, bool) or not isinstance(capacity, int) or not 1 <= capacity <= config.max_length:
            raise ValueError(f"capacity must be an integer in [1, max_length={config.max_length}], got {capacity!r}")
        self.config = config
        self.batch = batch
        self.capacity = capacity
        self.length = 0
        # As torch places a tensor ("cuda" is "cuda:0"), so that it compares equal to the model's parameters' device.
        self.device = torch.empty(0, device="cpu" if device is None else device).device

    def check_append(self, config: DecoderConfig, batch: int, length: int) -> None:
        """Raise ValueError (naming expected and actual) unless `length` positions can be appended."""
        mine = self.config
        if config is not mine and config != mine:  # identity first: the per-step common case
            for name in ("layers", "kv_heads", "head_dim", "dtype"):
                expected, actual = getattr(mine, name), getattr(config, name)
                if expected != actual:
                    raise ValueError(f"cache {name} mismatch: cache was built with {name}={expected}, model has {name}={actual}")
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

    def rollback(self) -> None:
        """Forget a reserved append that failed. Writes beyond the valid prefix are invisible,
        so a kind that only writes there has nothing to undo."""

    def release(self) -> None:
        """End the request. Only a pool-backed kind has storage to give back; here nothing."""

    @property
    def quantized_positions(self) -> int | None:
        """Positions held in a quantized representation; None for a kind that keeps every position as given."""
        return None

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
