"""What one sample times: a whole decode loop (the source document's), one request, or one step at a context.

Each workload gives, per cell length, the gate's checks, the memory entry and the call to time;
`kvbench.workloads.benchmark.run_benchmark` drives all three the same way, through the same sampler,
record and report. A cell's `length` is always the positions its cache holds at the end:

  loop      length T: T one-token steps from an empty cache, timed as one loop
  request   length P + N - 1: a prefill of P tokens, then N - 1 steps, every step timed on its own
  contexts  length c: the steady-state steps after c tokens, prefilled with warm-up steps outside the timed region
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
from torch import Tensor

from kvbench.config import positive_int
from kvbench.kinds import CONTEXT_TIMED_STEPS, CONTEXT_WARMUP_STEPS, WORKLOADS
from kvbench.measure import latency
from kvbench.measure.memory import peak_memory_growth
from kvbench.measure.sampling import Sample
from kvbench.measure.timing import Protocol
from kvbench.model import Decoder
from kvbench.modes import SPECS, expected_bytes
import kvbench.workloads.requests as requests
from kvbench.workloads.decode import decode, decode_full, run_gate, steps


class Loop:
    """The seed's unit: one whole teacher-forced decode loop per sample."""

    name = "loop"

    def __init__(self) -> None:
        self.reference: Tensor | None = None

    def describe(self) -> dict:
        return {"kind": self.name}

    def positions(self, length: int) -> int:
        """Token ids a cell of this length consumes."""
        return length

    def reference_spans(self, lengths: list[int]) -> list[tuple[int, int]]:
        """(first, last) prefix lengths of the forwards the gate's full-prefix reference runs: one loop, the longest."""
        return [(1, max(lengths))]

    def compute_reference(self, model: Decoder, ids: Tensor) -> None:
        """The full-prefix logits at every step of the longest length, which every length's gate reads:
        step t depends only on ids[:, :t + 1]."""
        self.reference = decode_full(model, ids, keep_logits=True)

    def gate(self, model: Decoder, ids: Tensor, length: int, modes: list[str], options: dict | None) -> dict:
        if self.reference is None:
            self.compute_reference(model, ids)
        checks = run_gate(model, ids, [length], modes, reference=self.reference, options=options)
        return {mode: checks[(mode, length)] for mode in modes}

    def memory(self, model: Decoder, ids: Tensor, length: int, mode: str, options: dict | None) -> dict:
        return memory_profile(model, ids[:, :length], mode, options)

    def call(self, model: Decoder, ids: Tensor, length: int, mode: str, options: dict | None) -> Callable[[], object]:
        cell = ids[:, :length]
        return lambda: decode(model, cell, mode, options=options)

    def watch(self, protocol: Protocol, baseline: str):
        return None  # every speedup, the sampler's default


class TimedRequest:
    """The call the sampler times for one request; `detail()` hands it the request's per-step durations."""

    def __init__(self, model: Decoder, ids: Tensor, mode: str, prompt: int, options: dict | None) -> None:
        self.model, self.ids, self.mode, self.prompt, self.options = model, ids, mode, prompt, options
        self.last: dict = {}

    def __call__(self) -> None:
        self.last = requests.time_request(self.model, self.ids, self.mode, self.prompt, self.options)

    def detail(self) -> dict:
        return self.last


