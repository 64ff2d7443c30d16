"""What a client sees, as rows and texts: a request run's TTFT, TPOT, ITL percentiles, E2E and tokens/s.

The numbers are the record's summary (kvbench.latency computed them from the raw per-step
durations when the record was written, and again when it was loaded); this module only
arranges them for the layouts, as columns.py does for the timing table.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.record import RecordView
from kvbench.report.format import check_text, ms


@dataclass(frozen=True)
class LatencyRow:
    mode: str
    prompt: int
    generate: int
    requests: int
    figures: dict  # kvbench.latency.mode_latency, as the summary holds it
    ratios: dict  # "ttft" / "tpot" -> {"ratio", "low", "high", "pairs"}: the baseline's figure / this mode's
    check: dict | None
    valid: bool


def latency_rows(view: RecordView) -> list[LatencyRow]:
    workload = view.run.get("workload") or {}
    if workload.get("kind") != "request":
        return []
    rows = []
    entries = sorted(view.record["summary"].get("latency", []),
                     key=lambda entry: view.modes.index(entry["mode"]) if entry["mode"] in view.modes else len(view.modes))
    for entry in entries:
        if entry["mode"] not in view.modes:  # the A/A control is the sampling table's
            continue
        mode, length = entry["mode"], entry["length"]
        rows.append(LatencyRow(mode, workload["prompt"], workload["generate"], entry["requests"], entry,
                               entry.get("ratios", {}), view.check(mode, length),
                               view.passed(mode, length) and view.passed(view.baseline, length)))
    return rows


LATENCY_COLUMNS = ("mode", "n", "TTFT ms [95% CI]", "TPOT ms [95% CI]", "ITL p50 / p90 / p99 ms", "E2E ms",
                   "tokens/s", "TTFT ×", "TPOT ×", "equivalence")


def figure_text(figure: dict | None) -> str:
    if not figure:
        return ""
    return f"{ms(figure['median'])} [{ms(figure['low'])}, {ms(figure['high'])}]"


def ratio_text(ratio: dict | None, valid: bool) -> str:
    if not ratio:
        return ""
    if not valid:
        return "invalid"
    half = (ratio["high"] - ratio["low"]) / (2 * ratio["ratio"])
    return f"{ratio['ratio']:.2f}x ±{half:.1%}"


def latency_cells(row: LatencyRow) -> list[str]:
    f = row.figures
    itl = " / ".join(ms(f[f"itl_p{level}"]) for level in (50, 90, 99)) if "itl_p50" in f else ""
    return [row.mode, str(row.requests), figure_text(f.get("ttft")), figure_text(f.get("tpot")), itl,
            ms(f["e2e"]["median"]), f"{f['tokens_per_second']['median']:,.1f}",
            ratio_text(row.ratios.get("ttft"), row.valid), ratio_text(row.ratios.get("tpot"), row.valid),
            check_text(row.check)]


def latency_sentence(rows: list[LatencyRow], baseline: str) -> str:
    first = rows[0]
    return (f"One request per sample: a prompt of {first.prompt} tokens prefilled in one call, then "
            f"{first.generate - 1} one-token steps ({first.generate} tokens generated), teacher-forced. TTFT: the "
            f"prefill, up to the first token's logits; TPOT = (E2E - TTFT) / (N - 1), as vLLM defines it; ITL "
            f"percentiles pool every step of every request; medians with their 95% intervals. TTFT × and TPOT ×: "
            f"{baseline}'s figure / the mode's, the median over rotations, with the rerun interval (±)")
