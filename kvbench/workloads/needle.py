"""Retrieval: a passkey (a needle in a haystack) hidden in the corpus, asked for after it, on a real model.

Perplexity (kvbench.workloads.quality) says how far a cache's next-token distributions drift; it does not say
whether a fact placed early in a long context can still be read back once the cache has evicted or compressed it,
which is what an evicting kind (kvpress's presses: SnapKV, TOVA, H2O, StreamingLLM, ...) puts at risk. So:

- a **cell** is a context length C (in the model's own tokens) and a depth d (percent): the first C - N tokens of
  the corpus (kvbench.models.corpus) with the needle's N tokens, NEEDLE with a 4-digit code drawn for that cell
  from the run's seed, inserted at token offset round(d / 100 * (C - N)) (depth 0: the first tokens; 100: the
  last), at a token boundary, not a sentence boundary (exact depths over natural-looking text);
- the context is the prompt, given to the cache in one call, so an evicting kind compresses it when that first
  step commits, not knowing the question (kvpress's default pipeline); QUESTION then follows one token a step;
- the answer (ANSWER, the code after a space) is scored two ways from the state after the question: (a) greedy
  generation of its length plus EXTRA tokens, correct when the first number in that text is the code; (b) the
  sum of the log-softmax of its tokens teacher-forced after the question (nats, float64). A 135M model answers
  poorly even with every position kept; the log-probability still moves when a cache loses the needle.

The model's tokenizer has no chat template (docs/real-model.md): the prompt is plain text. Every mode runs on the
same cells; `full` is the baseline and runs through the concat kind, which the gate holds to full's logits
(re-running a 4096-token prefix at each of the ~20 later steps would cost minutes a cell). Both scores start from
one state: a kvbench cache after the question is copied (copy.deepcopy), one copy generating and the other
teacher-forced; a mode whose steps are not kvbench's cache steps (transformers' caches, a compiled step) runs
the context twice instead.
"""

from __future__ import annotations

import copy
import random
import re
from dataclasses import dataclass

import torch
from torch import Tensor

from kvbench.cache import make_cache
from kvbench.kinds import EVICT_RATIO, NEEDLE_CONTEXTS, NEEDLE_DEPTHS
from kvbench.model import Decoder
from kvbench.models import corpus
from kvbench.modes import FULL, spec
from kvbench.workloads.decode import cache_steps, steps
from kvbench.workloads.quality import interval, variant, windowed

NEEDLE = " The secret code is {code}."
QUESTION = "\nWhat is the secret code? The secret code is"
ANSWER = " {code}"
EXTRA = 2  # tokens greedy generation runs past the answer's length: a code split otherwise is still read whole
CONTEXTS, DEPTHS, RATIO = NEEDLE_CONTEXTS, NEEDLE_DEPTHS, EVICT_RATIO
CODES = (1000, 10000)  # 4 digits
ACCURACY_LOSS = 0.01  # at most 1 point of accuracy lost against full...
LOGPROB_LOSS = 0.1  # ...and 0.1 nats of mean answer log-probability: a ratio within both is safe
ROUNDING = 1e-9  # a loss of exactly a limit passes: 0.8 - 0.79 is 0.010000000000000009 in floats
BASELINE_KIND = "concat"  # full's numbers, through an exact cache (the gate holds it to full's logits)


@dataclass(frozen=True)
class Cell:
    """One prompt: the context's ids (the needle at `needle_at`), the question's, the answer's."""

    context: int
    depth: int
    code: str
    needle_at: int
    ids: tuple[int, ...]
    question: tuple[int, ...]
    answer: tuple[int, ...]

    @property
    def prompt(self) -> list[int]:
        return [*self.ids, *self.question]


def code_for(seed: int, context: int, depth: int) -> str:
    """The cell's code, from its own generator: the same cell has the same code whatever else the grid holds."""
    return str(random.Random(f"kvbench-needle:{seed}:{context}:{depth}").randrange(*CODES))


def check_depths(depths) -> None:
    bad = [depth for depth in depths if isinstance(depth, bool) or not isinstance(depth, int) or not 0 <= depth <= 100]
    if bad or not depths:
        raise ValueError(f"depths must be integers in [0, 100] (percent of the context), got {list(depths)!r}")


