"""The full-prefix path made slower on purpose, the machine left alone: a change in the shared path.

Loading this plugin slows every model call that starts a fresh request (no cache passed in),
which is every step of `full` and none of a cached mode's steps, by a fixed spin of wall time
per call. `kvbench compare` of a run without it against a run with it must say that `full`
changed while the machine probe did not, and call `full` slower. It registers a kind
(`slowfull`, the static cache unchanged) because a plugin must register one.

    kvbench run --plugin tests/plugins/slow_full.py --modes full,concat,static
"""

import time

from kvbench.cache import StaticCache, register_kind
from kvbench.model import Decoder

WAIT_NS = 200_000  # per full-prefix call: several times a seed-lab step at short lengths

_forward = Decoder.forward


def forward(self, ids, cache=None):
    if cache is None:
        until = time.perf_counter_ns() + WAIT_NS
        while time.perf_counter_ns() < until:
            pass
    return _forward(self, ids, cache)


Decoder.forward = forward


class SlowFullMarker(StaticCache):
    kind = "slowfull"


register_kind("slowfull", SlowFullMarker)
