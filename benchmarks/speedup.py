"""What a cache saves, measured by kvbench's own sampling protocol inside one process.

``kvbench.sampling.sample`` runs a warmup per mode, then rotations of full and the cached
mode in a seeded random order until the speedup's 95% interval is within ``PROTOCOL``'s
precision (or its cap or time budget, well inside asv's timeout); the result is
kvbench's speedup (the median over rotations of full / cached). Both modes see the same
machine state, so this ratio stays put when the machine drifts, unlike the ratio of two
``time_`` results. How precise each value is, why sampling stopped and what the noise
telemetry saw go into the environment capture beside asv's result (``track_speedup``).

asv treats every number as lower-is-better: a *lower* speedup is a regression,
even though ``asv compare`` lists it under "improved".
"""

from kvbench import stats
from kvbench.decode import FULL, decode
from kvbench.timing import Protocol

from . import common

try:  # commits before precision-targeted sampling have neither; track_speedup is skipped there
    from kvbench.record import samples_by_cell
    from kvbench.sampling import sample

    # Tighter than kvbench run's default: asv compares single numbers across commits, so each
    # number must hold still; 90 s per parameter keeps the whole benchmark inside its timeout.
    PROTOCOL = Protocol(repeats=11, precision=0.04, max_repeats=301, max_seconds=90.0, control="none")
except (ImportError, TypeError):
    sample = samples_by_cell = PROTOCOL = None


class TrackSpeedup(common.Cells):
    """kvbench's speedup of a cache kind over the full prefix, sampled until precise, per kind and length."""

    params = (common.CACHED_MODES, common.LENGTHS)
    unit = "x"
    version = "kvbench-speedup-2"
    timeout = 900

    def setup(self, gate, mode, length):
        if sample is None:
            raise NotImplementedError("no precision-targeted sampling at this commit")
        super().setup(gate, mode, length)

    def track_speedup(self, gate, mode, length):
        loops = {length: {name: (lambda name=name: decode(self.model, self.ids, name)) for name in (FULL, mode)}}
        state = sample(loops, PROTOCOL)
        cells = samples_by_cell([kept.to_dict() for kept in state.samples])
        estimate = stats.speedup(cells[(FULL, length)], cells[(mode, length)], key=(mode, length))
        common.note_speedup(mode, length, estimate, state)
        return estimate.ratio
