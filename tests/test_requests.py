"""kvbench.workloads.requests: a request and a context step, teacher-forced, every kind against the full prefix."""

import time

import pytest
import torch

from kvbench.cache import CACHE_KINDS, KINDS, ConcatCache
from kvbench.workloads.decode import FULL, decode_full, token_ids
from kvbench.workloads.requests import ContextSteps, check_context, check_request, request_logits, time_request
from kvbench.modes import spec

EXACT = [kind for kind in CACHE_KINDS if spec(kind).exact]
KEEPING = [kind for kind in CACHE_KINDS if not spec(kind).compresses_prompt]  # a request ends as the loop does
COMPRESSING = [kind for kind in CACHE_KINDS if spec(kind).compresses_prompt]  # kvbench.cache.scored


@pytest.mark.parametrize("mode", [FULL, *KEEPING])
@pytest.mark.parametrize("batch", [1, 2])
def test_a_request_gives_the_logits_of_the_loop_at_the_positions_it_generates(model_for, mode, batch):
    """The prefill of P tokens in one call, then one token per step: the same next-token logits as the
    full-prefix loop at positions P - 1 .. P + N - 2 (the prefill is a chunked append from zero)."""
    model = model_for(mode)
    ids = token_ids(model.config, batch, 12, seed=4)
    logits = request_logits(model, ids, mode, prompt=7)
    assert logits.shape == (batch, 6, model.config.vocab_size)  # N = 12 - 7 + 1 tokens generated
    torch.testing.assert_close(logits, decode_full(model, ids, keep_logits=True)[:, 6:], atol=1e-5, rtol=1e-5)


def test_the_gate_of_a_request_passes_every_kind_and_fails_a_broken_one(tiny_model, monkeypatch):
    ids = token_ids(tiny_model.config, 1, 16)
    checks = check_request(tiny_model, ids, [FULL, *EXACT[:3]], prompt=9)
    assert all(check["passed"] and check["length"] == 8 for check in checks.values())

    class Broken(ConcatCache):
        def update(self, layer, k, v):
            k, v = super().update(layer, k, v)
            return k, v * (1.5 if self.length >= 9 else 1.0)  # wrong from the first decode step on

    monkeypatch.setitem(KINDS, "concat", Broken)
    broken = check_request(tiny_model, ids, ["concat"], prompt=9)["concat"]
    assert not broken["passed"] and broken["first_divergent_position"] == 1 and broken["failure"] == "diverged"


def test_a_timed_request_keeps_the_prefill_and_every_step():
    """Each step's own time: the parts add up to no more than the whole call took (cumulative times from the
    request's start would add up to several times it)."""
    from kvbench.model import DecoderConfig, build_model

    model = build_model(DecoderConfig(max_length=64))
    ids = token_ids(model.config, 1, 20)
    started = time.perf_counter_ns()
    timed = time_request(model, ids, "static", prompt=12)
    whole = (time.perf_counter_ns() - started) / 1e9
    assert timed["ttft_seconds"] > 0 and len(timed["step_seconds"]) == 8 and min(timed["step_seconds"]) > 0
    assert timed["ttft_seconds"] + sum(timed["step_seconds"]) <= whole


