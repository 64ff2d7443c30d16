"""h2o: keep the positions that have drawn the most attention, each key's total divided by the queries that saw
it (Zhang et al. 2023, arXiv:2306.14048, "heavy hitters"; kvpress's ObservedAttentionPress, which needs eager
attention there). It asks the model for every step's summed weights and keeps a running total per key."""

from __future__ import annotations

from torch import Tensor

from kvbench.attention import SUMMED
from kvbench.cache.scored import ScoredCache


class H2OCache(ScoredCache):
    kind = "h2o"
    wants_scores = SUMMED  # (B, KVH, S) per step, summed over its queries and each head's query heads

    def score(self, layer: int, held: dict) -> Tensor:
        seen = (self.length - held["positions"]).to(held["totals"].dtype)  # the queries at p..length-1 saw p
        return held["totals"] / seen / (self.config.heads // self.config.kv_heads)
