"""docs/real-model.md's tables, rendered from the committed records under results/real/ (never typed by hand).

Each record's block lies between its own markers, `<!-- quality RECORD: begin -->` and `... end -->`:
the weights and text it was measured on, the quality table, every mode's greedy sample, and the
gate's drift checks of its lossy modes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvbench.files import read_regular_file, write_bytes_atomic
from kvbench.record import RecordView, load_record
from kvbench.report.format import as_sentence, escape_markdown, markdown_table, splice
from kvbench.report.record.quality import QUALITY_COLUMNS, model_sentence, quality_cells, quality_note, quality_rows


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("records", type=Path, nargs="+")
    parser.add_argument("--into", type=Path, default=Path("docs/real-model.md"))
    args = parser.parse_args()
    document = read_regular_file(args.into, "markdown file").decode()
    for path in args.records:
        document = splice(document, block(path), str(args.into), f"<!-- quality {path}: begin -->",
                          f"<!-- quality {path}: end -->")
    write_bytes_atomic(args.into, document.encode(), force=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
