"""The evicting worked example of docs/extending.md: a kind that drops every other position past a threshold.

`thinned` keeps the first THRESHOLD positions and, past them, only the even ones: each odd position is
dropped when the step that appended it commits (its own query saw it; no later one does). Its one method is
the policy (`choose`); kvbench.cache.evicting keeps the retained positions and hands attention their absolute
positions, so the mask and the rotary angles come from them. Its mechanics are exact: the gate holds it to
the full path masked to exactly the positions it kept (`evicts=True`); what dropping them does to the text is
what the quality workload measures.

    kvbench run --plugin tests/plugins/thinned.py --modes full,static,thinned --lengths 64,256
"""

from kvbench import modes
from kvbench.cache import EvictingCache

THRESHOLD = 8


class ThinnedCache(EvictingCache):
    kind = "thinned"

    def choose(self, layer, positions, scores):
        return positions[(positions >= THRESHOLD) & (positions % 2 == 1)]


def thinned_bytes(config, batch, length, **options):
    """Keys and values of the positions kept (the first THRESHOLD, then the even ones), and each one's int64
    position in every layer."""
    kept = min(length, THRESHOLD) + max(0, (length + 1) // 2 - (THRESHOLD + 1) // 2)
    return config.layers * kept * (2 * batch * config.kv_heads * config.head_dim * config.element_bytes + 8)


modes.register(modes.ModeSpec("thinned", modes.PLUGIN, cache=ThinnedCache, bytes=thinned_bytes,
                              keeps_every_position=False, evicts=True, serving=modes.RESERVE))
