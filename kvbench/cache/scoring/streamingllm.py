"""streamingllm: keep the first SINKS positions and the newest ones (Xiao et al. 2023, arXiv:2309.17453; kvpress's
StreamingLLMPress, n_sink=4). kvbench's window kind does the same on a model whose attention has a window; this is
the same rule as a score on a model without one, as kvpress applies it after the prompt."""

from __future__ import annotations

import torch
from torch import Tensor

from kvbench.cache.scored import ScoredCache

SINKS = 4


class StreamingLLMCache(ScoredCache):
    kind = "streamingllm"
    wants_scores = None
    protected = SINKS  # kv_keep below the sinks would evict a sink

    def score(self, layer: int, held: dict) -> Tensor:
        positions = held["positions"]
        pruned = positions.shape[-1] - self.budget(layer, self.length)
        scores = torch.ones(positions.shape, dtype=held["keys"].dtype, device=positions.device)
        scores[..., SINKS : SINKS + pruned] = 0  # the oldest past the sinks: the entries are oldest first
        return scores
