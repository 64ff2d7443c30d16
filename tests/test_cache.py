"""The cache contract: every kind passes the same equivalence and validation tests.

The first four tests are the source document's: stepwise equivalence with shape and
bytes after every append, chunked prefill, request isolation, position capacity.
Logits are compared, never generated text. An exact kind must match the full-prefix
path within float32's atol = rtol = 1e-5; a lossy kind (quantized) must stay within
its own drift limits, and is never held to the exact tolerance. The window kind runs
on a model with a sliding window (its full-prefix path masks the same window), and
the quantized kinds with small groups and residual, so that every test quantizes.
Every behaviour test runs on both model families: the gpt2 lab and the llama family
(rotated keys, Qwen2's biases, Gemma-2's alternating windows, a head width that is not
width / heads).
"""

import dataclasses
import functools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvbench.cache import CACHE_KINDS, KINDS, expected_bytes, expected_cache_bytes, make_cache
from kvbench.model import DecoderConfig, build_model, preset_config
from kvbench.modes import spec
from kvbench.workloads.decode import compare_drift

TOLERANCE = dict(atol=1e-5, rtol=1e-5)
SEED_CONFIG = DecoderConfig()
CONFIGS = {
    "seed": SEED_CONFIG,
    "gqa": DecoderConfig(heads=4, kv_heads=2),
    "mqa": DecoderConfig(heads=4, kv_heads=1),
    "layers3": DecoderConfig(layers=3),
    "gqa-layers2-wide": DecoderConfig(width=64, heads=8, kv_heads=2, layers=2),
}
WINDOW = 5  # shorter than every test's sequence: the window really slides
LLAMA_CONFIG = preset_config("llama-tiny", vocab_size=128, qkv_bias=True)  # Llama 3's scaling, tied head, biases
CONFIGS.update({
    "llama": LLAMA_CONFIG,
    "qwen-mqa": preset_config("qwen-tiny", vocab_size=128),
    "mistral-window": preset_config("mistral-tiny", vocab_size=128, window=WINDOW),  # every layer slides
    "gemma-alternating": preset_config("gemma-tiny", vocab_size=128, window=WINDOW),  # every other layer slides
})
FAMILY_CONFIGS = {"gpt2": SEED_CONFIG, "llama": LLAMA_CONFIG}
QUANTIZED_OPTIONS = {"group_size": 4, "residual": 3}  # groups form within a dozen tokens


def adapted(config: DecoderConfig, kind: str) -> DecoderConfig:
    """The config a kind is tested on: the window kind needs a model with a window."""
    return dataclasses.replace(config, window=WINDOW) if kind == "window" else config


def options_for(kind: str) -> dict:
    return QUANTIZED_OPTIONS if kind.startswith("quantized") else {}


def make(kind: str, config: DecoderConfig, batch: int = 1, capacity: int | None = None):
    return make_cache(kind, config, batch=batch, capacity=capacity, **options_for(kind))


def bytes_of(kind: str, config: DecoderConfig, batch: int, length: int) -> int:
    return expected_bytes(kind, config, batch, length, **options_for(kind))


def held(kind: str, length: int, window: int | None = WINDOW) -> int:
    """Positions a kind keeps of a layer with `window` after `length` appends (its keys() shows them)."""
    return min(length, window) if kind == "window" and window is not None else length


@functools.lru_cache(maxsize=None)
def built(config: DecoderConfig):
    return build_model(config, seed=0)


def assert_logits(kind: str, candidate, reference, config):
    """Exact kinds within the tolerance; a lossy kind within its own drift limits (for the model's family)."""
    if spec(kind).exact:
        torch.testing.assert_close(candidate, reference, **TOLERANCE)
        return
    drift = compare_drift(kind, candidate, reference, spec(kind).limits_for(config), **TOLERANCE)
    assert drift.passed, drift


# A kind that compresses its prompt (kvbench.cache.scored) is held to the full path masked to what it kept, not to
# the full path: tests/test_scored.py runs these contracts on it.
KEEPING = [kind for kind in CACHE_KINDS if not spec(kind).compresses_prompt]


