"""kvbench.cache.evicting, the seam evicting kinds stand on: each retained token keeps its absolute position, the
mask and the rotary angles come from those positions, eviction is checked before anything changes, and attention
scores reach a cache only when it asks for them."""

from __future__ import annotations

import pytest
import torch

import kvbench.model
from kvbench.attention import attention_scores
from kvbench.cache import EvictingCache, StaticCache, WindowCache
from kvbench.cache.evicting import kept_masks, masked_reference
from kvbench.model import DecoderConfig, build_model, preset_config
from kvbench.workloads.decode import token_ids

GPT2 = DecoderConfig(layers=2, max_length=64)
LLAMA = preset_config("llama-tiny", max_length=64, rope_scaling=None)


class Scored(EvictingCache):
    """A stand-in for H2O: asks for the summed weights and keeps them; evicts nothing by itself."""

    kind = "scored"
    wants_scores = "summed"


class Lying(EvictingCache):
    """Drops every third key, then counts what it holds as its length: the next token's position read from an
    index into the cache (its rotary angle, and where the mask puts it) rather than from the positions appended."""

    kind = "lying"

    def choose(self, layer, positions, scores):
        return positions[(positions % 3 == 1) & (positions < positions[-1])].unique()

    def commit(self, length):
        super().commit(length)
        self.length = len(self.positions(0))


def step(model, ids, cache, history=True):
    """Prefill 5 tokens, then one a step; the last logits of every call, (B, steps, V)."""
    if history:
        cache.history = []
    rows = [model(ids[:, :5], cache)[0][:, -1]]
    for t in range(5, ids.shape[1]):
        rows.append(model(ids[:, t : t + 1], cache)[0][:, -1])
    return torch.stack(rows, dim=1)


@pytest.mark.parametrize("config", [GPT2, LLAMA], ids=["gpt2", "llama"])
def test_evicted_positions_keep_their_absolute_positions_and_the_cached_path_equals_the_masked_full_path(config):
    model = build_model(config)
    ids = token_ids(config, 2, 20)
    cache = EvictingCache(config, batch=2)
    cache.history = []
    with torch.inference_mode():
        model(ids[:, :9], cache)
        cache.evict([1, 2, 6])  # between steps, from every layer
        cache.evict(torch.tensor([3]), layer=0)
        rows = [model(ids[:, t : t + 1], cache)[0][:, -1] for t in range(9, 20)]
    assert cache.positions(0).tolist() == [0, 4, 5, 7, 8, *range(9, 20)]
    assert cache.positions(1).tolist() == [0, 3, 4, 5, 7, 8, *range(9, 20)]
    assert cache.length == 20 and cache.keys(0).shape[2] == 16 and cache.keys(1).shape[2] == 17
    reference = masked_reference(model, ids, cache.history)[:, 9:]
    torch.testing.assert_close(torch.stack(rows, dim=1), reference, atol=1e-5, rtol=1e-5)
    # Not the full path: the evicted keys mattered. (A rotary angle read from an index would differ too.)
    full = model(ids)[0][:, 9:]
    assert (torch.stack(rows, dim=1) - full).abs().max() > 1e-3


def test_a_kind_that_reads_slots_as_positions_fails_the_masked_reference():
    model = build_model(LLAMA)
    ids = token_ids(LLAMA, 1, 24)
    cache = Lying(LLAMA)
    with torch.inference_mode():
        logits = step(model, ids, cache)
        reference = masked_reference(model, ids, cache.history)[:, 4:]
    assert (logits - reference).abs().max() > 1e-3


def test_a_refused_eviction_changes_nothing():
    model = build_model(GPT2)
    cache = EvictingCache(GPT2)
    with torch.inference_mode():
        model(token_ids(GPT2, 1, 6), cache)
    cache.evict([2])
    before = [(cache.keys(l).clone(), cache.values(l).clone(), cache.positions(l).clone()) for l in range(2)]
    for bad, message in (([2], "cannot evict position 2"), ([0, 0], "distinct"), ([1.0], "integers"),
                         ([9], "cannot evict position 9"), ("x", "integers")):
        with pytest.raises(ValueError, match=message):
            cache.evict(bad)
    with pytest.raises(ValueError, match=r"layer must be in \[0, 1\], got 2"):
        cache.evict([0], layer=2)
    for layer, (keys, values, positions) in enumerate(before):
        assert torch.equal(cache.keys(layer), keys) and torch.equal(cache.values(layer), values)
        assert cache.positions(layer).tolist() == positions.tolist() == [0, 1, 3, 4, 5]
    assert cache.length == 6 and cache.nbytes == 2 * 2 * 5 * 32 * 4 + 2 * 5 * 8  # keys, values, int64 positions


