"""An evicting kind that takes `evict_ratio`, as kvpress-style presses do: when the prompt's step commits, it
drops the oldest `evict_ratio` of the prompt's positions and keeps everything after. It stands in for a scored
press where a test needs several ratios of one kind (the needle's safe-ratio rule) before those kinds exist:
a needle at depth 0 is lost at any ratio, one at depth 100 never.

    kvbench run --model smollm2-135m --plugin tests/plugins/oldest.py --modes full,oldest \\
        --needle 256 --needle-depths 0,100 --needle-ratios 0.25,0.5
"""

from kvbench import modes
from kvbench.cache import EvictingCache


class OldestCache(EvictingCache):
    kind = "oldest"

    def __init__(self, config, batch=1, capacity=None, device=None, evict_ratio=0.5):
        if not 0 <= evict_ratio < 1:
            raise ValueError(f"evict_ratio must be in [0, 1), got {evict_ratio!r}")
        super().__init__(config, batch, capacity, device=device)
        self.evict_ratio = evict_ratio

    def choose(self, layer, positions, scores):
        if self.length:  # only the prompt's step: later ones keep what they add
            return None
        return positions[: int(self.evict_ratio * len(positions))]


modes.register(modes.ModeSpec("oldest", modes.PLUGIN, cache=OldestCache, options=("evict_ratio",), bytes=None,
                              keeps_every_position=False, evicts=True))
