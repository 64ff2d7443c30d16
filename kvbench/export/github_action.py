"""github-action-benchmark's custom JSON: a list of {name, unit, value, range, extra}, in two documents, because the
action's `tool` input says of a whole file whether bigger or smaller is better: `customSmallerIsBetter`
(--format github-action-benchmark: times, costs, waste, preemptions) and `customBiggerIsBetter`
(--format github-action-benchmark-bigger-is-better: speedups and throughputs, in their own units).

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
above, and its smaller-is-better quantities: `.../waste` (fraction) and `.../preemptions` (count). Its
throughputs are bigger-is-better: the other document holds them as measured, `.../output_tokens_per_second`
in tokens/s and `.../requests_per_second` in requests/s (an inverse in `1/(tokens/s)` read as nonsense), beside
each valid cell's `... speedup vs <baseline>`.

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
    """A quantity in its own unit: the document of its direction holds it (entries, bigger_entries)."""
    return {"name": f"kvbench/{cell.key}/{quantity.name}{suffix}", "unit": quantity.unit, "value": finite(quantity.value),
            "range": interval_text(quantity.low, quantity.high, quantity.unit, "95% interval of the median"),
            "extra": f"{quantity.meaning}\nsamples: {' '.join(f'{v:.6g}' for v in quantity.values)}"}


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
        [quantity_entry(quantity, cell, suffix) for quantity in cell.quantities if not quantity.higher_is_better]
    return status_noted(out[:1], out[1:], source)


def status_noted(own: list[dict], others: list[dict], source: Source) -> list[dict]:
    """Each entry is charted on its own: each of `others` says it comes from a cut-short run (`own`, the entries
    whose extra holds the cell's facts, say it among them)."""
    if source.status != "complete":
        for entry in others:
            entry["extra"] += f"\nrecord_status: {source.status}"
    return own + others


def bigger_entries(cell: Cell, source: Source, suffix: str) -> list[dict]:
    """customBiggerIsBetter's entries of a cell: its valid speedup over the baseline, and its throughputs."""
    out = []
    speedup = cell.speedup
    if speedup is not None and cell.speedup_valid:
        unit = f"x {cell.baseline}"
        out.append({"name": f"kvbench/{cell.key} speedup vs {cell.baseline}{suffix}", "unit": unit,
                    "value": finite(speedup.ratio), "range": interval_text(speedup.low, speedup.high, unit),
                    "extra": f"{cell.baseline} / {cell.mode}, {speedup.pairs} rotations\n{extra_text(cell, source)}"})
    return status_noted(out, [quantity_entry(quantity, cell, suffix) for quantity in cell.quantities
                              if quantity.higher_is_better], source)


def document(sources: list[Source], options: dict, bigger: bool = False) -> object:
    """The customSmallerIsBetter document (`bigger`: the customBiggerIsBetter one)."""
    commits = sorted({source.commit or "unknown" for source in sources})
    if len(commits) > 1:
        raise ValueError(f"github-action-benchmark files one commit per run (the workflow's); these records come "
                         f"from commits {', '.join(c[:12] for c in commits)}: export each commit's records on its own")
    several = len({source.machine for source in sources}) > 1
    out = []
    for source in sources:
        suffix = f" on {source.machine}" if several else ""
        for cell in source.cells:
            out.extend((bigger_entries if bigger else entries)(cell, source, suffix))
    if not out:  # the action refuses an empty list; only the bigger-is-better document can be empty
        raise ValueError("no bigger-is-better value to export: no cell has a valid speedup or a throughput")
    return out


def bigger_document(sources: list[Source], options: dict) -> object:
    return document(sources, options, bigger=True)