@pytest.fixture(params=KEEPING)
def kind(request):
    return request.param


@pytest.fixture(params=list(CONFIGS))
def model(request, kind):
    return built(adapted(CONFIGS[request.param], kind))


@pytest.fixture(params=list(FAMILY_CONFIGS))
def seed_model(request, kind):
    """The family's tiny model: the source document's lab, or a llama with every feature."""
    return built(adapted(FAMILY_CONFIGS[request.param], kind))


@pytest.fixture
def lab_model(kind):
    """The source document's lab, for checks whose messages name its sizes."""
    return built(adapted(SEED_CONFIG, kind))


def ids_for(config, batch, length, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.vocab_size, (batch, length), generator=generator)


def full_logits(model, ids):
    with torch.inference_mode():
        return model(ids)[0]


def snapshot(cache):
    layers = range(cache.config.layers)
    return (
        cache.length,
        cache.nbytes,
        [cache.keys(layer).clone() for layer in layers],
        [cache.values(layer).clone() for layer in layers],
    )


def assert_unchanged(cache, before):
    length, nbytes, keys, values = before
    assert cache.length == length
    assert cache.nbytes == nbytes
    for layer in range(cache.config.layers):
        assert torch.equal(cache.keys(layer), keys[layer])
        assert torch.equal(cache.values(layer), values[layer])


# --- the source document's four tests, over every kind and config --------------------


def test_stepwise_equivalence_with_shape_and_bytes(model, kind):
    config = model.config
    ids = ids_for(config, batch=2, length=12)
    cache = make(kind, config, batch=2, capacity=12)
    steps, references = [], []
    with torch.inference_mode():
        for t in range(12):
            step_logits, cache = model(ids[:, t : t + 1], cache)
            steps.append(step_logits[:, -1])
            references.append(model(ids[:, : t + 1])[0][:, -1])
            assert cache.length == t + 1
            for layer, window in enumerate(config.layer_windows):
                assert cache.keys(layer).shape == (2, config.kv_heads, held(kind, t + 1, window), config.head_dim)
                assert cache.values(layer).shape == (2, config.kv_heads, held(kind, t + 1, window), config.head_dim)
            assert cache.nbytes == bytes_of(kind, config, 2, t + 1)
            assert cache.reserved_bytes >= cache.nbytes
    assert_logits(kind, torch.stack(steps, dim=1), torch.stack(references, dim=1), config)


def test_chunked_prefill_matches_full_sequence(model, kind):
    config = model.config
    ids = ids_for(config, batch=2, length=12)
    cache = make(kind, config, batch=2, capacity=12)
    with torch.inference_mode():
        prefix_logits, cache = model(ids[:, :7], cache)
        chunk_logits, cache = model(ids[:, 7:], cache)
    reference = full_logits(model, ids)
    assert_logits(kind, torch.cat((prefix_logits, chunk_logits), dim=1), reference, config)
    assert cache.length == 12


def test_request_isolation(seed_model, kind):
    config = seed_model.config
    first, other = ids_for(config, 1, 10, seed=1), ids_for(config, 1, 10, seed=2)

    def run(ids):
        cache = make(kind, config, batch=1, capacity=10)
        with torch.inference_mode():
            logits, cache = seed_model(ids[:, :6], cache)
            more, cache = seed_model(ids[:, 6:], cache)
        return torch.cat((logits, more), dim=1)

    before = run(first)
    run(other)  # a second request in between must not leak into the first
    after = run(first)
    assert torch.equal(before, after)
    # The no-cache entry point starts a fresh cache every call.
    assert torch.equal(full_logits(seed_model, first), full_logits(seed_model, first))


def test_position_capacity(seed_model, kind):
    config = seed_model.config
    capacity = 20
    cache = make(kind, config, batch=1, capacity=capacity)
    ids = ids_for(config, 1, capacity + 1)
    with torch.inference_mode():
        _, cache = seed_model(ids[:, : capacity - 3], cache)
        before = snapshot(cache)
        with pytest.raises(ValueError, match="capacity exceeded.*17 of 20.*needs 21"):
            seed_model(ids[:, : 4], cache)  # straddles the limit
        assert_unchanged(cache, before)
        _, cache = seed_model(ids[:, :3], cache)  # exactly at capacity passes
        assert cache.length == capacity
        before = snapshot(cache)
        with pytest.raises(ValueError, match="capacity exceeded"):
            seed_model(ids[:, :1], cache)  # one more fails
        assert_unchanged(cache, before)


