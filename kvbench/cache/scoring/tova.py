"""tova: keep what the newest query attends to most, its weights averaged over every query head (Oren et al.
2024, arXiv:2401.06104; kvpress's TOVAPress: one score for all key/value heads, the newest position kept)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from kvbench.cache.scored import ScoredCache, window_weights


class TovaCache(ScoredCache):
    kind = "tova"
    observation = 1
    protected = 1

    def score(self, layer: int, held: dict) -> Tensor:
        weights = window_weights(held, self.config.heads)[..., -1, :-1]  # (B, H, S - 1): the newest key left out
        scores = weights.mean(dim=1, keepdim=True).expand(-1, self.config.kv_heads, -1)
        return F.pad(scores, (0, 1), value=scores.max().item() + 1)  # the newest key is always kept
