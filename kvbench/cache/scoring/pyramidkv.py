"""pyramidkv: SnapKV's scores with more positions kept in lower layers than in higher ones (Cai et al. 2024,
arXiv:2406.02069; kvpress's PyramidKVPress: window 64, beta 20, the same total as SnapKV at the same ratio:
kvbench.kinds.pyramid_budget)."""

from __future__ import annotations

from torch import Tensor

from kvbench.cache.scored import ScoredCache
from kvbench.cache.scoring.snapkv import WINDOW, snap_scores
from kvbench.kinds import pyramid_budget


class PyramidKVCache(ScoredCache):
    kind = "pyramidkv"
    observation = WINDOW
    protected = WINDOW
    pyramid = True

    def score(self, layer: int, held: dict) -> Tensor:
        return snap_scores(held, self.config.heads, self.config.kv_heads)

    def budget(self, layer: int, length: int) -> int:
        return pyramid_budget(layer, self.config.layers, length, self.evict_ratio, self.kv_keep)
