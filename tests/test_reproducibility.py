"""scripts/reproducibility.py: the between-run SD it reports (what stats.BETWEEN_RUN must cover), on runs whose
between-run variation is known."""

import importlib.util
import math
import sys
from pathlib import Path

import pytest
from records import noisy, synthetic_record, view

from kvbench.measure import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))  # it imports its sibling scripts/antagonist.py
spec = importlib.util.spec_from_file_location("reproducibility", ROOT / "scripts" / "reproducibility.py")
reproducibility = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reproducibility)


def runs(factors, cached_factors=None):
    """One record per run: every cell's seconds times that run's factor (the cached modes' by `cached_factors`)."""
    cached_factors = cached_factors or factors
    out = []
    for index, (whole, cached) in enumerate(zip(factors, cached_factors)):
        seconds = {("full", n): [s * whole for s in noisy(0.002 * n, 41, 0.002, seed=10 * index + n)] for n in (16, 64)}
        seconds |= {("static", n): [s * cached for s in noisy(0.001 * n, 41, 0.002, seed=10 * index + n + 1)]
                    for n in (16, 64)}
        out.append(view(synthetic_record(seconds), f"run-{index}.json"))
    return out


def test_a_machine_that_moves_between_runs_moves_seconds_but_not_a_speedup():
    # each run 5% faster or slower than the last: log differences of 0.1, so sd = sqrt(0.01 / 2) = 7.1%
    spread = reproducibility.between_run(runs([math.exp(0.05 * (-1) ** i) for i in range(6)]))
    assert spread["seconds"]["pooled"] == pytest.approx(math.sqrt(0.01 / 2), rel=0.05)
    assert set(spread["seconds"]["by_length"]) == {16, 64}
    assert spread["speedup"]["pooled"] < 0.002  # both modes moved together: the pairs cancel it


def test_a_speedup_that_moves_between_runs_is_measured_and_steady_runs_measure_nothing():
    moved = reproducibility.between_run(runs([1.0] * 6, [math.exp(0.02 * (-1) ** i) for i in range(6)]))
    assert moved["speedup"]["pooled"] == pytest.approx(math.sqrt(0.04 ** 2 / 2), rel=0.1)
    steady = reproducibility.between_run(runs([1.0] * 6))
    assert steady["seconds"]["pooled"] < 0.002 and steady["speedup"]["pooled"] < 0.002
    assert math.isnan(stats.between_run_sd([]))  # nothing to measure
