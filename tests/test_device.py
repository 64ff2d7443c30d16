"""The device seam: every cache kind, the model, a ragged batch and a whole serving replay run on the "meta"
device (shapes without storage), so a tensor made on the CPU by a call that forgot its device= would either be
refused by torch when it meets a meta tensor or be found left on the CPU below."""

import pytest
import torch

from kvbench.cache import BlockPool, PagedCache, make_cache
from kvbench.cache.batch import BatchedCache
from kvbench.model import DecoderConfig, build_model, preset_config
from kvbench.serving.scheduler import Scheduler, TokenSource, make_ledger
from kvbench.serving.trace import make_trace, parse_arrivals, parse_lengths
from kvbench.workloads.decode import token_ids

META = torch.device("meta")
GPT2 = DecoderConfig(max_length=64, window=8)  # a window, so that the window kind can be made too
LLAMA = preset_config("llama-tiny", vocab_size=128, max_length=64, window=8, sinks=2)
KINDS = ["concat", "static", "paged", "quantized-int8", "quantized-int4", "window"]


def tensors_of(value, seen=None):
    """Every tensor an object holds, through its attributes, lists, tuples and dicts."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for item in value.values() for t in tensors_of(item, seen)]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in tensors_of(item, seen)]
    if hasattr(value, "__dict__") and type(value).__module__.startswith("kvbench"):
        return tensors_of(vars(value), seen)
    return []


@pytest.mark.parametrize("config", [GPT2, LLAMA], ids=["gpt2", "llama"])
@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_runs_and_keeps_its_storage_on_the_models_device(config, kind):
    model = build_model(config, seed=0, device="meta")
    assert model.device == META and all(t.device == META for t in model.state_dict().values())
    ids = token_ids(config, 1, 24, device=model.device)
    cache = make_cache(kind, config, 1, 24, device=model.device)
    with torch.inference_mode():
        logits, cache = model(ids[:, :20], cache)  # a chunk past the window: the ring wraps
        for t in range(20, 24):
            logits, cache = model(ids[:, t : t + 1], cache)
    assert logits.device == META and logits.shape == (1, 1, config.vocab_size)
    assert cache.device == META and cache.length == 24
    held = tensors_of(cache)
    assert held and [t.device for t in held if t.device != META] == []


def test_a_ragged_batch_of_one_pool_and_a_fresh_cache_stay_on_the_device():
    model = build_model(DecoderConfig(max_length=64), seed=0, device="meta")
    pool = BlockPool(model.config, 8, 4, model.device)
    rows = [PagedCache(model.config, 1, pool=pool) for _ in range(2)]
    assert {row.device for row in rows} == {META}
    with torch.inference_mode():
        model(torch.zeros(1, 5, dtype=torch.long, device="meta"), rows[0])
        logits, batch = model(torch.zeros(2, 3, dtype=torch.long, device="meta"), BatchedCache(rows, [1, 3]))
        fresh = model(torch.zeros(1, 3, dtype=torch.long, device="meta"))[1]  # no cache given: one on its device
    assert logits.device == META and [row.length for row in rows] == [6, 3]
    assert [t.device for t in tensors_of(batch) + tensors_of(fresh) if t.device != META] == []


def test_a_serving_replay_schedules_on_the_device():
    """The scheduler's ids, padding, pool and caches follow the model: a whole replay, paged and reserving."""
    model = build_model(DecoderConfig(max_length=96), seed=0, device="meta")
    spec = {**parse_lengths("uniform:3-20,2-12"), **parse_arrivals("all"), "requests": 4}
    trace = make_trace(spec, 0, 96)
    for kind in ("paged", "static"):
        ledger = make_ledger(model, kind, 200_000)
        result = Scheduler(model, trace, ledger, TokenSource(128, trace.seed, trace.prefix), False, 16).run()
        assert [len(r["token_times"]) for r in result["requests"]] == [r.emits for r in trace.requests]


def test_the_model_refuses_ids_or_a_cache_on_another_device_by_name():
    model = build_model(DecoderConfig(max_length=64), seed=0)
    with pytest.raises(ValueError, match="ids must be on device cpu, .* got device meta"):
        model(torch.zeros(1, 2, dtype=torch.long, device="meta"))
    with pytest.raises(ValueError, match="cache device mismatch: the model is on device cpu, the cache on device meta"):
        model(torch.zeros(1, 2, dtype=torch.long), make_cache("static", model.config, 1, 8, device="meta"))
    pool = BlockPool(model.config, 4, 4, "meta")
    with pytest.raises(ValueError, match="pool device mismatch: cache needs device cpu, pool is on device meta"):
        PagedCache(model.config, 1, pool=pool, device="cpu")


def test_the_same_seed_gives_the_same_weights_whatever_the_device_asked():
    on_cpu, asked = build_model(GPT2, seed=3), build_model(GPT2, seed=3, device="cpu")
    assert all(torch.equal(a, b) for a, b in zip(on_cpu.state_dict().values(), asked.state_dict().values()))
    assert torch.equal(token_ids(GPT2, 2, 10, device="cpu"), token_ids(GPT2, 2, 10))