def test_a_policy_that_names_a_position_not_held_rejects_the_step_and_leaves_the_cache_as_it_was():
    class Wrong(EvictingCache):
        def choose(self, layer, positions, scores):
            return torch.tensor([99]) if self.length >= 4 else None

    model = build_model(GPT2)
    ids = token_ids(GPT2, 1, 6)
    cache = Wrong(GPT2)
    with torch.inference_mode():
        model(ids[:, :4], cache)
        keys = cache.keys(1).clone()
        with pytest.raises(ValueError, match="cannot evict position 99"):
            model(ids[:, 4:5], cache)
    assert cache.length == 4 and torch.equal(cache.keys(1), keys) and cache.positions(1).tolist() == [0, 1, 2, 3]
    assert cache.key_positions is None


def test_scores_are_computed_only_for_a_cache_that_asks_and_change_no_output(monkeypatch):
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[-1])
        return attention_scores(*args, **kwargs)

    monkeypatch.setattr(kvbench.model, "attention_scores", counted)
    model = build_model(LLAMA)  # grouped-query: 4 query heads share 2 key/value heads
    ids = token_ids(LLAMA, 2, 10)
    with torch.inference_mode():
        plain = step(model, ids, StaticCache(LLAMA, batch=2), history=False)
        assert calls == []  # the default path computes no weights
        scored_cache = Scored(LLAMA, batch=2)
        scored = step(model, ids, scored_cache, history=False)
    assert calls == ["summed"] * LLAMA.layers * 6  # every layer of every call
    torch.testing.assert_close(scored, plain, atol=1e-6, rtol=1e-6)
    groups = LLAMA.heads // LLAMA.kv_heads
    for layer in range(LLAMA.layers):
        totals = scored_cache.scores(layer)  # (B, KVH, 10): each query's weights over its keys sum to 1
        assert totals.shape == (2, LLAMA.kv_heads, 10)
        torch.testing.assert_close(totals.sum(-1), torch.full((2, LLAMA.kv_heads), 10.0 * groups))
        assert bool((totals[..., 0] > totals[..., -1]).all())  # the first key was seen by all ten queries, the last by one
        assert scored_cache.last_scores[layer].shape == (2, LLAMA.kv_heads, 10)


def test_attention_scores_are_the_softmax_of_the_visible_keys():
    torch.manual_seed(0)
    q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 7, 8)  # queries at 4..6 after four keys
    weights = attention_scores(q, k, offset=4, summary="weights")
    expected = (q @ k.repeat_interleave(2, dim=1).transpose(-1, -2) / 8**0.5)
    expected = expected.masked_fill(~(torch.arange(7)[None, :] <= torch.arange(4, 7)[:, None]), float("-inf")).softmax(-1)
    torch.testing.assert_close(weights, expected)
    assert weights[0, 0, 0, 5:].abs().sum() == 0  # query 4 gives keys 5 and 6 nothing
    summed = attention_scores(q, k, offset=4)
    torch.testing.assert_close(summed, expected.view(1, 2, 2, 3, 7).sum(dim=(2, 3)))
    with pytest.raises(ValueError, match=r"one of \['summed', 'weights', 'queries'\], got 'all'"):
        attention_scores(q, k, offset=4, summary="all")


def test_the_window_kind_says_which_positions_its_ring_holds():
    config = DecoderConfig(window=4, sinks=1, max_length=32)
    cache = WindowCache(config)
    with torch.inference_mode():
        build_model(config)(token_ids(config, 1, 11), cache)
    assert cache.positions(0).tolist() == [0, 7, 8, 9, 10]
    assert StaticCache(config).positions().tolist() == []
    with pytest.raises(ValueError, match="keeps every position"):
        cache.evict([7])


def test_kept_masks_rows_are_what_each_step_saw():
    history = [(torch.arange(3), {0: torch.arange(3)}), (torch.tensor([3]), {0: torch.tensor([0, 2, 3])})]
    mask = kept_masks(history, 1, 4)[0]
    assert mask.int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 1, 1]]


def test_register_kind_makes_an_evicting_subclass_an_evicting_mode(clean_kinds):
    from kvbench import modes
    from kvbench.cache import register_kind
    from kvbench.workloads.decode import check_equivalence

    register_kind("lying", Lying)
    spec = modes.spec("lying")
    assert (spec.evicts, spec.keeps_every_position, spec.exact) == (True, False, True)
    model = build_model(GPT2)
    check = check_equivalence(model, token_ids(GPT2, 1, 20), ["lying"])["lying"]
    assert not check.passed and check.first_divergent_position is not None  # it reads positions from an index
