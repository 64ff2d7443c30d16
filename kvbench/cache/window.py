"""The window kind: a sliding-window cache that keeps only the last W positions, in a ring buffer.

With a window W (``DecoderConfig(window=W)``) a query at position p sees keys p-W+1..p,
so nothing older needs to be kept. Each layer has a ring of its own: W slots on a sliding
layer, as many slots as the capacity on a layer that sees every position (a Gemma-2-style
model's other half), where the ring never wraps. Position p lives in slot p % slots. A
one-token step writes its slot (over position p - W, which no query from p on can see)
and attends to the valid slots as they lie: attention over a set of keys does not depend
on their order and every slot is visible, so no mask is built. A chunk of several tokens
attends to the ring before it plus the chunk, with the mask built from absolute
positions, then keeps the chunk's last W positions. Keys arrive rotated (the llama
family's RoPE is applied before update), so a slot holds its position's rotated key
whatever slot it lands in. Bytes stay at W positions per sliding layer, whatever the length.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kvbench.cache.base import Cache
from kvbench.config import DecoderConfig


class WindowCache(Cache):
    kind = "window"

    def __init__(self, config: DecoderConfig, batch: int = 1, capacity: int | None = None) -> None:
        super().__init__(config, batch, capacity)
        if config.window is None:
            raise ValueError("the window kind needs a model with a sliding window: expected DecoderConfig(window=W), "
                             "got window=None")
        # Slots per layer: the window on a sliding layer, every position on the others.
        self.layer_slots = [min(window or self.capacity, self.capacity) for window in config.layer_windows]
        self.slots = min(self.layer_slots)
        shapes = [(batch, config.kv_heads, slots, config.head_dim) for slots in self.layer_slots]
        self._keys = [torch.zeros(shape, dtype=config.dtype) for shape in shapes]
        self._values = [torch.zeros(shape, dtype=config.dtype) for shape in shapes]
        self._overwritten: list[tuple[int, int | Tensor, Tensor, Tensor]] = []  # (layer, slot(s), keys, values)
        self.key_positions = None

    def ring_positions(self, length: int, layer: int | None = None) -> Tensor:
        """Absolute position held by each valid slot of a layer (the first sliding one by default) when
        `length` positions were appended."""
        size = self.slots if layer is None else self.layer_slots[layer]
        slots = torch.arange(min(length, size))
        return length - 1 - (length - 1 - slots) % size

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        start, new, size = self.length, k.shape[-2], self.layer_slots[layer]
        keys, values = self._keys[layer], self._values[layer]
        if new == 1:  # the decode step
            slot = start % size
            if start >= size:  # overwrites a visible position: keep it until commit (a free slot is invisible)
                self._overwritten.append((layer, slot, keys.narrow(2, slot, 1).clone(), values.narrow(2, slot, 1).clone()))
            keys.narrow(2, slot, 1).copy_(k)
            values.narrow(2, slot, 1).copy_(v)
            self.key_positions = None
            valid = min(start + 1, size)
            return keys.narrow(2, 0, valid), values.narrow(2, 0, valid)
        before = min(start, size)
        positions = torch.cat((self.ring_positions(start, layer), torch.arange(start, start + new)))
        all_keys = torch.cat((keys.narrow(2, 0, before), k), dim=2)  # (B, KVH, before + new, D)
        all_values = torch.cat((values.narrow(2, 0, before), v), dim=2)
        kept = torch.arange(max(start, start + new - size), start + new)  # the chunk's last W positions
        slots = kept % size
        self._overwritten.append((layer, slots, keys.index_select(2, slots), values.index_select(2, slots)))
        keys.index_copy_(2, slots, k[:, :, kept - start])
        values.index_copy_(2, slots, v[:, :, kept - start])
        self.key_positions = positions if start > size else None  # before the ring wraps they are 0..T-1
        return all_keys, all_values

    def commit(self, length: int) -> None:
        self._overwritten = []
        super().commit(length)

    def rollback(self) -> None:
        """Put back the slots the failed append wrote over."""
        for layer, slots, keys, values in reversed(self._overwritten):
            for buffer, saved in ((self._keys[layer], keys), (self._values[layer], values)):
                if isinstance(slots, int):  # one decode step's slot
                    buffer.narrow(2, slots, 1).copy_(saved)
                else:
                    buffer.index_copy_(2, slots, saved)
        self._overwritten = []
        self.key_positions = None

    def _in_order(self, buffers: list[Tensor], layer: int) -> Tensor:
        order = torch.argsort(self.ring_positions(self.length, layer))
        return buffers[layer].index_select(2, order)

    def keys(self, layer: int = 0) -> Tensor:
        """The last min(T, W) keys of one layer, oldest first."""
        return self._in_order(self._keys, layer)

    def values(self, layer: int = 0) -> Tensor:
        return self._in_order(self._values, layer)

    @property
    def reserved_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self._keys, *self._values))
