"""What a client sees: one request (a prompt of P tokens, then N generated), and the steps at a context.

Teacher-forced like every kvbench loop: the "generated" tokens are predetermined ids, so no
sampling choice changes the work. A request's step 0 is the prefill (the whole prompt in one
call; its last logits give the first token), and steps 1..N-1 feed one token each. `full`
recomputes the whole prefix at every step: its prefill is the cached modes' prefill, its later
steps grow with the context. The steps at a context c follow a prefill of c tokens made outside
the timed region: a few warm-up steps (the first is the cold step right after the prefill), then
a window of consecutive steady-state steps, each timed on its own (for `full`, each a forward of
the whole prefix).

Every one of them drives kvbench.workloads.decode.steps and goes through the same gate as the loops
(kvbench.workloads.decode.judge_logits), on the logits the client's tokens come from.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from kvbench.kinds import CONTEXT_TIMED_STEPS, CONTEXT_WARMUP_STEPS
from kvbench.measure.clock import HOST, Clock, clock_for
from kvbench.measure.timing import step_durations
from kvbench.model import Decoder
from kvbench.modes import FULL
from kvbench.workloads.decode import drain, gated_logits, is_trained, judge_logits, model_tolerances, steps


def request_logits(model: Decoder, ids: Tensor, mode: str, prompt: int, options: dict | None = None) -> Tensor:
    """(B, N, V): the logits of every generated token of one request (ids: the prompt, then N - 1 tokens)."""
    return drain(model, ids, mode, True, options, prompt)


def check_request(model: Decoder, ids: Tensor, modes: list[str], prompt: int,
                  options: dict | None = None) -> dict[str, dict]:
    """Every mode's request against full's, token by token: {mode: check dict}, as the loop gate gives."""
    atol, rtol = model_tolerances(model)
    reference = request_logits(model, ids, FULL, prompt)
    return {mode: judge_logits(mode, *gated_logits(model, ids, mode, prompt, reference, options), atol, rtol,
                               model.config, is_trained(model)).to_dict() for mode in modes}


def time_request(model: Decoder, ids: Tensor, mode: str, prompt: int, options: dict | None = None,
                 clock: Clock | None = None) -> dict:
    """One request, every step timed on its own (on the model's device's clock unless given):
    {"ttft_seconds", "step_seconds": [N - 1 values]}; the N durations add up to the request's end-to-end time."""
    with torch.inference_mode():
        durations = step_durations(steps(model, ids, mode, prompt, options=options),
                                   clock=clock or clock_for(model.device))
    return {"ttft_seconds": durations[0], "step_seconds": durations[1:]}


def step_timer_seconds(count: int = 20_000, clock: Clock = HOST) -> float:
    """What step_durations' clock costs a step: the same loop over a generator that does nothing."""
    def nothing():
        for _ in range(count):
            yield None

    start = clock.now_ns()
    step_durations(nothing(), clock=clock)
    return (clock.now_ns() - start) / count / 1e9


class ContextSteps:
    """The steps after `context` tokens. `prepare()` makes the cache, prefills the context and takes the
    warm-up steps, each timed on its own; calling the object takes the `timed` steady-state steps, each timed
    on its own; `finish()` releases the cache. The sampler times only the call: cache creation, prefill,
    warm-up and release stay outside it. `detail()` gives every step's duration, warm-up first."""

    def __init__(self, model: Decoder, ids: Tensor, mode: str, context: int, options: dict | None = None,
                 warmup: int = CONTEXT_WARMUP_STEPS, timed: int = CONTEXT_TIMED_STEPS) -> None:
        needed = context + warmup + timed
        if ids.shape[1] < needed:
            raise ValueError(f"{warmup} warm-up and {timed} timed steps after {context} tokens need {needed} ids, "
                             f"got {ids.shape[1]}")
        self.model, self.ids, self.mode, self.context = model, ids[:, :needed], mode, context
        self.options, self.warmup, self.timed = options, warmup, timed
        self.stepping: Iterator | None = None
        self.durations: list[float] = []
        self.clock = clock_for(model.device)  # its steps are timed on the device's clock

    def prepare(self) -> None:
        self.finish()
        with torch.inference_mode():
            self.stepping = steps(self.model, self.ids, self.mode, self.context, options=self.options)
            next(self.stepping)  # the prefill of the context
            self.durations = step_durations(self.stepping, self.warmup, self.clock)

    def __call__(self) -> None:
        with torch.inference_mode():
            self.durations += step_durations(self.stepping, self.timed, self.clock)

    def detail(self) -> dict:
        return {"step_seconds": list(self.durations)}

    def finish(self) -> None:
        if self.stepping is not None:
            self.stepping.close()  # a stepper that made its cache releases it
        self.stepping = None


def check_context(model: Decoder, ids: Tensor, modes: list[str], context: int, options: dict | None = None,
                  warmup: int = CONTEXT_WARMUP_STEPS, timed: int = CONTEXT_TIMED_STEPS) -> dict[str, dict]:
    """Every mode's prefill of `context` tokens and every step after it, warm-up and timed, against full's."""
    return check_request(model, ids[:, : context + warmup + timed], modes, context, options)
