"""The window kind: a ring of the last W positions, exact against the windowed full prefix, bytes bounded by W."""

import dataclasses

import pytest
import torch

from kvbench.cache import WindowCache, expected_cache_bytes, make_cache
from kvbench.decode import check_equivalence, token_ids
from kvbench.model import DecoderConfig, build_model

CONFIG = DecoderConfig(window=8, max_length=256)


@pytest.fixture(scope="module")
def model():
    return build_model(CONFIG, seed=0)


def test_the_window_kind_needs_a_window():
    with pytest.raises(ValueError, match="needs a model with a sliding window.*got window=None"):
        make_cache("window", DecoderConfig())


def test_ring_positions_are_the_last_w_positions_in_slot_order():
    cache = WindowCache(CONFIG, capacity=64)
    assert cache.ring_positions(5).tolist() == [0, 1, 2, 3, 4]
    assert cache.ring_positions(8).tolist() == list(range(8))
    assert cache.ring_positions(11).tolist() == [8, 9, 10, 3, 4, 5, 6, 7]
    assert sorted(cache.ring_positions(100).tolist()) == list(range(92, 100))


def test_bytes_stay_at_w_positions_whatever_the_length(model):
    ids = token_ids(CONFIG, 1, 200)
    cache = make_cache("window", CONFIG, capacity=200)
    at_window = None
    with torch.inference_mode():
        for t in range(200):
            _, cache = model(ids[:, t : t + 1], cache)
            if t + 1 == CONFIG.window:
                at_window = cache.nbytes
    assert at_window == expected_cache_bytes(CONFIG, 1, CONFIG.window)
    assert cache.nbytes == at_window and cache.reserved_bytes == at_window
    assert WindowCache.expected_bytes(CONFIG, 1, 200) == at_window


@pytest.mark.parametrize("length", [8, 9, 64])
def test_exact_against_the_windowed_full_prefix_for_every_kind(model, length):
    ids = token_ids(CONFIG, 2, length)
    checks = check_equivalence(model, ids, ["full", "concat", "static", "paged", "window"])
    assert all(check.passed and check.exact for check in checks.values()), checks


def test_the_window_changes_the_logits_beyond_w():
    """The windowed model is a different model once T > W: the window is really applied."""
    windowed = build_model(CONFIG, seed=0)
    unbounded = build_model(dataclasses.replace(CONFIG, window=None), seed=0)
    ids = token_ids(CONFIG, 1, 12)
    with torch.inference_mode():
        a, b = windowed(ids)[0], unbounded(ids)[0]
    torch.testing.assert_close(a[:, :8], b[:, :8], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(a[:, 8:], b[:, 8:], atol=1e-3, rtol=1e-3)
