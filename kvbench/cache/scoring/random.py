"""random: keep a seeded random subset of each head's positions, the control every method must beat (kvpress's
RandomPress with seed=0: the same draws, since both draw the scores' shape from a generator seeded anew)."""

from __future__ import annotations

import torch
from torch import Tensor

from kvbench.cache.scored import ScoredCache

SEED = 0


class RandomCache(ScoredCache):
    kind = "random"
    wants_scores = None

    def score(self, layer: int, held: dict) -> Tensor:
        keys = held["keys"]
        # Seeded anew at each compression, as kvpress does; a later one (--evict-every) draws afresh.
        generator = torch.Generator().manual_seed(SEED + self.decode_steps)
        return torch.rand(*keys.shape[:-1], generator=generator, dtype=keys.dtype, device="cpu").to(keys.device)