def build_cells(tokenizer, contexts, depths=DEPTHS, seed: int = 0, max_length: int | None = None,
                filler: list[int] | None = None) -> list[Cell]:
    """Every (context, depth) cell, contexts outermost. ValueError, before anything runs, for a depth outside
    [0, 100], a context that cannot hold the needle, or one whose question and answer reach past `max_length`
    positions or whose filler the corpus (or `filler`, ids given instead of the corpus's) cannot supply."""
    check_depths(depths)
    if filler is None:
        filler = list(corpus.corpus_tokens(tokenizer))
    question = tuple(corpus.encode(tokenizer, QUESTION))
    cells = []
    for context in contexts:
        for depth in depths:
            code = code_for(seed, context, depth)
            needle = corpus.encode(tokenizer, NEEDLE.format(code=code))
            answer = tuple(corpus.encode(tokenizer, ANSWER.format(code=code)))
            room = context - len(needle)
            if room < 1:
                raise ValueError(f"context {context}: expected more tokens than the needle's {len(needle)}, got "
                                 f"{context}")
            needed = context + len(question) + len(answer) + EXTRA - 1
            if max_length is not None and needed > max_length:
                raise ValueError(f"context {context}: with the question's {len(question)} tokens and the answer's "
                                 f"{len(answer)} + {EXTRA} generated, expected at most max_length {max_length} "
                                 f"positions, got {needed} (the longest that fits: "
                                 f"{max_length - needed + context})")
            if room > len(filler):
                raise ValueError(f"context {context}: expected at most {len(filler)} filler tokens (the corpus's), "
                                 f"got {room}")
            at = round(depth / 100 * room)
            ids = (*filler[:at], *needle, *filler[at:room])
            cells.append(Cell(context, depth, code, at, ids, question, answer))
    return cells


def matches(generated: str, code: str) -> bool:
    """Whether the first number in the generated text is the code (" 7391." and " 7391 is" are; " 73910" is not)."""
    found = re.search(r"\d+", generated)
    return found is not None and found.group() == code


def forks(mode: str) -> bool:
    """A kvbench cache stepped by decode.cache_steps: its state after the question can be copied and continued."""
    found = spec(mode)
    return found.cache is not None and found.steps() is cache_steps


def answer_scores(model: Decoder, cell: Cell, mode: str, options: dict) -> tuple[list[int], float, int | None]:
    """(greedy tokens, teacher-forced answer log-probability, the cache's bytes after the question) of one cell."""
    prompt, answer = cell.prompt, list(cell.answer)
    length = len(prompt) + len(answer) + EXTRA - 1  # positions the greedy continuation reaches
    ids = torch.tensor([prompt + [0] * (length - len(prompt))], device=model.device)
    if not forks(mode):
        return (greedy_tail(model, ids, mode, cell.context, len(prompt), None, options),
                forced_tail(model, ids, answer, mode, cell.context, len(prompt), None, options), None)
    cache = make_cache(mode, model.config, batch=1, capacity=length, device=model.device, **options)
    try:
        with torch.inference_mode():  # the copy too: the cache's tensors are inference tensors
            for logits, _ in steps(model, ids[:, :len(prompt)], mode, cell.context, cache):
                pass
            held, fork = cache.nbytes, copy.deepcopy(cache)
        try:
            tokens = greedy_tail(model, ids, mode, len(prompt) + 1, len(prompt), fork, options, logits)
        finally:
            fork.release()
        return tokens, forced_tail(model, ids, answer, mode, len(prompt) + 1, len(prompt), cache, options, logits), held
    finally:
        cache.release()


def tail_logits(model: Decoder, ids: Tensor, mode: str, start: int, asked: int, cache, options: dict, first):
    """The logits after each position from asked - 1 on (the first predicts the answer's first token), stepping
    `ids` from `start` (a continued cache: asked + 1, `first` the logits it ended on; else the context's length)."""
    if first is not None:
        yield first
    if ids.shape[1] < start:  # a one-token answer: nothing to continue
        return
    with torch.inference_mode():
        for step, (logits, _) in enumerate(steps(model, ids, mode, start, cache, {mode: options})):
            if start + step >= asked:
                yield logits


def greedy_tail(model, ids: Tensor, mode: str, start: int, asked: int, cache, options: dict, first=None) -> list[int]:
    """Greedy tokens after the question, each written into `ids` before the step that reads it (decode.steps reads
    them lazily), as many as ids has room for after `asked` positions."""
    ids, chosen = ids.clone(), []
    for logits in tail_logits(model, ids, mode, start, asked, cache, options, first):
        chosen.append(int(logits[0].argmax()))
        if asked + len(chosen) - 1 < ids.shape[1]:
            ids[0, asked + len(chosen) - 1] = chosen[-1]
    return chosen


def forced_tail(model, ids: Tensor, answer: list[int], mode: str, start: int, asked: int, cache, options: dict,
                first=None) -> float:
    """The answer's log-probability, its tokens fed after the question: sum of log-softmax, float64."""
    ids = ids[:, :asked + len(answer) - 1].clone()
    ids[0, asked:] = ids.new_tensor(answer[:-1])
    rows = list(tail_logits(model, ids, mode, start, asked, cache, options, first))
    logprobs = torch.log_softmax(torch.stack(rows)[:, 0].double().cpu(), dim=-1)
    rows, answer_ids = (torch.arange(len(answer), device="cpu"), torch.tensor(answer, device="cpu"))  # logprobs': host
    return float(logprobs[rows, answer_ids].sum())


