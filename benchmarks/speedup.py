"""What a cache saves, measured by kvbench's own paired protocol inside one process.

``kvbench.timing.measure`` runs a warmup per mode, then alternates full and cached
loops for ``REPEATS`` repetitions; the result is median(full) / median(cached), the
speedup ``kvbench run`` reports. Both modes see the same machine state, so this
ratio stays put when the machine drifts, unlike the ratio of two ``time_`` results.

asv treats every number as lower-is-better: a *lower* speedup is a regression,
even though ``asv compare`` lists it under "improved".
"""

from kvbench.decode import FULL
from kvbench.record import samples_by_cell
from kvbench.stats import paired_speedup
from kvbench.timing import Protocol, measure

from . import common

# Odd, so each median is one of the samples. Interference from other processes only
# ever adds time and comes in bursts; 31 alternating pairs (about 10 s at length 256)
# spread each median over enough bursts to keep it put.
REPEATS = 31


class TrackSpeedup(common.Cells):
    """Median full-prefix seconds over median cached seconds, per cache kind and length."""

    params = (common.CACHED_MODES, common.LENGTHS)
    unit = "x"
    version = "kvbench-speedup-1"
    timeout = 900

    def track_speedup(self, gate, mode, length):
        samples = measure(self.model, {length: self.ids}, [FULL, mode], Protocol(repeats=REPEATS))
        cells = samples_by_cell([sample.to_dict() for sample in samples])
        return paired_speedup(cells[(FULL, length)], cells[(mode, length)]).ratio