@dataclass(frozen=True)
class Request:
    """One request per sample: a prefill of `prompt` tokens, then `generate` - 1 one-token steps."""

    prompt: int
    generate: int
    name = "request"

    def __post_init__(self) -> None:
        for field, value in (("prompt", self.prompt), ("generate", self.generate)):
            positive_int(field, value)

    @property
    def length(self) -> int:
        return self.prompt + self.generate - 1

    def describe(self) -> dict:
        return {"kind": self.name, "prompt": self.prompt, "generate": self.generate}

    def positions(self, length: int) -> int:
        return length

    def reference_spans(self, lengths: list[int]) -> list[tuple[int, int]]:
        """The full-prefix request each length's gate runs: the prompt's prefill, then a forward per position."""
        return [(self.prompt, length) for length in lengths]

    def gate(self, model: Decoder, ids: Tensor, length: int, modes: list[str], options: dict | None) -> dict:
        checks = requests.check_request(model, ids[:, :length], modes, self.prompt, options)
        return {mode: {**check, "length": length} for mode, check in checks.items()}

    def memory(self, model: Decoder, ids: Tensor, length: int, mode: str, options: dict | None) -> dict:
        return footprint(model, ids[:, :length], mode, options,
                         lambda: requests.request_logits(model, ids[:, :length], mode, self.prompt, options))

    def call(self, model: Decoder, ids: Tensor, length: int, mode: str, options: dict | None) -> TimedRequest:
        return TimedRequest(model, ids[:, :length], mode, self.prompt, options)

    def timer_seconds(self) -> float:
        return requests.step_timer_seconds()

    def watch(self, protocol: Protocol, baseline: str):
        """TTFT and TPOT against full's, and every mode's own TPOT: each as precise as the protocol asks."""
        def half_widths(samples: list[Sample], length: int) -> dict[str, float]:
            cells: dict[str, list[dict]] = {}
            for kept in samples:
                if kept.length == length:
                    cells.setdefault(kept.mode, []).append(kept.to_dict())
            widths = {}
            for mode, reps in cells.items():
                figure = latency.mode_latency(reps, protocol.batch).get("tpot")
                if figure and len(reps) > 1:
                    widths[f"{mode} tpot"] = (figure["high"] - figure["low"]) / (2 * figure["median"])
                if mode != baseline and baseline in cells:
                    for name in latency.RATIOS:
                        estimate = latency.ratio_to_baseline(cells[baseline], reps, name, protocol.between_run,
                                                             key=("stop", mode, length))
                        if estimate is not None:
                            widths[f"{mode} {name} ratio"] = estimate.half_width
            return widths

        return half_widths


@dataclass(frozen=True)
class Contexts:
    """Per sample, the steady-state steps after a context prefilled, with warm-up steps, outside the timed region."""

    warmup_steps: int = CONTEXT_WARMUP_STEPS
    timed_steps: int = CONTEXT_TIMED_STEPS
    name = "contexts"

    def describe(self) -> dict:
        return {"kind": self.name, "warmup_steps": self.warmup_steps, "timed_steps": self.timed_steps}

    def positions(self, length: int) -> int:
        return length + self.warmup_steps + self.timed_steps

    def reference_spans(self, lengths: list[int]) -> list[tuple[int, int]]:
        """The full-prefix path each context's gate runs: the context's prefill, then its warm-up and timed steps."""
        return [(context, self.positions(context)) for context in lengths]

    def gate(self, model: Decoder, ids: Tensor, length: int, modes: list[str], options: dict | None) -> dict:
        checks = requests.check_context(model, ids, modes, length, options, self.warmup_steps, self.timed_steps)
        return {mode: {**check, "length": length} for mode, check in checks.items()}

    def memory(self, model: Decoder, ids: Tensor, length: int, mode: str, options: dict | None) -> dict:
        stepping = self.call(model, ids, length, mode, options)
        return footprint(model, ids[:, :length], mode, options, lambda: (stepping.prepare(), stepping(),
                                                                         stepping.finish()))

    def call(self, model: Decoder, ids: Tensor, length: int, mode: str, options: dict | None) -> requests.ContextSteps:
        return requests.ContextSteps(model, ids, mode, length, options, self.warmup_steps, self.timed_steps)

    def watch(self, protocol: Protocol, baseline: str):
        return None  # every mode's speedup over full's forwards at those contexts


def weights_read_per_step(model: Decoder) -> int:
    """Bytes of the weights a decode step reads once: every parameter but the embedding tables, of which a
    step reads only its tokens' rows (a table tied to the output head is read whole, by the head)."""
    read = {id(weight) for weight, _ in linear_weights(model)}
    skipped = {id(module.weight) for module in model.modules() if isinstance(module, nn.Embedding)} - read
    return sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in skipped)


