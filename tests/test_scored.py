"""kvbench.cache.scored and kvbench.cache.scoring: score-based eviction, per key/value head, as kvpress does it.

Mechanics are exact (the cached path equals the full path masked to exactly what each head kept); the budget is
kvpress's; what each kind keeps is its score's top-k, checked against scores computed here another way; the bytes
evicted are really gone; a failed step changes nothing.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import torch
import torch.nn.functional as F

from kvbench import kinds, modes
from kvbench.attention import WEIGHTS, causal_attention
from kvbench.cache import EvictingCache, make_cache
from kvbench.cache.evicting import masked_reference
from kvbench.model import DecoderConfig, build_model, preset_config
from kvbench.workloads.decode import check_equivalence, token_ids
from kvbench.workloads.workload import cache_footprint

GPT2 = DecoderConfig(layers=2, max_length=256)
LLAMA = preset_config("llama-tiny", max_length=256, rope_scaling=None)  # grouped-query attention: 4 heads on 2
SCORED = [name for name, *_ in modes.SCORED_KINDS]
PROMPT, STEPS = 96, 12


def prefill_and_decode(model, ids, mode, prompt=PROMPT, **options):
    """(B, steps, V) logits of every call after the prompt's, and the cache (with its history)."""
    cache = make_cache(mode, model.config, batch=ids.shape[0], capacity=ids.shape[1], **options)
    cache.history = []
    with torch.inference_mode():
        rows = [model(ids[:, :prompt], cache)[0][:, -1]]
        rows += [model(ids[:, t : t + 1], cache)[0][:, -1] for t in range(prompt, ids.shape[1])]
    return torch.stack(rows, dim=1), cache


@pytest.fixture(scope="module")
def models():
    return {"gpt2": build_model(GPT2), "llama": build_model(LLAMA)}


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("mode", SCORED)
@pytest.mark.parametrize("options", [{"evict_ratio": 0.5}, {"kv_keep": 70, "evict_every": 4}],
                         ids=["ratio", "keep-every"])
def test_the_cached_path_equals_the_full_path_masked_to_what_each_head_kept(models, family, mode, options):
    model = models[family]
    ids = token_ids(model.config, 2, PROMPT + STEPS)
    logits, cache = prefill_and_decode(model, ids, mode, **options)
    reference = masked_reference(model, ids, cache.history)[:, PROMPT - 1 :]
    torch.testing.assert_close(logits, reference, atol=2e-5, rtol=2e-5)
    assert cache.compressions >= 1 and cache.positions(0).shape[:2] == (2, model.config.kv_heads)
    full = model(ids)[0][:, PROMPT - 1 :]
    assert (logits[:, 1:] - full[:, 1:]).abs().max() > 1e-4  # what was evicted mattered


@pytest.mark.parametrize("mode", SCORED)
def test_the_gate_judges_a_scored_kind_after_its_compression(models, mode):
    model = models["llama"]
    ids = token_ids(LLAMA, 1, 64)
    check = check_equivalence(model, ids, [mode], options={mode: {"evict_ratio": 0.5}})[mode]
    assert check.passed and check.max_abs_diff < 1e-4


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.75])
@pytest.mark.parametrize("mode", SCORED)
def test_each_head_keeps_kvpress_budget_of_the_prompt(models, mode, ratio):
    model = models["llama"]
    ids = token_ids(LLAMA, 1, PROMPT + 1)
    _, cache = prefill_and_decode(model, ids, mode, evict_ratio=ratio)
    for layer in range(LLAMA.layers):
        budget = (kinds.pyramid_budget(layer, LLAMA.layers, PROMPT, ratio) if mode == "pyramidkv"
                  else max(1, int(PROMPT * (1 - ratio))))
        positions = cache.positions(layer)
        assert positions.shape == (1, LLAMA.kv_heads, budget + 1)  # and the one decoded since
        assert (positions.diff(dim=-1) > 0).all() and (positions[..., -1] == PROMPT).all()  # oldest first


