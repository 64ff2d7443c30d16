"""github-action-benchmark's `customSmallerIsBetter` JSON: a list of {name, unit, value, range, extra}.

Per cell, `kvbench/<case>/<mode>/<length>` in milliseconds (the median of one sample: a whole
decode loop, a whole request, or a context's timed steps; `range` its 95% rerun interval; `extra`
the samples, the speedup with its interval, the machine and the commit), for a cached mode whose
check passed `... cost vs <baseline>`: mode / baseline, the inverse of the speedup, with its
interval, and for a request or contexts cell `.../<figure>` per figure the report shows (ttft, tpot,
itl_p50/p90/p99; step, first_step) in milliseconds, `range` its 95% interval of a median (none for
an ITL percentile), `extra` its meaning and the per-sample values it is the median of. One file is
one tool, and this tool is "smaller is better", so the speedup goes in as the cost it saves, which
is smaller-is-better too.

A serving record's cell (kvbench.export.serving) adds its figures (ttft_p50 ... e2e_p99) in milliseconds as
above, and its quantities: `.../waste` (fraction) and `.../preemptions` (count) as they are, and the
bigger-is-better throughputs inverted, `.../output_tokens_per_second inverse` in `1/(tokens/s)` (seconds per
token), `range` and `extra` saying so, the per-rotation values listed.

The action stamps each run with the workflow's own commit and knows no machines: records from
several machines go into one file with the machine appended to each name, and records must share
one commit.
"""

from __future__ import annotations

from kvbench.export.common import Cell, Quantity, Source, cell_facts, finite
from kvbench.export.figures import Figure

MILLISECONDS = 1e3


def interval_text(low: float, high: float, unit: str, interval: str = "95% rerun interval") -> str:
    return f"{low:.6g} to {high:.6g} {unit} ({interval})"


def milliseconds(values: list[float]) -> str:
    return " ".join(f"{seconds * MILLISECONDS:.6g}" for seconds in values)


def figure_entry(figure: Figure, cell: Cell, suffix: str) -> dict:
    out = {"name": f"kvbench/{cell.key}/{figure.name}{suffix}", "unit": "ms",
           "value": finite(figure.seconds * MILLISECONDS)}
    if figure.low is not None:
        out["range"] = interval_text(figure.low * MILLISECONDS, figure.high * MILLISECONDS, "ms",
                                     "95% interval of the median")
    samples = cell.series[figure.series]
    what = (f"samples ms: {milliseconds(samples)}" if figure.low is not None
            else f"pooled over {len(samples)} steps")
    out["extra"] = f"{figure.meaning}\n{what}"
    return out


def quantity_entry(quantity: Quantity, cell: Cell, suffix: str) -> dict:
    """A quantity as the smaller-is-better tool takes it: a bigger-is-better one inverted, and saying so."""
    value, low, high, unit, name = quantity.value, quantity.low, quantity.high, quantity.unit, quantity.name
    values, note = quantity.values, ""
    if quantity.higher_is_better:
        note = f"; inverted (this tool holds smaller-is-better values): 1 / {value:.6g} {unit}"
        value, low, high, unit, name = 1 / value, 1 / high, 1 / low, f"1/({unit})", f"{name} inverse"
        values = [1 / v for v in values]
    return {"name": f"kvbench/{cell.key}/{name}{suffix}", "unit": unit, "value": finite(value),
            "range": interval_text(low, high, unit, "95% interval of the median"),
            "extra": f"{quantity.meaning}{note}\nsamples: {' '.join(f'{v:.6g}' for v in values)}"}


def extra_text(cell: Cell, source: Source) -> str:
    facts = cell_facts(cell, source)
    lines = [f"{key}: {value}" for key, value in facts.items() if value is not None]
    lines.append("samples ms: " + milliseconds(cell.seconds))
    return "\n".join(lines)


def entries(cell: Cell, source: Source, suffix: str) -> list[dict]:
    median = cell.median
    out = [{"name": f"kvbench/{cell.key}{suffix}", "unit": "ms", "value": finite(median.ratio * MILLISECONDS),
            "range": interval_text(median.low * MILLISECONDS, median.high * MILLISECONDS, "ms"),
            "extra": extra_text(cell, source)}]
    cost = cell.cost
    if cost is not None and cell.speedup_valid:
        out.append({"name": f"kvbench/{cell.key} cost vs {cell.baseline}{suffix}", "unit": f"x {cell.baseline}",
                    "value": finite(cost.ratio), "range": interval_text(cost.low, cost.high, f"x {cell.baseline}"),
                    "extra": f"speedup {cell.speedup.ratio:.6g}x ({cell.baseline} / {cell.mode}); cost = 1 / speedup"})
    out += [figure_entry(figure, cell, suffix) for figure in cell.figures] + \
        [quantity_entry(quantity, cell, suffix) for quantity in cell.quantities]
    if source.status != "complete":  # each entry is charted on its own: each says it comes from a cut-short run
        for entry in out[1:]:  # the cell's own says it among its facts
            entry["extra"] += f"\nrecord_status: {source.status}"
    return out


def document(sources: list[Source], options: dict) -> object:
    commits = sorted({source.commit or "unknown" for source in sources})
    if len(commits) > 1:
        raise ValueError(f"github-action-benchmark files one commit per run (the workflow's); these records come "
                         f"from commits {', '.join(c[:12] for c in commits)}: export each commit's records on its own")
    several = len({source.machine for source in sources}) > 1
    out = []
    for source in sources:
        suffix = f" on {source.machine}" if several else ""
        for cell in source.cells:
            out.extend(entries(cell, source, suffix))
    return out
