"""docs/real-model.md's tables, rendered from the committed records under results/real/ (never typed by hand).

Each record's block lies between its own markers, `<!-- quality RECORD: begin -->` and `... end -->`:
the weights and text it was measured on, the quality table, every mode's greedy sample, and the
gate's drift checks of its lossy modes. A peer's record (`--peers PEER:BESIDE ...`: transformers' quantized
cache, measured in a run of its own) is a paragraph between `<!-- peer PEER: begin -->` and its end marker:
its figures, the cache settings it ran with, and whether they are those of kvbench's kind in BESIDE, the
record whose table it is read beside. A needle record (`--needle RECORD ...`, kvbench run --needle) is a block
between `<!-- needle RECORD: begin -->` and its end marker: each mode's retrieval, the safe ratios, every cell.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvbench.files import read_regular_file, write_bytes_atomic
from kvbench.kinds import DRIFT_METRICS
from kvbench.record import RecordView, load_record
from kvbench.report.format import as_sentence, escape_markdown, limits_text, markdown_table, splice
from kvbench.modes import SPECS
from kvbench.report.record.needle import NEEDLE_COLUMNS, grid_cells, grid_columns, needle_cells, needle_summary
from kvbench.report.record.quality import (
    QUALITY_COLUMNS,
    cache_settings,
    kvbench_twin,
    model_sentence,
    quality_cells,
    quality_note,
    quality_rows,
    settings_text,
)


def block(path: Path) -> str:
    view = RecordView(load_record(path), str(path))
    rows = quality_rows(view)
    lines = [f"From `{path}` (`{' '.join(view.command)}`).", "", escape_markdown(as_sentence(model_sentence(view))), ""]
    lines += markdown_table(QUALITY_COLUMNS, [[escape_markdown(text) for text in quality_cells(row)] for row in rows],
                            left=("mode", "greedy departs at"))
    lines += ["", escape_markdown(as_sentence(quality_note(view))), "", "Greedy text after the prompt "
              f"{escape_markdown(repr(view.quality['prompt_text']))}:", ""]
    lines += [f"- {escape_markdown(row.label)}: {escape_markdown(repr(row.sample))}" for row in rows]
    entries = view.quality["modes"]
    lines += ["", "Largest drift over the chunks (what the gate's limits are set against):", ""]
    lines += markdown_table(["mode", "max abs diff", "KL max", "KL mean", "top-1"], [
        [escape_markdown(row.label), f"{entry['max_abs_diff']:.3g}", f"{entry['kl_max']:.3g}",
         f"{entry['kl_mean']:.3g}", f"{entry['top1_agreement']:.3f}"] for row, entry in zip(rows, entries)
        if entry["mode"] != "full"], left=("mode",))
    return "\n".join(lines)


def peer_block(path: Path, beside: Path) -> str:
    """Each transformers quantized cache in `path`'s quality figures, in one paragraph: what it ran with against
    kvbench's kind of the same bits in `beside`, its figures against full's, and its gate."""
    peer, other = (RecordView(load_record(p), str(p)) for p in (path, beside))
    rows = quality_rows(peer)
    full = next(row for row in rows if row.nll_difference is None)  # the baseline: no difference from itself
    paragraphs = []
    for row in rows:
        twin = kvbench_twin(row.mode)
        if twin is None:
            continue
        settings, theirs = cache_settings(peer, row.mode), cache_settings(other, twin)
        against = (f"the settings of kvbench's {twin} in {code(beside)}" if settings == theirs else
                   f"not those of kvbench's {twin} in {code(beside)} ({settings_text(theirs)}): other settings, "
                   "other work")
        cells = [escape_markdown(cell) for cell in quality_cells(row)]
        text = (f"transformers' {row.mode} ({SPECS[row.mode].backend}, {code(path)}: {code(' '.join(peer.command))}) "
                f"ran with {settings_text(settings)}, {against}. On the same chunks: perplexity {cells[1]} against "
                f"full's {full.perplexity:.3f}, Δ NLL {cells[2]}, KL {cells[4]}, top-1 {cells[5]}")
        if row.quantized is not None:
            text += f"; it held {row.quantized} of each {row.held}-token chunk quantized"
        text += (f"; the {peer.quality['generate']}-token greedy sample "
                 + ("does not depart" if row.departure is None else f"departs at token {row.departure}") + ". ")
        text += " ".join(gate_sentence(peer.check(row.mode, length), length) for length in peer.lengths)
        paragraphs.append(text)
    return "\n\n".join(paragraphs)


def needle_block(path: Path) -> str:
    view = RecordView(load_record(path), str(path))
    needle = needle_summary(view)
    lines = [f"From `{path}` (`{' '.join(view.command)}`).", "", escape_markdown(as_sentence(model_sentence(view))), ""]
    lines += markdown_table(NEEDLE_COLUMNS, [[escape_markdown(text) for text in needle_cells(row)] for row in needle.rows],
                            left=("mode",))
    lines += ["", escape_markdown(as_sentence(needle.note)), ""]
    lines += [f"- {escape_markdown(sentence)}" for sentence in needle.safe] + ([""] if needle.safe else [])
    lines += ["Every cell: ✓ where the greedy answer was the code, then the answer's log-prob (nats):", ""]
    lines += markdown_table(grid_columns(needle), [[escape_markdown(text) for text in row] for row in grid_cells(needle)],
                            left=("mode",))
    return "\n".join(lines)


def code(text: object) -> str:
    """A record's path or command as a code span (no markdown inside one; a backtick would end it)."""
    return "`" + str(text).replace("`", "'") + "`"