def test_heads_keep_their_own_positions(models):
    _, cache = prefill_and_decode(models["llama"], token_ids(LLAMA, 1, PROMPT + 1), "knorm", evict_ratio=0.5)
    heads = cache.positions(0)[0]
    assert not torch.equal(heads[0], heads[1])


def kept_sets(cache, layer):
    return [set(row.tolist()) - {PROMPT} for row in cache.positions(layer)[0]]


class Observed(EvictingCache):
    """Records every prefill's attention weights per layer, another way to the scores than the kinds'."""

    kind = "observed"
    wants_scores = WEIGHTS

    def observe(self, layer, scores):
        self.weights = getattr(self, "weights", {})
        self.weights[layer] = scores.clone()
        super().observe(layer, scores)


def prefill_weights(model, ids):
    cache = Observed(model.config, batch=1)
    with torch.inference_mode():
        model(ids, cache)
    return cache, cache.weights


def top(scores, n):
    return [set(row.tolist()) for row in scores.topk(n, dim=-1).indices[0]]


@pytest.mark.parametrize("ratio", [0.25, 0.5])
def test_what_each_kind_keeps_is_the_top_of_its_score_computed_another_way(models, ratio):
    """Each kind's kept sets against kvpress's formulas applied to the prefill's full attention weights (as
    kvpress's eager path reads them) and to the keys."""
    model = models["llama"]
    ids = token_ids(LLAMA, 1, PROMPT + 1)
    observed, weights = prefill_weights(model, ids[:, :PROMPT])
    n, G, KVH = max(1, int(PROMPT * (1 - ratio))), LLAMA.heads // LLAMA.kv_heads, LLAMA.kv_heads
    for layer in range(LLAMA.layers):
        attention = weights[layer]  # (1, H, T, T)
        expected = {
            "knorm": -observed.keys(layer).norm(dim=-1),
            "h2o": (attention.sum(2) / torch.arange(PROMPT, 0, -1)).view(1, KVH, G, PROMPT).mean(2),
            "tova": F.pad(attention[..., -1, :-1].mean(1, keepdim=True).expand(-1, KVH, -1), (0, 1), value=2.0),
        }
        window = attention[..., -64:, :-64].mean(-2)
        snap = F.avg_pool1d(window, 5, padding=2, stride=1).view(1, KVH, G, PROMPT - 64).mean(2)
        expected["snapkv"] = F.pad(snap, (0, 64), value=snap.max().item() + 1)
        for mode, scores in expected.items():
            _, cache = prefill_and_decode(model, ids, mode, evict_ratio=ratio)
            assert kept_sets(cache, layer) == top(scores, n), (mode, layer)
    _, cache = prefill_and_decode(model, ids, "streamingllm", evict_ratio=ratio)
    assert kept_sets(cache, 0) == [set(range(4)) | set(range(PROMPT - n + 4, PROMPT))] * KVH


