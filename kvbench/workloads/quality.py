"""What a lossy cache does to text: perplexity, KL, top-1 agreement, where greedy text departs, and the text.

Every figure is against the full path of the same weights with nothing evicted or quantized
(for the window kind: the same model without its window; an evicting kind's own rule runs on that model), on the corpus (kvbench.models.corpus):

- teacher-forced over `chunks` runs of `tokens` consecutive corpus tokens, each mode fed one token
  a step as in a decode loop (the window kind excepted: it equals the full prefix masked the same
  way, which the gate checks at every run, so its logits come from that path in one pass per chunk,
  a hundred times cheaper on a 135M model): the mean next-token NLL (its exponential, the perplexity), its
  difference from full's with a 95% t interval over the chunks, KL(P_full || P_mode) and top-1
  agreement; for the window kind also the perplexity of the positions past the window only, where
  the window has evicted something (StreamingLLM's comparison, with and without sinks);
- greedy generation from the first `prompt` tokens of the first chunk: the first step at which the
  mode's token departs from full's, and the text each generated (the record keeps it, the report
  shows it: people would rather read what the cache did to the text than a KL figure).
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor

from kvbench.model import Decoder, decoder_with_weights
from kvbench.modes import spec
from kvbench.workloads.decode import FULL, steps


def windowed(mode: str) -> bool:
    """A kind whose rule is the model's window (the window kind): measured on the windowed model, its logits from
    that model's full path, against full's unwindowed. A kind that evicts by its own rule (ModeSpec.evicts) runs on
    the full model, stepped as in a decode loop, like every other kind."""
    return spec(mode).requires_window


def variant(model: Decoder, **fields) -> Decoder:
    """The same weights under another config (a window and sinks, or none): no copy of a tensor."""
    if all(getattr(model.config, name) == value for name, value in fields.items()):
        return model
    sibling = decoder_with_weights(dataclasses.replace(model.config, **fields), model.state_dict())
    if hasattr(model, "gate_tolerance"):
        sibling.gate_tolerance = model.gate_tolerance
    return sibling


def scored_from(mode: str, length: int) -> int:
    """The first row of a chunk a mode's figures cover: 0, or for a kind that compresses its prompt (ModeSpec
    .compresses_prompt) the last position of the chunk's first half, its prompt, so that every later token is
    predicted from a compressed cache (one token a step from a prompt of one, it would evict nothing)."""
    return max(1, length // 2) - 1 if spec(mode).compresses_prompt else 0


def step_logits(model: Decoder, ids: Tensor, mode: str, options: dict | None, prompt: int = 1) -> tuple[Tensor, dict]:
    """(B, T - prompt + 1, V) next-token logits from position prompt - 1 on, the prompt in one call and then one
    token a step (full: one forward over all of ids, every row), and
    what the mode's cache held after the last step: its bytes and, for a quantized kind, how many of the T
    positions it had quantized (a chunk inside its full-precision residual measures float's drift, not its own)."""
    if not spec(mode).keeps_state:  # full's rows are one forward's: nothing carried from step to step
        with torch.inference_mode():
            return model(ids)[0].float(), {}
    B, T = ids.shape
    kept, held = torch.empty(B, T - prompt + 1, model.config.vocab_size, dtype=model.config.dtype,
                              device=model.device), {}
    with torch.inference_mode():
        for t, (logits, cache) in enumerate(steps(model, ids, mode, prompt, options=options)):
            kept[:, t] = logits
            if t == T - prompt:  # before the generator releases the cache
                held = {"cache_bytes": cache.nbytes}
                if getattr(cache, "quantized_positions", None) is not None:
                    held["quantized_positions"] = cache.quantized_positions
    return kept.float(), held


def token_nll(logits: Tensor, ids: Tensor) -> Tensor:
    """(B, T - 1) NLL of each next token: logits at t predict ids at t + 1, in float64.

    float64 because float32's log-sum-exp over a 49,152-token vocabulary (in the (B, V, T) layout
    cross_entropy's class dimension asks for) read about 1e-4 nats a token low on the CPU: perplexity
    31.3067 where float64 gives 31.3107, a bias larger than the int8 cache's whole effect."""
    rows = logits[:, :-1].double()
    return torch.nn.functional.cross_entropy(rows.flatten(0, 1), ids[:, 1:].flatten(), reduction="none").view(
        rows.shape[:2])


def interval(values: list[float]) -> dict:
    """Mean and its 95% t interval over chunks (a single chunk has none)."""
    from scipy import stats

    n, mean = len(values), sum(values) / len(values)
    if n < 2:
        return {"mean": mean, "low": None, "high": None}
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    return {"mean": mean, "low": mean - half, "high": mean + half}


def greedy(model: Decoder, prompt: Tensor, mode: str, generate: int, options: dict | None) -> list[int]:
    """`generate` greedy tokens after `prompt` (1, P): each step's choice is written into the ids the steps read
    next (decode.steps reads them lazily), so every mode runs its own cache as in a request."""
    ids = torch.cat((prompt, torch.zeros(1, generate - 1, dtype=prompt.dtype, device=prompt.device)), dim=1)
    chosen = []
    with torch.inference_mode():
        for step, (logits, _) in enumerate(steps(model, ids, mode, prompt.shape[1], options=options)):
            chosen.append(int(logits[0].argmax()))
            if step < generate - 1:
                ids[0, prompt.shape[1] + step] = chosen[-1]
    return chosen


def first_departure(tokens: list[int], reference: list[int]) -> int | None:
    return next((step for step, (a, b) in enumerate(zip(tokens, reference)) if a != b), None)


def compare_chunk(reference: Tensor, candidate: Tensor, ids: Tensor, beyond: int | None) -> dict:
    """One chunk's figures for one mode over the rows given: mean NLL (all of them, and past `beyond`), full's over
    the same rows, KL and top-1 against full's."""
    truth, guess = torch.log_softmax(reference, dim=-1), torch.log_softmax(candidate, dim=-1)
    kl = (truth.exp() * (truth - guess)).sum(dim=-1)
    nll = token_nll(candidate, ids)
    found = {"nll": float(nll.mean()), "reference_nll": float(token_nll(reference, ids).mean()),
             "kl": float(kl.mean()), "kl_max": float(kl.max()),
             "max_abs_diff": float((candidate - reference).abs().max()),
             "top1": float((reference.argmax(-1) == candidate.argmax(-1)).double().mean())}
    if beyond is not None and nll.shape[1] > beyond:
        found["nll_beyond"] = float(nll[:, beyond:].mean())
    return found


def measure(model: Decoder, ids: Tensor, modes: list[str], tokenizer, options: dict | None = None,
            chunks: int = 4, prompt: int = 32, generate: int = 48, on_progress=None) -> dict:
    """The quality section of a record: `ids` (1, chunks * tokens) of the corpus, cut into `chunks` runs.

    `model` carries the run's config: a window kind is measured with its window and sinks, and beside
    it without sinks when it has some; the reference is the same weights with no window. `on_progress(done,
    total, what)`, if given, is called after each chunk's logits and each greedy generation (minutes in all on
    a real model, each step as long as the next: a count the caller can estimate from)."""
    full_model = variant(model, window=None, window_pattern=None, sinks=0)
    runs = [(mode, model if windowed(mode) else full_model) for mode in modes if spec(mode).keeps_state]
    if model.config.sinks:  # a windowed kind beside itself without sinks: what the sinks buy
        runs = [run for mode, chosen in runs
                for run in ([(mode, variant(model, sinks=0)), (mode, chosen)] if windowed(mode) else [(mode, chosen)])]
    pieces = ids.to(model.device).view(chunks, -1)  # a text's ids are read on the host
    done, total = 0, (len(runs) + 1) * (chunks + 1)

    def advance(what: str) -> None:
        nonlocal done
        done += 1
        if on_progress is not None:
            on_progress(done, total, what)

    references = []
    for chunk, piece in enumerate(pieces):
        references.append(step_logits(full_model, piece[None], FULL, options)[0])
        advance(f"{FULL} chunk {chunk + 1} of {chunks}")
    full_tokens = greedy(full_model, pieces[0, :prompt][None], "concat", generate, options)  # concat: full, exactly
    advance(f"{FULL} greedy text")
    rows = [summarise(FULL, full_model, [compare_chunk(r, r, p[None], model.config.window)
                                         for r, p in zip(references, pieces)], None, full_tokens, full_tokens, tokenizer)]
    for mode, chosen in runs:
        beyond = chosen.config.window if windowed(mode) else None
        path = FULL if windowed(mode) else mode  # the windowed model's full prefix: the window kind's logits
        found, held = [], {}
        start = scored_from(mode, pieces.shape[1])
        for r, p in zip(references, pieces):  # every chunk as long: the cache holds the same after each
            logits, held = step_logits(chosen, p[None], path, options, start + 1)
            found.append(compare_chunk(r[:, start:], logits, p[None, start:], beyond))
            advance(f"{mode} chunk {len(found)} of {chunks}")
        tokens = greedy(chosen, pieces[0, :prompt][None], mode, generate, options)
        advance(f"{mode} greedy text")
        row = summarise(mode, chosen, found, rows[0]["chunks"], tokens, full_tokens, tokenizer)
        rows.append({**row, **held, **({"scored_from": start} if start else {})})
    return {"tokens": pieces.shape[1], "chunks": chunks, "prompt": prompt, "generate": generate,
            "prompt_text": tokenizer.decode(pieces[0, :prompt].tolist()), "options": dict(options or {}),
            "modes": rows}


def summarise(mode: str, model: Decoder, found: list[dict], full: list[dict] | None, tokens: list[int],
              full_tokens: list[int], tokenizer) -> dict:
    nll = interval([chunk["nll"] for chunk in found])
    row = {"mode": mode, "nll_mean": nll["mean"], "perplexity": math.exp(nll["mean"]),
           "kl_mean": sum(c["kl"] for c in found) / len(found), "kl_max": max(c["kl_max"] for c in found),
           "max_abs_diff": max(c["max_abs_diff"] for c in found),
           "top1_agreement": sum(c["top1"] for c in found) / len(found),
           "greedy_departure": first_departure(tokens, full_tokens), "sample": tokenizer.decode(tokens),
           "chunks": found}
    if windowed(mode):
        row.update(window=model.config.window, sinks=model.config.sinks)
    if full is not None:
        # against full's NLL over the same rows (a compressing kind's are the second half of each chunk)
        row["nll_difference"] = interval([c["nll"] - c.get("reference_nll", f["nll"]) for c, f in zip(found, full)])
        if all("nll_beyond" in c for c in found):
            beyond = [c["nll_beyond"] for c in found]
            row["perplexity_beyond_window"] = math.exp(sum(beyond) / len(beyond))
            row["full_perplexity_beyond_window"] = math.exp(sum(f["nll_beyond"] for f in full) / len(full))
    return row
