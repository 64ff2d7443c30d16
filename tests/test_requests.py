"""kvbench.requests: a request and a context step, teacher-forced, every kind against the full prefix."""

import time

import pytest
import torch

from kvbench.cache import CACHE_KINDS, KINDS, ConcatCache
from kvbench.decode import FULL, decode_full, token_ids
from kvbench.requests import ContextStep, check_context, check_request, request_logits, time_request

EXACT = [kind for kind in CACHE_KINDS if KINDS[kind].exact]


@pytest.mark.parametrize("mode", [FULL, *CACHE_KINDS])
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


def test_each_step_runs_from_the_end_of_the_one_before(tiny_model, monkeypatch):
    """A clock whose k-th reading is k * (k + 1) / 2 ms: the k-th step took exactly k ms."""
    from types import SimpleNamespace

    from kvbench import requests

    readings = iter(k * (k + 1) // 2 * 1_000_000 for k in range(100))
    monkeypatch.setattr(requests, "time", SimpleNamespace(perf_counter_ns=lambda: next(readings)))
    timed = time_request(tiny_model, token_ids(tiny_model.config, 1, 12), "static", prompt=8)
    assert timed["ttft_seconds"] == pytest.approx(0.001)
    assert timed["step_seconds"] == pytest.approx([0.002, 0.003, 0.004, 0.005])


@pytest.mark.parametrize("mode", [FULL, *CACHE_KINDS])
def test_a_context_step_is_the_full_prefix_step_after_that_context(model_for, mode):
    model = model_for(mode)
    ids = token_ids(model.config, 2, 20, seed=5)
    step = ContextStep(model, ids, mode, context=13)
    for _ in range(2):  # prepared afresh before every sample: the same step each time
        step.prepare()
        torch.testing.assert_close(step(), decode_full(model, ids[:, :14], keep_logits=True)[:, -1],
                                   atol=1e-5, rtol=1e-5)
    assert step.cache is None  # released after the step
    assert all(check["passed"] for check in check_context(model, ids, [FULL, mode], 13).values())


def test_a_context_beyond_the_ids_or_a_prompt_beyond_them_is_a_value_error(tiny_model):
    ids = token_ids(tiny_model.config, 1, 8)
    with pytest.raises(ValueError, match="a step after 8 tokens needs 9 ids, got 8"):
        ContextStep(tiny_model, ids, "static", context=8)
    with pytest.raises(ValueError, match=r"prompt must be in \[1, 8\] tokens of the 8 ids, got 9"):
        request_logits(tiny_model, ids, "static", prompt=9)
