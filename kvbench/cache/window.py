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

With K attention sinks (``DecoderConfig(window=W, sinks=K)``, StreamingLLM) a sliding layer
keeps K + W slots: positions 0..K-1 in slots 0..K-1 for good, and the ring of W slots after
them for the positions from K on (position p >= K in slot K + (p - K) % W). Once the ring
wraps, a step's keys are no longer contiguous, so the cache hands their positions to the
attention, which keeps the sinks visible.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kvbench.cache.base import Cache
from kvbench.config import DecoderConfig


class WindowCache(Cache):
    kind = "window"

    def __init__(self, config: DecoderConfig, batch: int = 1, capacity: int | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__(config, batch, capacity, device)
        if config.window is None:
            raise ValueError("the window kind needs a model with a sliding window: expected DecoderConfig(window=W), "
                             "got window=None")
        # Slots per layer: the window and the sinks on a sliding layer, every position on the others.
        self.layer_sinks = [config.sinks if window else 0 for window in config.layer_windows]
        self.layer_slots = [min(window + config.sinks if window else self.capacity, self.capacity)
                            for window in config.layer_windows]
        self.slots = min(self.layer_slots)
        shapes = [(batch, config.kv_heads, slots, config.head_dim) for slots in self.layer_slots]
        self._keys = [torch.zeros(shape, dtype=config.dtype, device=self.device) for shape in shapes]
        self._values = [torch.zeros(shape, dtype=config.dtype, device=self.device) for shape in shapes]
        self._overwritten: list[tuple[int, int | Tensor, Tensor, Tensor]] = []  # (layer, slot(s), keys, values)
        self.key_positions = None

    def ring_positions(self, length: int, layer: int | None = None) -> Tensor:
        """Absolute position held by each valid slot of a layer (the first sliding one by default) when
        `length` positions were appended: the sinks', then the ring's."""
        layer = self.layer_slots.index(self.slots) if layer is None else layer
        sinks, size = self.layer_sinks[layer], self.layer_slots[layer] - self.layer_sinks[layer]
        ring = length - sinks  # positions from the sinks on
        if ring <= 0:
            return torch.arange(length, device=self.device)
        slots = torch.arange(min(ring, size), device=self.device)
        return torch.cat((torch.arange(sinks, device=self.device), sinks + ring - 1 - (ring - 1 - slots) % size))

    def slot_of(self, positions: Tensor | int, layer: int):
        """The slot of each position on a layer: its own below the sinks' count, the ring's after."""
        sinks, size = self.layer_sinks[layer], self.layer_slots[layer] - self.layer_sinks[layer]
        if isinstance(positions, int):
            return positions if positions < sinks else sinks + (positions - sinks) % size
        return torch.where(positions < sinks, positions, sinks + (positions - sinks) % size)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        start, new, size = self.length, k.shape[-2], self.layer_slots[layer]
        keys, values = self._keys[layer], self._values[layer]
        sinks = self.layer_sinks[layer]
        if new == 1:  # the decode step
            slot = self.slot_of(start, layer)
            if start >= size:  # overwrites a visible position: keep it until commit (a free slot is invisible)
                self._overwritten.append((layer, slot, keys.narrow(2, slot, 1).clone(), values.narrow(2, slot, 1).clone()))
            keys.narrow(2, slot, 1).copy_(k)
            values.narrow(2, slot, 1).copy_(v)
            # Every slot is visible; but with sinks a wrapped ring's keys are not contiguous: say where they are.
            self.key_positions = self.ring_positions(start + 1, layer) if sinks and start >= size else None
            valid = min(start + 1, size)
            return keys.narrow(2, 0, valid), values.narrow(2, 0, valid)
        before = min(start, size)
        positions = torch.cat((self.ring_positions(start, layer), torch.arange(start, start + new, device=self.device)))
        all_keys = torch.cat((keys.narrow(2, 0, before), k), dim=2)  # (B, KVH, before + new, D)
        all_values = torch.cat((values.narrow(2, 0, before), v), dim=2)
        end = start + new
        device = self.device  # the chunk's sinks, then its last W positions:
        kept = torch.cat((torch.arange(start, max(start, min(sinks, end)), device=device),
                          torch.arange(min(end, max(start, sinks, end - (size - sinks))), end, device=device)))
        slots = self.slot_of(kept, layer)
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

    def positions(self, layer: int = 0) -> Tensor:
        """The positions the ring holds, oldest first (as keys() returns them)."""
        return self.ring_positions(self.length, layer).sort().values

    def keys(self, layer: int = 0) -> Tensor:
        """The last min(T, W) keys of one layer, oldest first."""
        return self._in_order(self._keys, layer)

    def values(self, layer: int = 0) -> Tensor:
        return self._in_order(self._values, layer)

    @property
    def reserved_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self._keys, *self._values))