def gate_sentence(check: dict | None, length: int) -> str:
    """The gate's verdict on a lossy mode's timed cell, with the limits it was judged by and what exceeded them."""
    if check is None:
        return f"It was not checked at length {length}."
    drift = (f"KL mean {check['kl_mean']:.3g}, KL max {check['kl_max']:.3g}, top-1 {check['top1_agreement']:.3f}, "
             f"largest logit difference {check['max_abs_diff']:.3g}")
    limits = f"its limits ({escape_markdown(limits_text(check['limits']))})"
    if check["passed"]:
        return f"At length {length}, its timed cells, the gate passes it within {limits}: {drift}."
    beyond = [DRIFT_NAMES[name] for name, limit in check["limits"].items() if not DRIFT_METRICS[name](check, limit)]
    return f"At length {length}, its timed cells, the gate fails it: {', '.join(beyond)} beyond {limits}; {drift}."


DRIFT_NAMES = {"max_abs_diff": "largest logit difference", "kl_mean": "KL mean", "kl_max": "KL max",
               "top1_agreement": "top-1 agreement"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("records", type=Path, nargs="+")
    parser.add_argument("--peers", nargs="*", default=[], metavar="PEER:BESIDE",
                        help="a transformers cache's record, and the record whose table it is read beside")
    parser.add_argument("--needle", nargs="*", type=Path, default=[], metavar="RECORD",
                        help="a record of kvbench run --needle: its retrieval tables")
    parser.add_argument("--into", type=Path, default=Path("docs/real-model.md"))
    args = parser.parse_args(argv)
    document = read_regular_file(args.into, "markdown file").decode()
    for path in args.records:
        document = splice(document, block(path), str(args.into), f"<!-- quality {path}: begin -->",
                          f"<!-- quality {path}: end -->")
    for pair in args.peers:
        peer, _, beside = pair.partition(":")
        document = splice(document, peer_block(Path(peer), Path(beside)), str(args.into),
                          f"<!-- peer {peer}: begin -->", f"<!-- peer {peer}: end -->")
    for path in args.needle:
        document = splice(document, needle_block(path), str(args.into), f"<!-- needle {path}: begin -->",
                          f"<!-- needle {path}: end -->")
    write_bytes_atomic(args.into, document.encode(), force=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