def linear_weights(model: Decoder) -> list[tuple[Tensor, str]]:
    """(weight, name) of every matrix a decode step multiplies by: the linear layers, and a tied head's table."""
    found = [(module.weight, name) for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    if getattr(model, "head", True) is None:  # tied: the output head multiplies by the token table
        found.append((model.token.weight, "token (tied head)"))
    return found


def matmul_shapes(model: Decoder, rows: list[int]) -> list[tuple[int, int, int]]:
    """(M, K, N) of every distinct matrix product a step makes, for M = each of `rows` (a decode step's batch,
    a prefill's tokens)."""
    layers = sorted({(weight.shape[1], weight.shape[0]) for weight, _ in linear_weights(model)})
    return [(m, k, n) for m in rows for k, n in layers]


def cache_footprint(model: Decoder, ids: Tensor, mode: str, options: dict | None = None) -> dict:
    """Bytes held at the end of a loop: measured from tensors, reserved, and the mode's formula (transformers'
    caches: what was measured).

    For the full-prefix path this is the throwaway cache of its last step, which is
    one forward pass over the whole sequence (its earlier steps are independent of it).
    """
    B, T = ids.shape
    prompt = 1 if SPECS[mode].keeps_state else T  # a cache's bytes after every step it took
    with torch.inference_mode():
        for t, (_, cache) in enumerate(steps(model, ids, mode, prompt, options=options)):
            if t == T - prompt:  # before the generator releases the cache
                if SPECS[mode].compresses_prompt:  # what it holds once brought back to its budget
                    cache.compress()
                footprint = {"measured_bytes": cache.nbytes, "reserved_bytes": cache.reserved_bytes}
                quantized = getattr(cache, "quantized_positions", None)  # full's throwaway cache is the model's
                if quantized is not None:  # how much of what it held a quantized kind had quantized (the report
                    footprint["quantized_positions"] = quantized  # marks a kind measured inside its residual)
    expected = expected_bytes(mode, model.config, B, T, measured=footprint["measured_bytes"],
                                    **(options or {}).get(mode, {}))
    return {"expected_bytes": expected, **footprint}


def memory_profile(model: Decoder, ids: Tensor, mode: str, options: dict | None = None) -> dict:
    """A loop's memory entry: cache bytes (formula, measured, reserved) and peak RSS growth of one decode loop."""
    if not SPECS[mode].keeps_state:  # its footprint is one forward: the peak is the whole loop's
        _, peak = peak_memory_growth(lambda: decode(model, ids, mode))
        held = cache_footprint(model, ids, mode)
    else:
        held, peak = peak_memory_growth(lambda: cache_footprint(model, ids, mode, options))
    return {**held, **peak}


def footprint(model: Decoder, ids: Tensor, mode: str, options: dict | None, run: Callable[[], object]) -> dict:
    """The bytes a mode's cache holds for ids' positions (formula, measured from a cache filled in one
    prefill, reserved) and the peak resident growth of `run`. transformers' caches have no formula
    here: their expected bytes are the measured ones."""
    B, T = ids.shape
    _, peak = peak_memory_growth(run)
    with torch.inference_mode():
        stepping = steps(model, ids, mode, prompt=T, options=options)  # the prefill only
        _, cache = next(stepping)
        if SPECS[mode].compresses_prompt:  # the prompt as the steps after it hold it: compressed to its budget
            cache.compress()
        found = {"measured_bytes": cache.nbytes, "reserved_bytes": cache.reserved_bytes}
        if getattr(cache, "quantized_positions", None) is not None:  # as decode.cache_footprint records it
            found["quantized_positions"] = cache.quantized_positions
        stepping.close()
    expected = expected_bytes(mode, model.config, B, T, measured=found["measured_bytes"], **(options or {}).get(mode, {}))
    return {"expected_bytes": expected, **found, **peak}


def workload_from(kind: str, prompt: int | None = None, generate: int | None = None,
                  warmup_steps: int = CONTEXT_WARMUP_STEPS, timed_steps: int = CONTEXT_TIMED_STEPS):
    if kind == "request":
        return Request(prompt, generate)
    if kind == "contexts":
        return Contexts(warmup_steps, timed_steps)
    if kind != "loop":
        raise ValueError(f"workload must be one of {list(WORKLOADS)}, got {kind!r}")
    return Loop()
