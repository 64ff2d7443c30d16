"""A serving record's prefix cache, read back: for every kind replayed with one (`--prefix-cache`, settings with
`prefix_cache`), its token hit rate (hit tokens at each request's first admission over the prompt tokens) beside
the best the trace allows (kvbench.serving.sharing.best_hit_tokens), the blocks it evicted, and its TTFT and
throughput against the same kind without the cache, paired by rotation. Derived from the replays on every read,
never stored. Torch-free."""

from __future__ import annotations

import statistics

from kvbench.measure.latency import median_with_interval
from kvbench.record import RecordView
from kvbench.report.format import ratio_text
from kvbench.report.record.sections import Cell, Column, Section
from kvbench.serving.sharing import best_hit_tokens
from kvbench.serving.trace import trace_from_dict

__all__ = ["prefix_figures", "prefix_section"]
ANY_LENGTH = 1 << 62  # the record's trace was checked against its model on load: no length is refused again


def prefix_figures(view: RecordView, found: dict, paired) -> dict[str, dict]:
    """kind -> {hit_rate, best, of_best, evicted, ttft_p50_lower, throughput} for each kind with a prefix cache:
    medians with their intervals over rotations; `found` and `paired` are the serving report's (figures by mode,
    and its paired ratio of two modes' figure)."""
    trace = trace_from_dict(view.serving.trace, ANY_LENGTH)
    prompts = sum(request.prompt for request in trace.requests)
    between = view.protocol["between_run"]
    out = {}
    for kind in view.modes:
        settings = view.serving.settings.get(kind, {})
        replays = [kept["replay"]["prefix_cache"] for kept in view.serving.replays
                   if kept["mode"] == kind and "prefix_cache" in kept["replay"]]
        if not settings.get("prefix_cache") or not replays:
            continue
        best = sum(best_hit_tokens(trace, settings["block_size"])) / prompts
        rates = [sum(replay["hit_tokens"]) / prompts for replay in replays]
        base = settings.get("kind")
        twin = base in found and kind in found
        on_cpu = first_token_cpu(view, (base, kind)) if twin else None
        out[kind] = {"hit_rate": median_with_interval(rates), "best": best,
                     "of_best": median_with_interval([rate / best for rate in rates]) if best else None,
                     "evicted": median_with_interval([float(replay["evicted"]) for replay in replays]),
                     "base": base, "order": settings.get("order", "fcfs"),
                     "ttft_p50_lower": paired(found, base, kind, "ttft.p50", between) if twin else None,
                     "ttft_p50_lower_cpu": on_cpu and paired(on_cpu, base, kind, "ttft_cpu_p50", between),
                     "throughput": paired(found, kind, base, "output_tokens_per_second", between) if twin else None}
    return out


def first_token_cpu(view: RecordView, modes: tuple[str, str]) -> dict | None:
    """{mode: {rotation: {"ttft_cpu_p50": the median request's first token on the replay thread's CPU time}}} when
    every request arrives at 0 (then its TTFT is its first token's CPU stamp, other processes' time left out);
    None for other arrivals, whose arrival has no CPU stamp."""
    if view.serving.trace["arrivals"] != "all":
        return None
    found: dict[str, dict] = {mode: {} for mode in modes}
    for kept in view.serving.replays:
        requests = kept["replay"]["requests"]
        if kept["mode"] in found and all(request.get("token_cpu_times") for request in requests):
            firsts = [request["token_cpu_times"][0] for request in requests]
            found[kept["mode"]][kept["repetition"]] = {"ttft_cpu_p50": statistics.median(firsts)}
    return found if all(found.values()) else None


def _rate(entry: dict | None, newline: str) -> str:
    if not entry:
        return "-"
    return f"{entry['median']:.1%}{newline}[{entry['low']:.1%}, {entry['high']:.1%}]"


def prefix_section(figures: dict[str, dict], newline: str = "\n") -> Section | None:
    """The prefix cache's table, or None when no kind kept one; each interval under its median where `newline`
    breaks the line (the terminal's and the HTML's cells), beside it where it is a space (markdown's)."""
    if not figures:
        return None
    names = ("kind", "order", "token hit rate", "best possible", "of best", "evicted blocks", "ttft p50 lower by",
             "on CPU time", "throughput x base")
    rows = []
    for kind, entry in figures.items():
        cells = (kind, entry["order"], _rate(entry["hit_rate"], newline), f"{entry['best']:.1%}",
                 _rate(entry["of_best"], newline), f"{entry['evicted']['median']:.0f}",
                 ratio_text(entry["ttft_p50_lower"], newline), ratio_text(entry["ttft_p50_lower_cpu"], newline),
                 ratio_text(entry["throughput"], newline))
        rows.append(tuple(Cell(text) for text in cells))
    columns = tuple(Column(name, left=name in ("kind", "order"), from_record=name == "kind") for name in names)
    return Section("prefix", "prefix cache: token hit rate (hits at first admission / prompt tokens) against the "
                   "trace's best (an infinite cache, requests one after another); TTFT p50 of the kind without the "
                   "cache over with it (on the wall clock, and on the replay thread's CPU time when every request "
                   "arrives at 0), and throughput with it over without; medians over rotations [95% interval]",
                   columns, tuple(rows), narrow=("on CPU time", "evicted blocks", "order", "of best", "best possible"))