@pytest.mark.parametrize("family", list(FAMILY_CONFIGS))
def test_max_length_is_the_no_cache_limit(family):
    config = dataclasses.replace(FAMILY_CONFIGS[family], max_length=32)
    model = build_model(config, seed=0)
    ids = ids_for(config, 1, 33)
    with torch.inference_mode():
        logits, cache = model(ids[:, :32])
        assert logits.shape == (1, 32, config.vocab_size) and cache.length == 32
        with pytest.raises(ValueError, match="capacity exceeded.*needs 33"):
            model(ids)


# --- beyond the source document ---------------------------------------------------


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_chunk_splits_match_full_sequence(seed_model, kind, data):
    config = seed_model.config
    length = data.draw(st.integers(1, 24), label="length")
    cuts = sorted(data.draw(st.sets(st.integers(1, length - 1), max_size=6), label="cuts")) if length > 1 else []
    bounds = [0, *cuts, length]
    ids = ids_for(config, 2, length, seed=data.draw(st.integers(0, 1000), label="seed"))
    cache = make(kind, config, batch=2, capacity=length)
    pieces = []
    with torch.inference_mode():
        for start, end in zip(bounds, bounds[1:]):
            logits, cache = seed_model(ids[:, start:end], cache)
            pieces.append(logits)
    assert_logits(kind, torch.cat(pieces, dim=1), full_logits(seed_model, ids), config)
    assert cache.nbytes == bytes_of(kind, config, 2, length)


def test_default_cache_from_no_cache_call_continues():
    seed_model = built(SEED_CONFIG)
    config = seed_model.config
    ids = ids_for(config, 1, 9)
    with torch.inference_mode():
        _, cache = seed_model(ids[:, :5])
        assert cache.kind == "concat" and cache.length == 5
        logits, cache = seed_model(ids[:, 5:], cache)
    torch.testing.assert_close(logits, full_logits(seed_model, ids)[:, 5:], **TOLERANCE)


def test_positions_continue_at_cache_length(seed_model, kind):
    """A cache that restarted positions at zero would match only at the first step."""
    config = seed_model.config
    ids = ids_for(config, 1, 6)
    cache = make(kind, config, batch=1, capacity=6)
    with torch.inference_mode():
        _, cache = seed_model(ids[:, :5], cache)
        step, _ = seed_model(ids[:, 5:6], cache)
        restarted, _ = seed_model(ids[:, 5:6])  # the same token at position 0
    reference = full_logits(seed_model, ids)[:, 5]
    assert_logits(kind, step[:, -1:], reference[:, None], config)
    assert not torch.allclose(restarted[:, -1], reference, atol=1e-2, rtol=1e-2)


def test_expected_cache_bytes_formula():
    # The source document: batch 1, 4 heads of width 8, float32 -> 256 bytes per position.
    assert expected_cache_bytes(SEED_CONFIG, 1, 1) == 256
    assert expected_cache_bytes(SEED_CONFIG, 1, 128) == 32_768
    gqa = DecoderConfig(width=64, heads=8, kv_heads=2, layers=3, dtype=torch.bfloat16)
    assert expected_cache_bytes(gqa, 2, 10) == 2 * 3 * 2 * 2 * 10 * 8 * 2


def test_empty_cache(kind):
    cache = make(kind, adapted(SEED_CONFIG, kind), batch=3, capacity=8)
    assert cache.kind == kind
    assert cache.length == 0 and cache.nbytes == 0
    assert cache.keys(0).shape == (3, 4, 0, 8)


# --- validation: ValueError naming expected and actual, cache unchanged ------------


