"""The window kind: a ring of the last W positions, exact against the windowed full prefix, bytes bounded by W."""

import dataclasses

import pytest
import torch

from kvbench.cache import WindowCache, expected_cache_bytes, make_cache
from kvbench.modes import expected_bytes
from kvbench.workloads.decode import check_equivalence, token_ids
from kvbench.model import DecoderConfig, build_model, preset_config

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
    assert expected_bytes("window", CONFIG, 1, 200) == at_window


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


# --- per-layer windows: a Gemma-2-style model slides on every other layer -----------------

GEMMA = preset_config("gemma-tiny", window=8, max_length=256)  # layers 0 and 2 slide over 8 positions, 1 and 3 see all


@pytest.fixture(scope="module")
def gemma():
    return build_model(GEMMA, seed=0)


def test_a_sliding_layer_holds_a_ring_and_the_others_every_position(gemma):
    ids = token_ids(GEMMA, 2, 40)
    cache = make_cache("window", GEMMA, batch=2, capacity=64)
    with torch.inference_mode():
        _, cache = gemma(ids[:, :13], cache)  # a chunk past the window
        for t in range(13, 40):
            _, cache = gemma(ids[:, t : t + 1], cache)
    held = [cache.keys(layer).shape[2] for layer in range(GEMMA.layers)]
    assert held == [8, 40, 8, 40] and cache.layer_slots == [8, 64, 8, 64]
    per_position = 2 * 2 * GEMMA.kv_heads * GEMMA.head_dim * 4  # k and v, batch 2, float32, one layer
    assert cache.nbytes == (8 + 40 + 8 + 40) * per_position == expected_bytes("window", GEMMA, 2, 40)
    assert cache.reserved_bytes == (8 + 64 + 8 + 64) * per_position
    with torch.inference_mode():  # the full layers keep every rotated key, as concat does; the sliding its last 8
        _, concat = gemma(ids, make_cache("concat", GEMMA, batch=2))
    torch.testing.assert_close(cache.keys(1), concat.keys(1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache.keys(0), concat.keys(0)[:, :, -8:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("preset", ["gemma-tiny", "mistral-tiny"])
@pytest.mark.parametrize("length", [8, 9, 64])
def test_per_layer_windows_are_exact_for_every_kind(preset, length):
    config = preset_config(preset, window=8, max_length=256)
    model = build_model(config, seed=0)
    checks = check_equivalence(model, token_ids(config, 2, length), ["full", "concat", "static", "paged", "window"])
    assert all(check.passed and check.exact for check in checks.values()), checks


def test_alternating_windows_change_the_logits_beyond_w_and_only_there():
    windowed = build_model(GEMMA, seed=0)
    unbounded = build_model(dataclasses.replace(GEMMA, window=None, window_pattern=None), seed=0)
    everywhere = build_model(dataclasses.replace(GEMMA, window_pattern=None), seed=0)
    ids = token_ids(GEMMA, 1, 12)
    with torch.inference_mode():
        a, b, c = windowed(ids)[0], unbounded(ids)[0], everywhere(ids)[0]
    torch.testing.assert_close(a[:, :8], b[:, :8], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(a[:, 8:], b[:, 8:], atol=1e-3, rtol=1e-3)
    assert not torch.allclose(a[:, 8:], c[:, 8:], atol=1e-3, rtol=1e-3)  # half the layers is not all of them


# --- attention sinks (StreamingLLM): the first K positions kept beside the last W -------------------

SINKS = dataclasses.replace(CONFIG, sinks=3)


def test_sinks_need_a_window():
    with pytest.raises(ValueError, match="sinks 4 are kept beside a sliding window.*got window=None"):
        DecoderConfig(sinks=4)


def test_a_ring_with_sinks_holds_the_first_k_and_the_last_w_positions():
    cache = WindowCache(SINKS, capacity=64)
    assert cache.layer_slots == [11]
    assert cache.ring_positions(2).tolist() == [0, 1]
    assert cache.ring_positions(11).tolist() == list(range(11))
    assert cache.ring_positions(13).tolist() == [0, 1, 2, 11, 12, 5, 6, 7, 8, 9, 10]
    assert sorted(cache.ring_positions(100).tolist()) == [0, 1, 2, *range(92, 100)]
    assert expected_bytes("window", SINKS, 1, 100) == expected_cache_bytes(SINKS, 1, 11)


@pytest.mark.parametrize("preset", ["seed", "gemma-tiny"])
@pytest.mark.parametrize("length", [11, 12, 40])
def test_sinks_are_exact_against_the_full_prefix_masked_the_same_way(preset, length):
    config = preset_config(preset, window=8, sinks=3, max_length=256)
    checks = check_equivalence(build_model(config, seed=0), token_ids(config, 2, length),
                               ["full", "concat", "static", "paged", "window"])
    assert all(check.passed and check.exact for check in checks.values()), checks


def test_sinks_in_chunks_equal_one_token_a_step():
    model = build_model(SINKS, seed=0)
    ids = token_ids(SINKS, 2, 40)
    with torch.inference_mode():
        full = model(ids)[0]
        cache = make_cache("window", SINKS, batch=2, capacity=40)
        pieces = []
        for start, end in ((0, 2), (2, 13), (13, 14), (14, 30), (30, 40)):
            logits, cache = model(ids[:, start:end], cache)
            pieces.append(logits)
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)
    assert sorted(cache.ring_positions(40).tolist()) == [0, 1, 2, *range(32, 40)]


def test_sinks_change_the_logits_once_the_window_slides():
    with_sinks, without = build_model(SINKS, seed=0), build_model(CONFIG, seed=0)
    ids = token_ids(CONFIG, 1, 14)
    with torch.inference_mode():
        a, b = with_sinks(ids)[0], without(ids)[0]
    torch.testing.assert_close(a[:, :8], b[:, :8], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(a[:, 8:], b[:, 8:], atol=1e-3, rtol=1e-3)