def label(mode: str, options: dict, model: Decoder | None = None) -> str:
    """The mode, its options, and a window kind's window and sinks (the model's), as the quality table names it."""
    window = [f"W={model.config.window}", f"K={model.config.sinks}"] if model is not None and windowed(mode) else []
    return " ".join([mode, *window, *(f"{name}={value}" for name, value in sorted(options.items()))])


def measure(model: Decoder, tokenizer, cells: list[Cell], runs: list[tuple[str, dict]], on_progress=None) -> dict:
    """The needle section of a record: every run (mode, cache options) on every cell, full first (added when the
    runs lack it: the baseline every difference and the safe-ratio rule read). A window kind runs on `model`
    (its window), every other mode on the same weights without one. `on_progress(done, total, what)` after
    each cell (a 4096-token context takes tens of seconds on a 135M model)."""
    full_model = variant(model, window=None, window_pattern=None, sinks=0)
    runs = [(FULL, {})] + [(mode, dict(options)) for mode, options in runs if spec(mode).keeps_state]
    done, total = 0, len(runs) * len(cells)
    rows = []
    for mode, options in runs:
        chosen = model if windowed(mode) else full_model
        found = []
        for cell in cells:
            kept = spec(mode).keeps_state  # full keeps nothing: its figures come through BASELINE_KIND
            tokens, logprob, held = answer_scores(chosen, cell, mode if kept else BASELINE_KIND, options)
            generated = tokenizer.decode(tokens)
            found.append({"context": cell.context, "depth": cell.depth, "answer": cell.code, "generated": generated,
                          "correct": matches(generated, cell.code), "logprob": logprob, "needle_at": cell.needle_at,
                          **({"cache_bytes": held} if held is not None and kept else {})})
            done += 1
            if on_progress is not None:
                on_progress(done, total, f"{label(mode, options, chosen)}: context {cell.context}, depth {cell.depth}%")
        rows.append(summarise(mode, options, found, rows[0]["cells"] if rows else None, label(mode, options, chosen)))
    return {"contexts": sorted({cell.context for cell in cells}), "depths": sorted({cell.depth for cell in cells}),
            "needle": NEEDLE, "question": QUESTION, "answer": ANSWER, "extra": EXTRA,
            "accuracy_loss": ACCURACY_LOSS, "logprob_loss": LOGPROB_LOSS, "modes": rows,
            "safe_ratios": safe_ratios(rows)}


def summarise(mode: str, options: dict, found: list[dict], full: list[dict] | None, name: str) -> dict:
    correct = sum(cell["correct"] for cell in found)
    row = {"mode": mode, "options": options, "label": name, "correct": correct, "cells": found,
           "accuracy": correct / len(found), "logprob": interval([cell["logprob"] for cell in found])}
    if full is not None:  # paired by cell: the same prompt, the same answer
        row["logprob_difference"] = interval([cell["logprob"] - base["logprob"] for cell, base in zip(found, full)])
    return row


def safe_ratios(rows: list[dict]) -> list[dict]:
    """For each mode run at several RATIO values: the largest whose accuracy is within ACCURACY_LOSS of full's and
    whose mean answer log-probability is within LOGPROB_LOSS nats of full's (None: none of them), among the ratios
    tried, each judged alone (a larger safe ratio above an unsafe one is still reported: the grid says which).
    `rows` are measure's: full's first."""
    full, tried = rows[0], {}
    for row in rows[1:]:
        if RATIO in row["options"]:
            tried.setdefault(row["mode"], []).append(row)
    out = []
    for mode, group in tried.items():
        ratios = sorted({row["options"][RATIO] for row in group})
        if len(ratios) < 2:
            continue
        safe = [row["options"][RATIO] for row in group
                if full["accuracy"] - row["accuracy"] <= ACCURACY_LOSS + ROUNDING
                and full["logprob"]["mean"] - row["logprob"]["mean"] <= LOGPROB_LOSS + ROUNDING]
        out.append({"mode": mode, "ratios": ratios, "safe_ratio": max(safe) if safe else None})
    return out


def runs_for(modes: list[str], options: dict, ratios: list[float] | None = None) -> list[tuple[str, dict]]:
    """Each mode with its cache options; with `ratios`, a mode whose cache takes RATIO once per ratio."""
    out = []
    for mode in modes:
        given = dict(options.get(mode, {}))
        if ratios and RATIO in spec(mode).options:
            out += [(mode, {**given, RATIO: ratio}) for ratio in ratios]
        else:
            out.append((mode, given))
    return out
