"""Shared fixtures: a tiny model and the synthetic-record builder of tests/records.py."""

import pytest
from records import synthetic_record

from kvbench.model import DecoderConfig, build_model


@pytest.fixture(scope="session")
def tiny_model():
    return build_model(DecoderConfig(max_length=64), seed=0)


TEST_WINDOW = 5  # shorter than the tests' sequences, so the window really slides


@pytest.fixture(scope="session")
def windowed_model():
    return build_model(DecoderConfig(max_length=64, window=TEST_WINDOW), seed=0)


@pytest.fixture(scope="session")
def model_for(tiny_model, windowed_model):
    """model_for(mode) -> the tiny model, or for the window kind the same model with a sliding window."""
    return lambda mode: windowed_model if mode == "window" else tiny_model


@pytest.fixture
def make_record():
    """make_record({(mode, length): [seconds, ...]}, failed={(mode, length)}, status=...) -> record dict."""
    return synthetic_record


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
