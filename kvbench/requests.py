"""What a client sees: one request (a prompt of P tokens, then N generated), and one decode step at a context.

Teacher-forced like every kvbench loop: the "generated" tokens are predetermined ids, so no
sampling choice changes the work. A request's step 0 is the prefill (the whole prompt in one
call; its last logits give the first token), and steps 1..N-1 feed one token each. `full`
recomputes the whole prefix at every step: its prefill is the cached modes' prefill, its later
steps grow with the context. A context step is the (c+1)-th token after c tokens were
prefilled outside the timed region (for `full`, one forward of c + 1 tokens).

Both go through the same gate as the loops (kvbench.decode.judge_logits), on the logits the
client's tokens come from.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch
from torch import Tensor

from kvbench.cache import Cache, make_cache
from kvbench.decode import FULL, HF_MODES, is_trained, judge_logits, model_tolerances
from kvbench.model import Decoder


def request_steps(model: Decoder, ids: Tensor, mode: str, prompt: int,
                  options: dict | None = None) -> Iterator[tuple[Tensor, Cache]]:
    """Yields (logits (B, V) the next token is read from, the cache) for the prefill, then each later step.

    ids (B, P + N - 1): the prompt, then the N - 1 generated tokens fed back; N steps in all.
    """
    B, T = ids.shape
    if not 1 <= prompt <= T:
        raise ValueError(f"prompt must be in [1, {T}] tokens of the {T} ids, got {prompt}")
    if mode == FULL:
        for end in range(prompt, T + 1):
            logits, cache = model(ids[:, :end])
            yield logits[:, -1], cache
        return
    if mode in HF_MODES:  # transformers' own cache on the same weights: its prefill, then its steps
        from kvbench import hf

        yield from hf.steps(model, ids, mode, prompt, (options or {}).get(mode))
        return
    cache = make_cache(mode, model.config, batch=B, capacity=T, **(options or {}).get(mode, {}))
    try:
        logits, cache = model(ids[:, :prompt], cache)
        yield logits[:, -1], cache
        for t in range(prompt, T):
            logits, cache = model(ids[:, t : t + 1], cache)
            yield logits[:, -1], cache
    finally:
        cache.release()


def request_logits(model: Decoder, ids: Tensor, mode: str, prompt: int, options: dict | None = None) -> Tensor:
    """(B, N, V): the logits of every generated token of one request."""
    with torch.inference_mode():
        return torch.stack([logits for logits, _ in request_steps(model, ids, mode, prompt, options)], dim=1)


def check_request(model: Decoder, ids: Tensor, modes: list[str], prompt: int,
                  options: dict | None = None) -> dict[str, dict]:
    """Every mode's request against full's, token by token: {mode: check dict}, as the loop gate gives."""
    atol, rtol = model_tolerances(model)
    reference = request_logits(model, ids, FULL, prompt)
    return {mode: judge_logits(mode, reference if mode == FULL else request_logits(model, ids, mode, prompt, options),
                               reference, atol, rtol, model.config, is_trained(model)).to_dict() for mode in modes}


def time_request(model: Decoder, ids: Tensor, mode: str, prompt: int, options: dict | None = None) -> dict:
    """One request, every step timed on its own: {"ttft_seconds", "step_seconds": [N - 1 values]}.

    The clock is read once between two steps, so a step's time runs from the end of the one before
    it to its own logits: the N durations add up to the request's end-to-end time."""
    durations = []
    with torch.inference_mode():
        steps = request_steps(model, ids, mode, prompt, options)
        last = time.perf_counter_ns()
        for _ in steps:
            now = time.perf_counter_ns()
            durations.append((now - last) / 1e9)
            last = now
    return {"ttft_seconds": durations[0], "step_seconds": durations[1:]}


def step_timer_seconds(count: int = 20_000) -> float:
    """What time_request's clock costs a step: the same loop over a generator that does nothing."""
    def nothing():
        for _ in range(count):
            yield None

    durations = []
    start = last = time.perf_counter_ns()
    for _ in nothing():
        now = time.perf_counter_ns()
        durations.append((now - last) / 1e9)
        last = now
    return (time.perf_counter_ns() - start) / count / 1e9


class ContextStep:
    """One decode step after `context` tokens: `prepare()` prefills a fresh cache outside the timed region,
    calling the object times the step itself (for `full`: one forward of context + 1 tokens)."""

    def __init__(self, model: Decoder, ids: Tensor, mode: str, context: int, options: dict | None = None) -> None:
        if ids.shape[1] < context + 1:
            raise ValueError(f"a step after {context} tokens needs {context + 1} ids, got {ids.shape[1]}")
        self.model, self.ids, self.mode, self.context, self.options = model, ids[:, : context + 1], mode, context, options
        self.steps: Iterator[tuple[Tensor, Cache]] | None = None
        self.cache: Cache | None = None

    def prepare(self) -> None:
        if self.mode == FULL:
            return
        self.release()
        with torch.inference_mode():
            self.steps = request_steps(self.model, self.ids, self.mode, self.context, self.options)
            _, self.cache = next(self.steps)  # the prefill of the context

    def __call__(self) -> Tensor:
        with torch.inference_mode():
            if self.mode == FULL:
                return self.model(self.ids)[0][:, -1]
            logits, _ = next(self.steps)  # the step after it
        self.release()
        return logits

    def release(self) -> None:
        if self.steps is not None:
            self.steps.close()  # the generator releases its cache
        self.steps = self.cache = None


def check_context(model: Decoder, ids: Tensor, modes: list[str], context: int,
                  options: dict | None = None) -> dict[str, dict]:
    """Every mode's step after `context` tokens against full's forward of context + 1 tokens."""
    atol, rtol = model_tolerances(model)
    found = {}
    for mode in [FULL, *[m for m in modes if m != FULL]]:
        step = ContextStep(model, ids, mode, context, options)
        step.prepare()
        found[mode] = step()[:, None]  # (B, 1, V)
    return {mode: judge_logits(mode, found[mode], found[FULL], atol, rtol, model.config, is_trained(model)).to_dict()
            for mode in modes}
