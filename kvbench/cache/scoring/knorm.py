"""knorm: keep the keys of smallest L2 norm (Devoto et al. 2024, arXiv:2406.11430; kvpress's KnormPress).

Keys with a low norm draw more attention in trained models, so a large norm is what goes first. It reads the
keys only: no attention is computed for it.
"""

from __future__ import annotations

from torch import Tensor

from kvbench.cache.scored import ScoredCache


class KnormCache(ScoredCache):
    kind = "knorm"
    wants_scores = None

    def score(self, layer: int, held: dict) -> Tensor:
        return -held["keys"].norm(dim=-1)