def primed(model, kind, batch=2, length=5, capacity=16):
    cache = make(kind, model.config, batch=batch, capacity=capacity)
    with torch.inference_mode():
        _, cache = model(ids_for(model.config, batch, length), cache)
    return cache


BAD_IDS = {
    "empty sequence": (torch.zeros(2, 0, dtype=torch.long), r"at least one token.*got shape \(2, 0\)"),
    "empty batch": (torch.zeros(0, 3, dtype=torch.long), r"at least one token.*got shape \(0, 3\)"),
    "id too large": (torch.tensor([[1, 128], [2, 3]]), r"\[0, 127\].*vocab_size 128.*max 128"),
    "negative id": (torch.tensor([[1, -1], [2, 3]]), r"\[0, 127\].*min -1"),
    "float ids": (torch.zeros(2, 1), r"int64.*float32"),
    "1-d ids": (torch.zeros(3, dtype=torch.long), r"\(batch, length\).*1 dimensions"),
    "batch mismatch": (torch.zeros(3, 1, dtype=torch.long), r"batch mismatch.*batch 2.*batch 3"),
    "ids on another device": (torch.zeros(2, 1, dtype=torch.long, device="meta"), r"on device cpu.*got device meta"),
}


@pytest.mark.parametrize("case", list(BAD_IDS))
def test_bad_ids_rejected_and_cache_unchanged(seed_model, kind, case):
    ids, message = BAD_IDS[case]
    cache = primed(seed_model, kind)
    before = snapshot(cache)
    with torch.inference_mode(), pytest.raises(ValueError, match=message):
        seed_model(ids, cache)
    assert_unchanged(cache, before)


class Failure(Exception):
    """Raised by attention in the middle of an append, after the cache reserved storage."""


