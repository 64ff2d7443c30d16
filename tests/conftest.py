"""Shared fixtures: a tiny model and a hand-built record whose numbers are known."""

import pytest

from kvbench.model import DecoderConfig, build_model
from kvbench.record import build_record


@pytest.fixture(scope="session")
def tiny_model():
    return build_model(DecoderConfig(max_length=64), seed=0)


@pytest.fixture
def make_record():
    """make_record({(mode, length): [seconds, ...]}, failed={(mode, length)}, status=...) -> record dict."""

    def make(seconds, failed=(), status="complete", repeats=None, checks=None):
        modes = list(dict.fromkeys(mode for mode, _ in seconds))
        lengths = sorted({length for _, length in seconds})
        repeats = repeats or max(len(v) for v in seconds.values())
        repetitions = [
            {"mode": mode, "length": length, "repetition": r, "order": modes.index(mode), "seconds": s}
            for (mode, length), values in seconds.items() for r, s in enumerate(values)
        ]
        if checks is None:
            checks = [
                {"mode": mode, "length": length, "passed": (mode, length) not in failed,
                 "max_abs_diff": 0.5 if (mode, length) in failed else 1e-7, "max_rel_diff": 1e-6,
                 "first_divergent_position": 2 if (mode, length) in failed else None,
                 "atol": 1e-5, "rtol": 1e-5, "dtype": "float32"}
                for mode, length in seconds
            ]
        memory = [{"mode": mode, "length": length, "expected_bytes": 256 * length,
                   "measured_bytes": 256 * length, "reserved_bytes": 512 * length} for mode, length in seconds]
        run = {"preset": "seed", "lengths": lengths, "modes": modes, "batch": 1, "seed": 0,
               "repeats": repeats, "warmup": 1, "threads": 1, "per_step_length": None}
        return build_record(command=["kvbench", "run"], config=DecoderConfig().to_dict(), run=run,
                            protocol={"repeats": repeats}, environment={}, checks=checks,
                            repetitions=repetitions, memory=memory, status=status)

    return make


def pytest_addoption(parser):
    parser.addoption("--run-virtualenv", action="store_true", default=False,
                     help="also run tests marked virtualenv (asv builds a virtualenv per commit: minutes)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-virtualenv"):
        return
    skip = pytest.mark.skip(reason="builds asv virtualenvs per commit; run with --run-virtualenv (make test-virtualenv)")
    for item in items:
        if item.get_closest_marker("virtualenv") is not None:
            item.add_marker(skip)
