"""A real model's sections of a report: which weights and text were measured, and what each mode did to the text.

Read from the record's `model`, `token_ids` and `quality` sections (kvbench.workloads.quality wrote the
last); every layout renders the same rows and sentences.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvbench.config import PlainConfig
from kvbench.kinds import GROUP_SIZE, QUANTIZED_SHARE_FLOOR, RESIDUAL, expected_cache_bytes
from kvbench.modes import KVBENCH, SPECS, TRANSFORMERS, expected_bytes, quantized_positions
from kvbench.record import RecordView

QUALITY_COLUMNS = ["mode", "perplexity", "Δ NLL vs full (95% CI)", "beyond window (full's)", "KL", "top-1",
                   "greedy departs at", "quantized"]
QUALITY_SENTENCE = ("Teacher-forced on the corpus, each mode one token a step, against full's logits of the same "
                    "weights (for a window: without it): perplexity = exp(mean next-token NLL); Δ NLL = the mode's "
                    "mean NLL minus full's, 95% t interval over the chunks; KL(P_full || P_mode) per token, nats; "
                    "top-1 = share of positions whose most likely token agrees; greedy departs at = the first "
                    "generated token that differs from full's greedy text (none: the whole sample agrees); "
                    "quantized = positions a quantized kind held quantized after a chunk's last step, of the chunk's")


@dataclass(frozen=True)
class QualityRow:
    label: str
    perplexity: float
    nll_difference: dict | None
    beyond: tuple[float, float] | None  # the window's perplexity past W, and full's over the same positions
    kl: float
    top1: float
    departure: int | None
    sample: str
    held: int = 0  # positions the cache held after a chunk's last step (the chunk's tokens)
    mode: str = ""
    bytes_ratio: float | None = None  # its cache's bytes after a chunk, of the float formula's (None: unknown)
    quantized: int | None = None  # of them, a quantized kind's in its quantized store (kvbench.modes)
    marks: tuple[str, ...] = ()  # "unquantized" below QUANTIZED_SHARE_FLOOR (kvbench.report.record.model.MARKS)


def label_of(entry: dict) -> str:
    if "window" in entry:  # a windowed kind's row names its window and sinks
        return f"window W={entry['window']} K={entry['sinks']}"
    return entry["mode"]


def quality_rows(view: RecordView) -> list[QualityRow]:
    quality = view.quality
    if not quality:
        return []
    out = []
    for entry in quality["modes"]:
        held = quality["tokens"]
        quantized = quantized_positions(entry["mode"], held, entry.get("quantized_positions"),
                                        **quality.get("options", {}).get(entry["mode"], {}))
        out.append(QualityRow(
            label=label_of(entry), perplexity=entry["perplexity"], nll_difference=entry.get("nll_difference"),
            beyond=(entry["perplexity_beyond_window"], entry["full_perplexity_beyond_window"])
            if "perplexity_beyond_window" in entry else None,
            kl=entry["kl_mean"], top1=entry["top1_agreement"], departure=entry["greedy_departure"],
            sample=entry["sample"], held=held, quantized=quantized, mode=entry["mode"],
            bytes_ratio=bytes_ratio(view, entry, held),
            marks=("unquantized",) if quantized is not None and quantized < QUANTIZED_SHARE_FLOOR * held else ()))
    return out


def bytes_ratio(view: RecordView, entry: dict, held: int) -> float | None:
    """A mode's cache bytes after a chunk (as measured, else its formula at the chunk's length, batch 1) over the
    float formula's: where the bytes-against-drift plot puts its quality KL. None for full, which keeps no cache,
    and for a mode without a formula in a record from before the bytes were kept (transformers' caches)."""
    found = SPECS.get(entry["mode"])
    if found is not None and not found.keeps_state:  # full's throwaway cache is no kind's
        return None
    config = PlainConfig.from_dict(view.config)
    if "sinks" in entry and config.window is not None:  # a window beside itself without sinks keeps fewer
        config = dataclasses.replace(config, sinks=entry["sinks"])
    nbytes = entry.get("cache_bytes")
    if nbytes is None:
        try:
            nbytes = expected_bytes(entry["mode"], config, 1, held, **view.quality.get("options", {}).get(entry["mode"], {}))
        except ValueError:  # no formula, nothing measured
            return None
    return nbytes / expected_cache_bytes(config, 1, held)


def quantized_text(row: QualityRow) -> str:
    """A quantized kind's positions held quantized after a chunk, of the chunk's; blank for other kinds."""
    return "" if row.quantized is None else f"{row.quantized} of {row.held}"


def quality_cells(row: QualityRow) -> list[str]:
    difference = row.nll_difference
    if difference is None:
        delta = "baseline"
    elif difference["low"] is None:
        delta = f"{difference['mean']:+.4f}"
    else:
        delta = f"{difference['mean']:+.4f} [{difference['low']:+.4f}, {difference['high']:+.4f}]"
    beyond = f"{row.beyond[0]:.2f} ({row.beyond[1]:.2f})" if row.beyond else ""
    departs = "none" if row.departure is None else f"token {row.departure}"
    return [row.label, f"{row.perplexity:.3f}", delta, beyond, f"{row.kl:.2e}", f"{row.top1:.3f}", departs,
            quantized_text(row)]


def quality_note(view: RecordView) -> str | None:
    quality = view.quality
    if not quality:
        return None
    differences = peer_settings_sentences(view, view)
    compressing = [entry["mode"] for entry in quality["modes"] if entry.get("scored_from")]
    if compressing:  # kvbench.workloads.quality.scored_from
        start = next(entry["scored_from"] for entry in quality["modes"] if entry.get("scored_from"))
        differences.append(f"{', '.join(compressing)} compress their prompt: each chunk's first {start + 1} tokens "
                           "are their prompt, and their figures are over the tokens after it, each predicted from "
                           "the compressed cache, against full's over the same tokens")
    return (f"{QUALITY_SENTENCE}. {quality['chunks']} chunks of {quality['tokens']} tokens; greedy text: "
            f"{quality['generate']} tokens after the corpus's first {quality['prompt']}"
            + "".join(f". {sentence}" for sentence in differences))


def cache_settings(view: RecordView, mode: str) -> dict:
    """The quantized cache options `mode`'s quality was measured with, defaults filled in: the record keeps what
    the run gave, and kvbench.hf makes transformers' QuantizedCache with kvbench's defaults."""
    return {"group_size": GROUP_SIZE, "residual": RESIDUAL, **(view.quality or {}).get("options", {}).get(mode, {})}


def kvbench_twin(mode: str) -> str | None:
    """kvbench's own quantized kind of the bits of transformers' quantized cache `mode`; None for any other mode."""
    found = SPECS.get(mode)
    if found is None or found.source != TRANSFORMERS or not found.bits:
        return None
    return next((name for name, spec in SPECS.items() if spec.source == KVBENCH and spec.bits == found.bits), None)


def settings_text(settings: dict) -> str:
    return f"group {settings['group_size']} and residual {settings['residual']}"


def peer_settings_sentences(peer: RecordView, beside: RecordView) -> list[str]:
    """Where a transformers quantized cache's quality (in `peer`) sits beside kvbench's kind of the same bits (in
    `beside`: the same record, or the one a document sets it beside) with other cache settings, each difference in
    words: a peer's figure measured with another residual describes other work."""
    theirs = {entry["mode"] for entry in (beside.quality or {}).get("modes", [])}
    out = []
    for entry in (peer.quality or {}).get("modes", []):
        twin = kvbench_twin(entry["mode"])
        mine = cache_settings(peer, entry["mode"])
        if twin in theirs and mine != cache_settings(beside, twin):
            out.append(f"{entry['mode']} ran with {settings_text(mine)}, {twin} beside it with "
                       f"{settings_text(cache_settings(beside, twin))}: not the same cache settings, not the same work")
    return out


def model_sentence(view: RecordView) -> str | None:
    """Which weights and which text: the record's account of the GGUF file and the corpus."""
    model, tokens = view.model_file, view.token_ids
    if not model:
        return None
    types = ", ".join(f"{name} ({count})" for name, count in model["quantization"].items())
    text = ""
    if tokens and tokens["source"] == "corpus":  # the schema requires its name and digest
        text = f"token ids from the corpus {tokens['name']} (sha256 {tokens['sha256'][:12]}…)"
    elif tokens:
        text = f"{tokens['source']} token ids"
    return (f"Weights: {model.get('name') or model['path']}, {model['architecture']} GGUF {model['path']} "
            f"({model['size']:,} bytes, sha256 {model['sha256'][:12]}…), tensor types {types}, dequantized to "
            f"{model['dequantized_to']} (not the original float weights); {text}")
