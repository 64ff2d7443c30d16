"""docs/eviction.md's tables, rendered from the committed records under results/eviction/ (never typed by hand).

Each table lies between its markers, `<!-- kvbench eviction-NAME: begin (scripts/eviction_docs.py) -->` and
`<!-- kvbench eviction-NAME: end -->`:

- ratios: per `kvbench run --model ... --evict-ratio R --quality T --contexts C` record, each kind's quality on
  text against full's, the bytes it keeps at C and its decoding step at C against static's, in the same rotations;
- costs: scripts/eviction_costs.py's record, compress() alone at each context;
- kvpress: scripts/kvpress_peer.py's record, what kvpress keeps and what its prefill and step take;
- needle: `kvbench run ... --needle` records (kvbench.workloads.needle), when given.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from kvbench.files import read_regular_file, write_bytes_atomic
from kvbench.record import RecordView, load_record
from kvbench.report.format import escape_markdown, format_bytes, markdown_table, splice
from kvbench.report.record.latency import context_rows
from kvbench.report.record.needle import NEEDLE_COLUMNS, needle_cells, needle_summary
from kvbench.report.record.quality import quality_cells, quality_rows


def marker(name: str, end: bool = False) -> str:
    return f"<!-- kvbench eviction-{name}: {'end' if end else 'begin (scripts/eviction_docs.py)'} -->"


def ms(figure: dict) -> str:
    return f"{figure['median'] * 1e3:.2f} [{figure['low'] * 1e3:.2f}, {figure['high'] * 1e3:.2f}]"


RATIO_COLUMNS = ["kind", "ratio", "perplexity", "Δ NLL vs full (95% CI)", "KL", "top-1", "KV bytes kept",
                 "wall step ms [95%]", "step / static's", "wall first step ms (with the compression)"]


def ratios_block(paths: list[Path]) -> str:
    rows, notes = [], []
    for path in paths:
        view = RecordView(load_record(path), str(path))
        # static's step in the same record: timed in the same rotations as the kinds beside it
        static_steps = {row.context: row.figures["step"]["median"] for row in context_rows(view) if row.mode == "static"}
        ratio = next(iter(view.cache_options(mode).get("evict_ratio") for mode in view.modes
                          if "evict_ratio" in view.cache_options(mode)))
        steps = {(row.mode, row.context): row for row in context_rows(view)}
        for quality in quality_rows(view):
            if quality.mode == "full":
                continue
            cells = quality_cells(quality)
            timed = [(context, row) for (mode, context), row in steps.items() if mode == quality.mode]
            context, step = timed[0] if timed else (None, None)
            memory = view.memory(quality.mode, context) if context else None
            against = (f"{step.figures['step']['median'] / static_steps[context]:.3f}"
                       if step is not None and context in static_steps else "")
            rows.append([escape_markdown(quality.mode), f"{ratio:g}" if quality.mode != "static" else "0",
                         *cells[1:3], *cells[4:6],
                         format_bytes(memory["measured_bytes"]) if memory else "",
                         ms(step.figures["step"]) if step else "", against,
                         ms(step.figures["first_step"]) if step else ""])
        spans = [entry for entry in view.quality["modes"] if entry.get("scored_from")]
        if spans:  # full's perplexity over the tokens the compressing kinds are scored on, beside theirs
            nll = statistics.mean(chunk["reference_nll"] for chunk in spans[0]["chunks"])
            rows.append(["full, the same tokens", f"{ratio:g}", f"{math.exp(nll):.3f}", "baseline", "", "", "", "",
                         "", ""])
        notes.append(f"`{path}`: `{escape_markdown(' '.join(view.command))}`")
    lines = markdown_table(RATIO_COLUMNS, rows, left=("kind",))
    lines += ["", "From " + "; ".join(notes) + "."]
    return "\n".join(lines)


def costs_block(path: Path) -> str:
    found = json.loads(read_regular_file(path))
    contexts = found["contexts"]
    rows = [[kind, *(ms(found["cells"][f"{kind}@{context}"]) for context in contexts)] for kind in found["kinds"]]
    lines = markdown_table(["kind", *(f"compress() at {context}, ms [95%]" for context in contexts)], rows,
                           left=("kind",))
    lines += ["", f"From `{path}`: {found['rotations']} rotations, ratio {found['evict_ratio']:g}, one thread."]
    return "\n".join(lines)


def kvpress_block(path: Path) -> str:
    found = json.loads(read_regular_file(path))
    rows = []
    for run in found["runs"]:
        kept = run["n_kept"]
        prefill, decode = (statistics.median(run["timings"][what]["ns"]) / 1e6 for what in ("prefill", "decode"))
        rows.append([run["method"], run["press"], f"{run['ratio']:g}",
                     f"{kept[0]}" if len(set(kept)) == 1 else f"{kept[0]} … {kept[-1]}",
                     f"{prefill:.0f}", f"{decode:.1f}"])
    lines = markdown_table(["kind", "kvpress press", "ratio", "kept per head (layer 0 … last)",
                            "kvpress compressed prefill ms", "kvpress decode step ms"], rows,
                           left=("kind", "kvpress press"))
    prompt = found["prompt"]
    lines += ["", f"From `{path}`: a prompt of {len(prompt['ids']) - 1} corpus tokens, "
              f"{found['repetitions']} repetitions each, medians."]
    return "\n".join(lines)


def needle_block(path: Path) -> str:
    """Each mode's and ratio's retrieval, and the largest ratio each kind can take, from a `--needle` record."""
    view = RecordView(load_record(path), str(path))
    needle = needle_summary(view)
    lines = markdown_table(NEEDLE_COLUMNS, [[escape_markdown(text) for text in needle_cells(row)] for row in needle.rows],
                           left=("mode",))
    lines += ["", escape_markdown(needle.note), ""]
    lines += [f"- {escape_markdown(sentence)}" for sentence in needle.safe]
    lines += ["", f"From `{path}`: `{escape_markdown(' '.join(view.command))}`."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ratios", type=Path, nargs="+", required=True, metavar="RECORD")
    parser.add_argument("--costs", type=Path, required=True)
    parser.add_argument("--kvpress", type=Path, required=True)
    parser.add_argument("--needle", type=Path, nargs="*", default=[], metavar="RECORD")
    parser.add_argument("--into", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        document = read_regular_file(args.into).decode()
        blocks = {"ratios": ratios_block(args.ratios), "costs": costs_block(args.costs),
                  "kvpress": kvpress_block(args.kvpress)}
        if args.needle:
            blocks["needle"] = "\n\n".join(needle_block(path) for path in args.needle)
        for name, block in blocks.items():
            document = splice(document, block, str(args.into), marker(name), marker(name, end=True))
    except (OSError, ValueError, KeyError) as error:
        print(f"eviction_docs: error: {error}", file=sys.stderr)
        return 2
    write_bytes_atomic(args.into, document.encode(), force=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