def test_each_step_runs_from_the_end_of_the_one_before(tiny_model):
    """A clock whose k-th reading is k * (k + 1) / 2 ms: the k-th step took exactly k ms."""
    from types import SimpleNamespace

    readings = iter(k * (k + 1) // 2 * 1_000_000 for k in range(100))
    clock = SimpleNamespace(mark=lambda: next(readings), synchronize=lambda: None, elapsed_ns=lambda a, b: b - a)
    timed = time_request(tiny_model, token_ids(tiny_model.config, 1, 12), "static", prompt=8, clock=clock)
    assert timed["ttft_seconds"] == pytest.approx(0.001)
    assert timed["step_seconds"] == pytest.approx([0.002, 0.003, 0.004, 0.005])


@pytest.mark.parametrize("mode", COMPRESSING)
def test_a_kind_that_compresses_its_prompt_is_gated_after_the_compression(model_for, mode):
    """A request and the steps at a context of a scored kind: its prompt compressed before the first new token,
    judged against the full path masked to what each head kept (kvbench.cache.evicting), not against full's."""
    model = model_for(mode)
    ids = token_ids(model.config, 2, 24, seed=5)
    options = {mode: {"evict_ratio": 0.5}}
    checks = check_request(model, ids, [FULL, mode], 14, options)
    assert all(check["passed"] for check in checks.values()) and checks[mode]["length"] == 11
    assert check_context(model, ids, [mode], 12, options, warmup=2, timed=4)[mode]["passed"]
    compressed = request_logits(model, ids, mode, 14, options)
    assert (compressed[:, 1:] - decode_full(model, ids, keep_logits=True)[:, 14:]).abs().max() > 1e-4


@pytest.mark.parametrize("mode", [FULL, *KEEPING])
def test_the_steps_at_a_context_are_the_full_prefix_steps_after_that_context(model_for, mode):
    model = model_for(mode)
    ids = token_ids(model.config, 2, 20, seed=5)
    stepping = ContextSteps(model, ids, mode, context=13, warmup=2, timed=4)
    for _ in range(2):  # prepared afresh before every sample: the same steps each time
        stepping.prepare()
        assert len(stepping.detail()["step_seconds"]) == 2  # the warm-up steps, before the timed call
        stepping()
        assert len(stepping.detail()["step_seconds"]) == 6 and min(stepping.detail()["step_seconds"]) > 0
        stepping.finish()
    assert stepping.stepping is None  # released after the steps
    checks = check_context(model, ids, [FULL, mode], 13, warmup=2, timed=4)
    assert all(check["passed"] for check in checks.values()) and checks[mode]["length"] == 7  # prefill + 6 steps
    torch.testing.assert_close(request_logits(model, ids[:, :19], mode, prompt=13),
                               decode_full(model, ids[:, :19], keep_logits=True)[:, 12:], atol=1e-5, rtol=1e-5)


def test_a_context_beyond_the_ids_or_a_prompt_beyond_them_is_a_value_error(tiny_model):
    ids = token_ids(tiny_model.config, 1, 8)
    with pytest.raises(ValueError, match="4 warm-up and 16 timed steps after 8 tokens need 28 ids, got 8"):
        ContextSteps(tiny_model, ids, "static", context=8)
    with pytest.raises(ValueError, match=r"prompt must be in \[1, 8\] tokens of the 8 ids, got 9"):
        request_logits(tiny_model, ids, "static", prompt=9)


def test_a_contexts_sample_times_the_steady_steps_only_not_the_cache_its_prefill_or_its_release(tiny_model):
    """Issue 28: a cache whose making and releasing each take 200 ms; the samples of its steps must not. (A sleep
    lasts at least its time however busy the machine, and 200 ms is far above what 5 steps of the tiny model
    take even at a load average of 25, so the bounds separate the two cases on a shared machine.)"""
    import time

    from kvbench import modes
    from kvbench.cache import StaticCache
    from kvbench.measure.sampling import sample
    from kvbench.measure.timing import Protocol
    from kvbench.workloads.workload import Contexts

    class Ponderous(StaticCache):
        released = 0

        def __init__(self, *args, **kwargs):
            time.sleep(0.2)
            super().__init__(*args, **kwargs)

        def release(self):
            time.sleep(0.2)
            type(self).released += 1

    modes.register(modes.spec_of_cache("ponderous", Ponderous))
    try:
        workload, ids = Contexts(warmup_steps=2, timed_steps=5), token_ids(tiny_model.config, 1, 40)
        loops = {30: {mode: workload.call(tiny_model, ids, 30, mode, None) for mode in (FULL, "ponderous")}}
        samples = sample(loops, Protocol.fixed(repeats=3, warmup=1)).samples
    finally:
        modes.unregister("ponderous")
    assert Ponderous.released == 4  # the warm-up sample's and each timed sample's, after each
    for kept in samples:
        steps = kept.detail["step_seconds"]
        assert len(steps) == 7 and sum(steps[2:]) <= kept.seconds < 0.2, (kept.mode, kept.seconds)