def test_random_is_seeded_and_differs_from_every_scored_rule(models):
    model = models["llama"]
    ids = token_ids(LLAMA, 1, PROMPT + 1)
    first, second = (prefill_and_decode(model, ids, "random")[1] for _ in range(2))
    assert torch.equal(first.positions(0), second.positions(0))
    generator = torch.Generator().manual_seed(0)
    draws = torch.rand(1, LLAMA.kv_heads, PROMPT, generator=generator)
    assert kept_sets(first, 1) == top(draws, PROMPT // 2)


def test_bytes_are_freed_and_match_the_formula(models):
    model = models["llama"]
    ids = token_ids(LLAMA, 2, PROMPT + 1)
    _, static = prefill_and_decode(model, ids, "static")
    _, cache = prefill_and_decode(model, ids, "snapkv", evict_ratio=0.75)
    kept = sum(cache.positions(layer).shape[-1] for layer in range(LLAMA.layers))
    per = 2 * LLAMA.kv_heads * (2 * LLAMA.head_dim * 4 + 8)
    assert cache.nbytes == per * kept and kept == LLAMA.layers * (int(PROMPT * 0.25) + 1)
    assert cache.nbytes < 0.3 * static.nbytes
    assert cache.reserved_bytes == cache.nbytes + sum(q.numel() * 4 for q in cache._queries)


@pytest.mark.parametrize("mode", ["knorm", "pyramidkv"])
@pytest.mark.parametrize("options", [{"evict_ratio": 0.5, "evict_every": 8}, {"kv_keep": 64, "evict_every": 5},
                                     {"evict_ratio": 0.75}])
def test_what_a_loop_holds_once_compressed_is_the_byte_formula(models, mode, options):
    model = models["gpt2"]
    ids = token_ids(GPT2, 1, 150)
    footprint = cache_footprint(model, ids, mode, {mode: options})
    assert footprint["measured_bytes"] == footprint["expected_bytes"]
    assert footprint["measured_bytes"] < 0.6 * kinds.expected_cache_bytes(GPT2, 1, 150)


def test_evicting_during_decoding_bounds_what_a_loop_holds(models):
    """--evict-every: the held count returns to the budget every N steps (kvpress compresses only the prompt)."""
    model = models["llama"]
    ids = token_ids(LLAMA, 1, 120)
    cache = make_cache("h2o", LLAMA, capacity=120, kv_keep=40, evict_every=10)
    held = []
    with torch.inference_mode():
        for t in range(120):
            model(ids[:, t : t + 1], cache)
            held.append(cache.positions(0).shape[-1])
    # Steps 1, 11, 21, ... compress before they append: from step 41 on, 40 kept plus the step's own, then growing.
    assert held[:12] == [*range(1, 12), 12] and held[40:52] == [41, 41, *range(42, 51), 41]
    assert max(held) == 50 and held[-1] == 41 + (119 - 41) % 10


def test_a_failed_step_after_an_eviction_changes_nothing(models):
    model = models["llama"]
    ids = token_ids(LLAMA, 1, PROMPT + 2)
    cache = make_cache("tova", LLAMA, capacity=PROMPT + 2, evict_ratio=0.5)
    with torch.inference_mode():
        model(ids[:, :PROMPT], cache)
        before = [(cache.keys(layer).clone(), cache.positions(layer).clone()) for layer in range(LLAMA.layers)]
        broken = model.blocks[1].forward

        def fail(*args, **kwargs):
            raise RuntimeError("a layer fails after layer 0 evicted")

        model.blocks[1].forward = fail
        with pytest.raises(RuntimeError):
            model(ids[:, PROMPT : PROMPT + 1], cache)
        model.blocks[1].forward = broken
        for layer, (keys, positions) in enumerate(before):
            assert torch.equal(cache.keys(layer), keys) and torch.equal(cache.positions(layer), positions)
        assert cache.length == PROMPT and cache.compressions == 0
        model(ids[:, PROMPT : PROMPT + 1], cache)  # and it then compresses as it would have
    assert cache.positions(0).shape[-1] == PROMPT // 2 + 1


def test_compress_between_steps_evicts_to_the_budget_and_is_refused_during_one(models):
    model = models["llama"]
    cache = make_cache("knorm", LLAMA, capacity=PROMPT, kv_keep=10)
    with torch.inference_mode():
        model(token_ids(LLAMA, 1, PROMPT), cache)
    assert cache.compress() == LLAMA.layers * LLAMA.kv_heads * (PROMPT - 10) and cache.compress() == 0
    cache.update(0, *(torch.zeros(1, LLAMA.kv_heads, 1, LLAMA.head_dim),) * 2)
    with pytest.raises(ValueError, match="compress between steps: expected no step in progress"):
        cache.compress()


def test_per_head_positions_give_each_head_its_own_mask():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    positions = torch.tensor([[[0, 2, 7, 8, 9], [1, 3, 4, 8, 9]]])  # queries at 7, 8, 9
    got = causal_attention(q, k, v, offset=7, key_positions=positions)
    for head in range(4):
        kv = head // 2
        mask = positions[0, kv][None, :] <= torch.arange(7, 10)[:, None]
        logits = (q[0, head] @ k[0, kv].T / math.sqrt(8)).masked_fill(~mask, float("-inf"))
        torch.testing.assert_close(got[0, head], logits.softmax(-1) @ v[0, kv])


@pytest.mark.parametrize(("options", "message"), [
    ({"evict_ratio": 1.0}, r"evict_ratio is the fraction of positions removed, in \[0, 1\), got 1.0"),
    ({"evict_ratio": -0.1}, r"in \[0, 1\), got -0.1"),
    ({"evict_ratio": 0.5, "kv_keep": 8}, "give evict_ratio or kv_keep, not both"),
    ({"kv_keep": 2}, r"kv_keep is the positions each head keeps, an integer of at least 4 \(what streamingllm always "
                     r"keeps\), got 2"),
    ({"evict_every": 0}, "evict_every is a number of decoding steps, at least 1, got 0"),
])
def test_options_no_kind_can_honour_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        make_cache("streamingllm", LLAMA, **options)


def test_a_windowed_model_is_refused():
    windowed = preset_config("llama-tiny", max_length=64, rope_scaling=None, window=8)
    with pytest.raises(ValueError, match="snapkv evicts by its own rule and needs full attention"):
        modes.spec("snapkv").require(windowed)
    with pytest.raises(ValueError, match="expected a model without a sliding window, got window=8"):
        make_cache("snapkv", windowed)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_chunking_of_the_prompt_then_one_token_steps_equals_the_masked_full_path(models, data):
    """The contract the other kinds pass (tests/test_cache.py), for a kind that compresses its prompt: a prompt in
    any chunks, then steps, evicting after the prompt and every N steps, is the full path masked to what it kept."""
    mode = data.draw(st.sampled_from(SCORED), label="mode")
    model = models[data.draw(st.sampled_from(["gpt2", "llama"]), label="family")]
    options = data.draw(st.sampled_from([{"evict_ratio": 0.5}, {"evict_ratio": 0.25, "evict_every": 3},
                                         {"kv_keep": 64, "evict_every": 2}]), label="options")
    prompt = data.draw(st.integers(70, 100), label="prompt")
    cuts = sorted(data.draw(st.sets(st.integers(1, prompt - 1), max_size=3), label="cuts"))
    ids = token_ids(model.config, 1, prompt + 9, seed=data.draw(st.integers(0, 3), label="seed"))
    cache = make_cache(mode, model.config, capacity=ids.shape[1], **options)
    cache.history = []
    ends, rows = [*cuts, prompt, *range(prompt + 1, ids.shape[1] + 1)], []
    with torch.inference_mode():
        start = 0
        for end in ends:
            rows.append(model(ids[:, start:end], cache)[0][:, -1])
            start = end
    reference = masked_reference(model, ids, cache.history)[:, [end - 1 for end in ends]]
    torch.testing.assert_close(torch.stack(rows, dim=1), reference, atol=2e-5, rtol=2e-5)
    assert cache.length == ids.shape[1] and cache.positions(0).shape[-1] < ids.shape[1]


@pytest.mark.parametrize("mode", SCORED)
@pytest.mark.parametrize("options", [{"evict_ratio": 0.5}, {"kv_keep": 70, "evict_every": 3},
                                     {"evict_ratio": 0.3, "evict_every": 1}], ids=["ratio", "keep-every", "every-step"])
def test_a_cache_made_for_its_prompt_holds_exactly_the_timeline_it_reserves(models, mode, options):
    """Made with prompt=P (a server's admission): a one-token chunk inside the prompt is a chunk, not a decoding
    step; what its tensors hold at every step boundary after the prompt is kvbench.kinds.scored_held_bytes' [t], and
    reserved_bytes is the most of what is still to come, which compression lowers and which nothing ever exceeds."""
    model, P, C = models["llama"], 100, 130
    cache = make_cache(mode, LLAMA, 1, C, prompt=P, **options)
    timeline = kinds.scored_held_bytes(LLAMA, C, P, pyramid=cache.pyramid, **cache.state_kept(), **options)
    assert cache.reserved_bytes == max(timeline) == kinds.scored_reserved_bytes(
        LLAMA, C, P, pyramid=cache.pyramid, **cache.state_kept(), **options)
    ids = torch.randperm(LLAMA.vocab_size, generator=torch.Generator().manual_seed(0))[:C][None]
    held, reserved = [], []
    with torch.inference_mode():
        for start, end in ((0, 40), (40, 41), (41, 99), (99, 100), *((t, t + 1) for t in range(P, C))):
            model(ids[:, start:end], cache)
            assert cache.allocated_bytes <= cache.reserved_bytes
            if end == P:
                assert cache.compressions == 0 and cache.decode_steps == 0  # the one-token chunks were the prompt's
            if end >= P:
                held.append(cache.allocated_bytes)
                reserved.append(cache.reserved_bytes)
    assert held == timeline
    assert reserved == [max(timeline[t:]) for t in range(len(timeline))]
    assert reserved[1] < reserved[0] == held[0]  # the compression gave back part of the prompt's peak


def test_a_cache_made_for_its_prompt_refuses_steps_its_reservation_does_not_plan():
    cache = make_cache("knorm", LLAMA, 1, 40, prompt=10)
    with pytest.raises(ValueError, match="a prompt chunk ends at the prompt's end, position 10: expected at most 10 "
                                         "tokens from position 0, got 12"):
        cache.check_append(LLAMA, 1, 12)
    cache.length = 10
    with pytest.raises(ValueError, match="after its prompt of 10 a request decodes one token a step, got 2"):
        cache.check_append(LLAMA, 1, 2)
    for prompt in (0, 41, True, 2.0):
        with pytest.raises(ValueError, match=rf"prompt is the request's prompt length, in \[1, capacity 40\], "
                                             rf"got {prompt!r}"):
            make_cache("knorm", LLAMA, 1, 40, prompt=prompt)


def test_a_compressing_kind_keeps_no_view_of_a_prompts_queries(models):
    """Its window of queries is a copy of the newest `observation` alone, and the step's own queries are not kept
    (last_scores): a view would keep the whole prompt chunk's queries alive, bytes its accounting does not count."""
    model = models["llama"]
    cache = make_cache("snapkv", LLAMA, 1, PROMPT + 1)
    with torch.inference_mode():
        model(token_ids(LLAMA, 1, PROMPT), cache)
    for layer in range(LLAMA.layers):
        window = cache._queries[layer]
        assert window.shape[2] == 64 and window.untyped_storage().nbytes() == window.numel() * window.element_size()
        assert cache.last_scores[layer] is None


def test_evict_between_steps_drops_a_position_from_every_head_or_refuses_and_changes_nothing(models):
    _, cache = prefill_and_decode(models["llama"], token_ids(LLAMA, 1, PROMPT + 1), "knorm", evict_ratio=0.5)
    rows = [set(row.tolist()) for layer in range(LLAMA.layers) for row in cache.positions(layer)[0]]
    everywhere, somewhere = sorted(set.intersection(*rows)), sorted(set.union(*rows) - set.intersection(*rows))
    before = [cache.positions(layer).clone() for layer in range(LLAMA.layers)]
    with pytest.raises(ValueError, match=f"position {somewhere[0]} is not retained by every key/value head"):
        cache.evict([everywhere[0], somewhere[0]])
    with pytest.raises(ValueError, match="positions to evict must be distinct"):
        cache.evict([everywhere[0], everywhere[0]])
    assert all(torch.equal(cache.positions(layer), kept) for layer, kept in enumerate(before))
    cache.evict(everywhere[:2])
    for layer, kept in enumerate(before):
        assert cache.positions(layer).shape[-1] == kept.shape[-1] - 2
        assert not torch.isin(cache.positions(layer), torch.tensor(everywhere[:2])).any()
        assert cache.keys(layer).shape[2] == kept.shape[-1] - 2
