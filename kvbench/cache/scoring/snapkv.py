"""snapkv: keep what the last WINDOW queries attend to, pooled over neighbours (Li et al. 2024, arXiv:2404.14469;
kvpress's SnapKVPress: window 64, kernel 5, averaged over the query heads of each key/value head).

The window's own positions are always kept. A prompt no longer than the window is scored by all its queries but
the first (kvpress refuses such a prompt); after the prompt, the window is the newest queries decoded.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from kvbench.cache.scored import ScoredCache, window_weights
from kvbench.kinds import SNAPKV_WINDOW

WINDOW, KERNEL = SNAPKV_WINDOW, 5


class SnapKVCache(ScoredCache):
    kind = "snapkv"
    observation = WINDOW
    protected = WINDOW

    def score(self, layer: int, held: dict) -> Tensor:
        return snap_scores(held, self.config.heads, self.config.kv_heads)


def snap_scores(held: dict, heads: int, kv_heads: int) -> Tensor:
    """(B, KVH, S): each key's weight from the window's queries, pooled and averaged per key/value head; the
    window's own positions get the largest score plus one, as kvpress pads them."""
    S = held["positions"].shape[-1]
    window = min(held["queries"].shape[2], S - 1)
    weights = window_weights(held, heads)[..., -window:, : S - window]  # (B, H, w, S - w)
    B = weights.shape[0]
    scores = F.avg_pool1d(weights.mean(dim=-2), kernel_size=KERNEL, padding=KERNEL // 2, stride=1)
    scores = scores.view(B, kv_heads, heads // kv_heads, S - window).mean(2)
    return F.pad(scores, (0, window), value=scores.max().item() + 1)
