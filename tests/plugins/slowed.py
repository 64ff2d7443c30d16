"""A cache kind made slower on purpose: kvbench must call it slower, and say by how much.

`slowed` is the static cache plus a fixed wait at every append of every layer, as if its
write kernel were slow. The wait is wall time (a spin on the clock), so it costs the
same whether or not the machine is busy; the slowdown it causes over `static` is measured
in the same rotations of the same runs (scripts/reproducibility.py) and must lie inside
the interval `kvbench compare --pair slowed=static` gives between two runs.

    kvbench run --plugin tests/plugins/slowed.py --modes full,concat,static,paged,slowed
"""

import time

from kvbench.cache import StaticCache, register_kind

WAIT_NS = 60_000  # per layer per append: about a fifth of a seed-lab decode step here


class SlowedCache(StaticCache):
    kind = "slowed"

    def update(self, layer, k, v):
        until = time.perf_counter_ns() + WAIT_NS
        while time.perf_counter_ns() < until:
            pass
        return super().update(layer, k, v)


register_kind("slowed", SlowedCache)