def fail_attention_at(monkeypatch, call: int, error: BaseException):
    """Make the model's attention raise `error` on its `call`-th call (counting from 1)."""
    import kvbench.model as model_module

    real, calls = model_module.causal_attention, []

    def attention(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(model_module, "causal_attention", attention)


@pytest.mark.parametrize("error", [Failure("boom"), KeyboardInterrupt()], ids=["exception", "ctrl-c"])
@pytest.mark.parametrize("chunk", [1, 7], ids=["one token", "a chunk crossing a block"])
@pytest.mark.parametrize("name", ["gqa-layers2-wide", "gemma-alternating"])
def test_a_failure_after_reserve_leaves_the_cache_as_it_was(monkeypatch, kind, chunk, error, name):
    model = built(adapted(CONFIGS[name], kind))
    cache = primed(model, kind, batch=2, length=16 if kind == "paged" else 5, capacity=32)
    before = snapshot(cache)
    free = cache.pool.free_blocks if kind == "paged" else None
    fail_attention_at(monkeypatch, call=2, error=error)  # layer 1 of 2: layer 0 already wrote its keys
    with torch.inference_mode(), pytest.raises(type(error)):
        model(ids_for(model.config, 2, chunk, seed=7), cache)
    assert_unchanged(cache, before)
    if kind == "paged":
        assert cache.pool.free_blocks == free  # no block kept by the failed append
    monkeypatch.undo()
    ids = ids_for(model.config, 2, chunk, seed=7)  # the cache still works, and still matches the full path
    with torch.inference_mode():
        logits, cache = model(ids, cache)
    assert cache.length == before[0] + chunk
    prefix = ids_for(model.config, 2, before[0])  # what primed() fed
    reference = full_logits(model, torch.cat((prefix, ids), dim=1))[:, -chunk:]
    torch.testing.assert_close(logits, reference, atol=1e-5, rtol=1e-5)  # nothing quantized yet: exact for every kind


def test_a_failed_append_after_copy_on_write_gives_the_shared_block_back(monkeypatch):
    from kvbench.cache import PagedCache

    model = build_model(SEED_CONFIG, seed=0)
    parent = make_cache("paged", model.config, batch=1, capacity=64)
    assert isinstance(parent, PagedCache)
    with torch.inference_mode():
        _, parent = model(ids_for(model.config, 1, 5), parent)
        child = parent.fork()
        shared = child.block_table.tolist()
        free, refcount = parent.pool.free_blocks, parent.pool.refcount(shared[0][0])
        fail_attention_at(monkeypatch, call=1, error=Failure("boom"))
        with pytest.raises(Failure):
            model(ids_for(model.config, 1, 1, seed=3), child)  # copies the shared tail block first
    assert child.block_table.tolist() == shared and child.length == 5
    assert parent.pool.free_blocks == free and parent.pool.refcount(shared[0][0]) == refcount == 2


MISMATCHED = {
    "layers": (DecoderConfig(layers=2), r"layers mismatch.*layers=2.*layers=1"),
    "kv heads": (DecoderConfig(kv_heads=2), r"kv_heads mismatch.*kv_heads=2.*kv_heads=4"),
    "head width": (DecoderConfig(width=64), r"head_dim mismatch.*head_dim=16.*head_dim=8"),
    "dtype": (DecoderConfig(dtype=torch.float64), r"dtype mismatch.*float64.*float32"),
    "other config": (DecoderConfig(vocab_size=99), r"another model config"),
}


@pytest.mark.parametrize("case", list(MISMATCHED))
def test_cache_for_another_config_rejected_and_unchanged(lab_model, kind, case):
    config, message = MISMATCHED[case]
    other = built(adapted(config, kind))
    cache = primed(other, kind)
    before = snapshot(cache)
    with torch.inference_mode(), pytest.raises(ValueError, match=message):
        lab_model(ids_for(SEED_CONFIG, 2, 1), cache)
    assert_unchanged(cache, before)


def test_not_a_cache_rejected(seed_model):
    k = torch.zeros(1, 4, 3, 8)
    with pytest.raises(ValueError, match="expected a kvbench Cache.*tuple"):
        seed_model(torch.zeros(1, 1, dtype=torch.long), (k, k))


@pytest.mark.parametrize("capacity", [0, -1, SEED_CONFIG.max_length + 1, 2.5])
def test_bad_capacity_rejected(kind, capacity):
    with pytest.raises(ValueError, match=r"capacity must be an integer in \[1, max_length=2048\]"):
        make(kind, adapted(SEED_CONFIG, kind), batch=1, capacity=capacity)


def test_unknown_kind_rejected():
    with pytest.raises(ValueError, match=r"cache kind must be one of \['concat', 'static', 'paged', .*\], got 'ring'"):
        make_cache("ring", SEED_CONFIG)


@pytest.mark.parametrize("batch", [0, -2, True])
def test_bad_batch_rejected(kind, batch):
    with pytest.raises(ValueError, match="batch must be a positive integer"):
        make(kind, adapted(SEED_CONFIG, kind), batch=batch)


@pytest.mark.parametrize("batch, length", [(-1, 4), (1, -4), (1, 2.5), (True, 4)])
def test_expected_cache_bytes_refuses_impossible_sizes(batch, length):
    with pytest.raises(ValueError, match=r"must be an integer >= 0, got"):
        expected_cache_bytes(SEED_CONFIG, batch, length)


@pytest.mark.parametrize("kind", ["concat", "static"])
def test_a_contiguous_cache_by_default_holds_one_sequence_and_reads_layer_0(kind):
    """The defaults the classes are made with directly, and reserved bytes by value, on a model of two layers."""
    config = CONFIGS["gqa-layers2-wide"]  # 2 layers, 2 KV heads of width 8, float32
    cache = KINDS[kind](config, capacity=6)
    assert cache.batch == 1
    with torch.inference_mode():
        _, cache = built(config)(ids_for(config, 1, 4), cache)
    for layer in range(2):
        assert cache.keys(layer).shape == cache.values(layer).shape == (1, 2, 4, 8)
    assert torch.equal(cache.keys(), cache.keys(0)) and torch.equal(cache.values(), cache.values(0))
    assert not torch.equal(cache.keys(0), cache.keys(1))
    # concat holds what is valid; static its whole capacity: (K, V) * 2 layers * 2 heads * positions * 8 * 4 bytes
    assert cache.reserved_bytes == 2 * 2 * 2 * (4 if kind == "concat" else 6) * 8 * 4
