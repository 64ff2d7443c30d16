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

Positions. ``length`` counts the positions appended, so the next token's position (its rotary angle, its
learned embedding) is ``length`` whatever a kind still holds. A kind that keeps fewer (the window kind's
ring, an evicting kind) says which absolute position each retained key has: ``positions(layer)`` for the
valid keys, ``key_positions`` for the keys ``update`` just returned, from which attention builds its mask.
Nothing reads a position from an index into the cache.

Eviction (kvbench.cache.evicting): a kind that scores its positions sets ``wants_scores`` ("summed" or
"weights", kvbench.attention.SCORES) and the model hands it the attention weights through ``observe``
after each layer's attention; ``evict(positions)`` drops retained positions. Every other kind leaves
``wants_scores`` None, so the model computes no weights for it, and refuses ``evict``.
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
    # and, when every row's keys are its positions 0..T-1 in order, each row's T: a decode step attends to each
    # row's own keys alone instead of the padded rectangle (kvbench.attention.causal_attention)
    key_lengths: tuple[int, ...] | None = None
    device = torch.device("cpu")  # where its storage lives: the model's device (make_cache(..., device=))
    wants_scores: str | None = None  # "summed" or "weights": the attention weights observe() receives (None: none)

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

    def observe(self, layer: int, scores: Tensor) -> None:
        """The attention weights of the keys update(layer) returned (kvbench.attention.attention_scores, in the
        summary wants_scores asks for); called only when wants_scores is set."""
        raise NotImplementedError(f"cache kind {self.kind!r} asks for attention scores but does not observe them")

    def positions(self, layer: int = 0) -> Tensor:
        """The absolute position of each valid key of one layer, in the order keys(layer) holds them: (T,) long.
        A kind that keeps every position holds 0..length-1."""
        return torch.arange(self.length, device=self.device)

    def evict(self, positions, layer: int | None = None) -> None:
        """Drop retained `positions` (absolute) from one layer, or every layer when `layer` is None. Only an
        evicting kind can; the others keep every position they are given."""
        raise ValueError(f"cache kind {self.kind!r} keeps every position: expected an evicting kind "
                         "(kvbench.cache.evicting.EvictingCache), got one that cannot evict")

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
