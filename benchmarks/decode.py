"""Wall time and peak memory of one teacher-forced decode loop, per mode and length.

The timed unit is the seed's: the whole loop at one length (``kvbench.workloads.decode.decode``).
``full`` re-runs the prefix at every step, so its work grows with the square of the
length; a cache kind feeds one token per step. Timing both per commit shows a
regression in either path, and the gap between them is what a cache saves.
"""

try:  # kvbench's packages by concern; a commit before them (asv runs today's suites on older commits) has flat modules
    from kvbench.workloads.decode import decode
except ImportError:
    from kvbench.workloads.decode import decode

from . import common


class TimeDecode(common.Cells):
    """Seconds per decode loop; asv's median over samples, one loop per sample."""

    version = "kvbench-decode-2"
    number = 1  # one loop per sample; setup runs before every sample and is cheap
    repeat = (5, 15, 20.0)  # min and max samples per round, and the time budget
    rounds = 2  # two processes per cell, interleaved with the other benchmarks
    warmup_time = 0.2  # at least one untimed loop first

    def time_decode(self, gate, model, mode, length):
        decode(self.model, self.ids, mode)


class PeakMemDecode(common.Cells):
    """Peak resident memory of a process that runs one decode loop (torch included)."""

    version = "kvbench-decode-2"

    def peakmem_decode(self, gate, model, mode, length):
        decode(self.model, self.ids, mode)
