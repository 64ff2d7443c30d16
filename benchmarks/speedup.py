"""What a cache saves, measured by kvbench's own sampling protocol inside one process.

``kvbench.measure.sampling.sample`` runs a warmup per mode, then rotations of full and the cached
mode in a seeded random order until the speedup's 95% interval is within ``PROTOCOL``'s
precision, or its cap, or this parameter's share of the commit's sampling budget
(``common.allowance``: ``KVBENCH_ASV_BUDGET`` seconds for every parameter together); the result is
kvbench's speedup (the median over rotations of full / cached). Both modes see the same
machine state, so this ratio stays put when the machine drifts, unlike the ratio of two
``time_`` results. How precise each value is, why sampling stopped and what the noise
telemetry saw go into the environment capture beside asv's result (``track_speedup``).

asv keeps one number per parameter, so the value is rounded to what its interval supports
(``common.round_to_interval``) and ``track_speedup_halfwidth`` tracks the interval's relative half-width
in percent beside it: a value asv shows as 3.08 next to 3.9 means 3.08 ± 3.9%.

asv treats every number as lower-is-better: a *lower* speedup is a regression,
even though ``asv compare`` lists it under "improved".
"""

import dataclasses
import time

try:  # kvbench's packages by concern; a commit before them (asv runs today's suites on older commits) has flat modules
    from kvbench.measure import stats
    from kvbench.measure.timing import Protocol
    from kvbench.workloads.decode import FULL, decode
except ImportError:
    from kvbench import stats
    from kvbench.workloads.decode import FULL, decode
    from kvbench.measure.timing import Protocol

from . import common

try:  # commits before precision-targeted sampling have neither; track_speedup is skipped there
    from kvbench.record import samples_by_cell

    try:  # kvbench's packages by concern, then the flat module before them
        from kvbench.measure.sampling import sample
    except ImportError:
        from kvbench.measure.sampling import sample

    # Tighter than kvbench run's default: asv compares single numbers across commits, so each
    # number must hold still. max_seconds is each parameter's share of the commit's budget.
    PROTOCOL = Protocol(repeats=11, precision=0.04, max_repeats=301, max_seconds=90.0, control="none")
except (ImportError, TypeError):
    sample = samples_by_cell = PROTOCOL = None
try:  # kvbench's packages by concern
    from kvbench.measure import estimation
except ImportError:
    try:  # commits before the telemetry chose a clock estimate on wall time
        from kvbench import estimation
    except ImportError:
        estimation = None


class TrackSpeedup(common.Cells):
    """kvbench's speedup of a cache kind over the full prefix, sampled until precise, per kind and length."""

    params = (common.MODELS, common.CACHED_MODES, common.LENGTHS)
    unit = "x"
    version = "kvbench-speedup-3"
    timeout = 900  # a generous ceiling: the commit's budget (common.BUDGET) is what bounds the sampling

    def setup(self, gate, model, mode, length):
        if sample is None:
            raise NotImplementedError("no precision-targeted sampling at this commit")
        super().setup(gate, model, mode, length)

    def track_speedup(self, gate, model, mode, length):
        key = f"{model}@{mode}@{length}"
        seconds, ledger = common.allowance(key, len(common.MODELS) * len(common.CACHED_MODES) * len(common.LENGTHS))
        protocol = dataclasses.replace(PROTOCOL, max_seconds=max(seconds, 1.0))
        loops = {length: {name: (lambda name=name: decode(self.model, self.ids, name)) for name in (FULL, mode)}}
        started = time.perf_counter()
        try:
            state = sample(loops, protocol)
        finally:
            common.spend(key, time.perf_counter() - started)
        repetitions = [kept.to_dict() for kept in state.samples]
        chosen = estimation.choose(length, repetitions, PROTOCOL.threads) if estimation else None
        cells = estimation.series(repetitions, chosen.clock) if chosen else samples_by_cell(repetitions)
        estimate = stats.speedup(cells[(FULL, length)], cells[(mode, length)], key=(mode, length))
        common.note_speedup(model, mode, length, estimate, state, clock=chosen.to_dict() if chosen else None, budget={
            "allowance_seconds": protocol.max_seconds, "commit_budget_seconds": ledger["budget"],
            "spent_before_seconds": ledger["spent"], "sampled_seconds": state.elapsed})
        common.keep_interval(key, estimate)
        return common.round_to_interval(estimate.ratio, estimate.low, estimate.high)

    def track_speedup_halfwidth(self, gate, model, mode, length):
        """The relative half-width of track_speedup's 95% rerun interval, in percent (two significant digits:
        3.9, or 19 rather than asv's "19.0")."""
        percent = float(f"{common.kept_interval(f'{model}@{mode}@{length}')['half_width'] * 100:.2g}")
        return int(percent) if percent >= 10 else percent

    track_speedup_halfwidth.unit = "%"
