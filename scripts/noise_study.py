"""A/A evidence for kvbench's sampling choices: estimator, interval, mode order, CPU pinning.

`collect` runs `kvbench run` again and again on the same commit, cycling through protocol
variants so that every variant sees the same stretch of machine time, and keeps every
record. `analyze` reads them back and asks, per variant and estimator, the questions a
user's verdict depends on: how far apart do two runs of the same code land, how wide is
one run's interval, and how often does the next run's value fall inside it?

    python scripts/noise_study.py collect --runs 6 --out results/noise
    python scripts/noise_study.py analyze results/noise > docs/noise-study.md

Every number in docs/statistics.md's evidence section comes from `analyze` on the
committed records.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import subprocess
import sys
from pathlib import Path

from kvbench.measure import stats
from kvbench.measure.telemetry import tally
from kvbench.record import RecordView
from kvbench.report.comparison.compare import VERDICTS, compare_records

VARIANTS = {  # name -> kvbench run options; every run also uses --repeats ROTATIONS and the default grid
    "rotate": ["--order", "rotate", "--cpu", "none"],
    "random": ["--order", "random", "--cpu", "none"],
    "random-pinned": ["--order", "random", "--cpu", "auto"],
}
ROTATION_COUNTS = (7, 15, 31)


def collect(out: Path, runs: int, rotations: int, variants: list[str]) -> None:
    for index, name in itertools.product(range(runs), variants):
        path = out / name / f"run-{index:02d}.json"
        if path.exists():
            continue
        command = [sys.executable, "-m", "kvbench", "run", "--repeats", str(rotations), "--no-progress",
                   *VARIANTS[name], "--output", str(path)]
        done = subprocess.run(command, capture_output=True, text=True)
        print(f"{name} {index}: exit {done.returncode} {path}", flush=True)
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)


def first(samples: dict[int, float], count: int) -> dict[int, float]:
    return {r: s for r, s in samples.items() if r < count}


def estimates(view: RecordView, estimator: str, rotations: int) -> dict[tuple[str, int], stats.RatioEstimate]:
    """(mode, length) -> speedup over full from the first `rotations` rotations; ("aa", length) for the control."""
    out = {}
    for length in view.lengths:
        base = first(view.samples("full", length), rotations)
        for mode in [m for m in view.modes if m != "full"]:
            mine = first(view.samples(mode, length), rotations)
            if base and mine:
                out[(mode, length)] = stats.paired_ratio(base, mine, estimator, key=(mode, length), resamples=2000)
        twin = view.control
        if twin:
            pair = stats.paired_ratio(first(view.samples(twin, length), rotations),
                                      first(view.samples("control", length), rotations), estimator,
                                      key=("aa", length), resamples=2000)
            if pair is not None:
                out[("aa", length)] = pair
    return out


def variant_table(views: list[RecordView], rotations: int) -> list[str]:
    rows = []
    for estimator in stats.ESTIMATORS:
        runs = [estimates(view, estimator, rotations) for view in views]
        cells = [key for key in runs[0] if key[0] != "aa"]
        spreads, widths, covered, covered_rerun, agree, aa_widths = [], [], 0, 0, 0, []
        pairs = 0
        for key in cells:
            values = [run[key].ratio for run in runs]
            spreads.append(max(values) / min(values) - 1)
            widths += [run[key].half_width for run in runs]
            for a, b in zip(runs, runs[1:]):
                pairs += 1
                covered += a[key].contains(b[key].ratio)
                covered_rerun += stats.rerun_interval(a[key]).contains(b[key].ratio)
                agree += abs(b[key].ratio / a[key].ratio - 1) <= 0.10
        aa_widths = [run[key].half_width for run in runs for key in run if key[0] == "aa"]
        rows.append(f"| {estimator} | {statistics.median(spreads):.1%} | {max(spreads):.1%} | "
                    f"{statistics.median(widths):.1%} | {max(widths):.1%} | {covered / pairs:.0%} | "
                    f"{covered_rerun / pairs:.0%} | {agree / pairs:.0%} | {statistics.median(aa_widths):.1%} |")
    return rows


def block_estimate(estimate: stats.RatioEstimate, blocks: list[float], confidence: float = 0.95) -> stats.RatioEstimate:
    """The estimate with a batch-means interval: the t interval of the mean log ratio over contiguous
    blocks of rotations, whose spread carries the drift of the machine across the run."""
    from scipy import stats as sps

    logs = [math.log(value) for value in blocks]
    half = sps.t.ppf(0.5 + confidence / 2, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return stats.RatioEstimate(estimate.ratio, estimate.ratio * math.exp(-half), estimate.ratio * math.exp(half),
                               estimate.pairs, estimate.estimator, "batch means")


def blocked(view: RecordView, estimator: str, rotations: int, count: int = 5) -> dict:
    """(mode, length) -> the speedup with a batch-means interval over `count` blocks of rotations."""
    out = {}
    size = rotations // count
    whole = estimates(view, estimator, rotations)
    for (mode, length), estimate in whole.items():
        if mode == "aa":
            continue
        base, mine = view.samples("full", length), view.samples(mode, length)
        values = []
        for block in range(count):
            keep = range(block * size, (block + 1) * size)
            part = stats.paired_ratio({r: base[r] for r in keep}, {r: mine[r] for r in keep}, estimator,
                                      key=(mode, length, block), resamples=200)
            values.append(part.ratio)
        out[(mode, length)] = block_estimate(estimate, values)
    return out


def raw_time_table(views: list[RecordView], rotations: int) -> list[str]:
    """Seconds of one cell (not a ratio): how far apart two runs' medians land against one run's interval,
    from order statistics and from batch means over 5 blocks of rotations."""
    spreads, widths, block_widths, covered, covered_rerun, covered_blocks, pairs = [], [], [], 0, 0, 0, 0
    for length in views[0].lengths:
        for mode in views[0].modes:
            medians, intervals, blocked_intervals = [], [], []
            for view in views:
                samples = first(view.samples(mode, length), rotations)
                seconds = list(samples.values())
                low, high = stats.median_interval(seconds)
                median = statistics.median(seconds)
                medians.append(median)
                intervals.append(stats.RatioEstimate(median, low, high, len(seconds), "median", "order statistics"))
                size = rotations // 5
                blocks = [statistics.median([samples[r] for r in range(b * size, (b + 1) * size) if r in samples])
                          for b in range(5)]
                blocked_intervals.append(block_estimate(intervals[-1], blocks))
            spreads.append(max(medians) / min(medians) - 1)
            widths += [interval.half_width for interval in intervals]
            block_widths += [interval.half_width for interval in blocked_intervals]
            for a, b, blocked_a in zip(intervals, intervals[1:], blocked_intervals):
                pairs += 1
                covered += a.contains(b.ratio)
                covered_rerun += stats.rerun_interval(a).contains(b.ratio)
                covered_blocks += blocked_a.contains(b.ratio)
    return [f"| median seconds of a cell | {statistics.median(spreads):.1%} | {max(spreads):.1%} | "
            f"{statistics.median(widths):.1%} | {max(widths):.1%} | {covered / pairs:.0%} | "
            f"{covered_rerun / pairs:.0%} | | |",
            f"| median seconds, batch means of 5 blocks | | | {statistics.median(block_widths):.1%} | "
            f"{max(block_widths):.1%} | {covered_blocks / pairs:.0%} | | | |"]


def compare_table(views: list[RecordView]) -> list[str]:
    """`kvbench compare` on consecutive runs of the same code: every verdict other than "within noise"
    or "unchanged" is a false alarm."""
    counts: dict[str, dict[str, int]] = {}
    for old, new in zip(views, views[1:]):
        for cell in compare_records(old, new).cells:
            kind = "full (time)" if cell.mode == "full" else f"cached ({cell.judged_by})"
            row = counts.setdefault(kind, dict.fromkeys(VERDICTS, 0))
            row[cell.verdict] += 1
    return [f"| {kind} | " + " | ".join(str(row[v]) for v in VERDICTS) + " |" for kind, row in sorted(counts.items())]


def blocked_table(views: list[RecordView], rotations: int) -> list[str]:
    rows = []
    for estimator in stats.ESTIMATORS:
        runs = [blocked(view, estimator, rotations) for view in views]
        widths = [run[key].half_width for run in runs for key in run]
        covered = pairs = 0
        for key in runs[0]:
            for a, b in zip(runs, runs[1:]):
                pairs += 1
                covered += a[key].contains(b[key].ratio)
        rows.append(f"| {estimator}, batch means of 5 blocks | | | {statistics.median(widths):.1%} | "
                    f"{max(widths):.1%} | {covered / pairs:.0%} | | | |")
    return rows


def between_run_table(groups: dict[str, list[RecordView]], rotations: int) -> list[str]:
    """The between-run standard deviation of a speedup (default estimator) and of a cell's median seconds,
    by the method of moments over consecutive runs: var(log b/a) = SE_a^2 + SE_b^2 + 2 sd^2 (the
    within-run errors SE from each run's own interval), so sd^2 = (mean d^2 - mean(SE_a^2 + SE_b^2)) / 2."""
    terms: dict[tuple[str, object], list[tuple[float, float]]] = {}
    for views in groups.values():
        runs = [estimates(view, stats.DEFAULT_ESTIMATOR, rotations) for view in views]
        for key in runs[0]:
            if key[0] == "aa":
                continue
            for a, b in zip(runs, runs[1:]):
                for group in (("speedup", key[1]), ("speedup", "all")):
                    terms.setdefault(group, []).append(stats.between_run_term(a[key], b[key]))
        for length in views[0].lengths:
            for mode in views[0].modes:
                cells = []
                for view in views:
                    seconds = list(first(view.samples(mode, length), rotations).values())
                    low, high = stats.median_interval(seconds)
                    cells.append(stats.RatioEstimate(statistics.median(seconds), low, high, len(seconds)))
                for a, b in zip(cells, cells[1:]):
                    for group in (("seconds", length), ("seconds", "all")):
                        terms.setdefault(group, []).append(stats.between_run_term(a, b))
    rows = []
    for (quantity, length), values in sorted(terms.items(), key=lambda item: (item[0][0], str(item[0][1]).zfill(6))):
        squared, errors = statistics.fmean(v for v, _ in values), statistics.fmean(e for _, e in values)
        sd = stats.between_run_sd(values)
        rows.append(f"| {quantity} | {length} | {len(values)} | {math.sqrt(squared):.2%} | "
                    f"{math.sqrt(errors / 2):.2%} | {sd:.2%} |")
    return rows


def coverage_table(groups: dict[str, list[RecordView]], between_runs: tuple[float, ...]) -> list[str]:
    """How often the next run's speedup falls in the previous run's rerun interval, as kvbench prints it,
    with each candidate between-run allowance, and how wide that interval is."""
    rows = []
    for rotations in ROTATION_COUNTS:
        pairs = []
        for views in groups.values():
            runs = [estimates(view, stats.DEFAULT_ESTIMATOR, rotations) for view in views]
            pairs += [(key[1], a[key], b[key]) for key in runs[0] if key[0] != "aa"
                      for a, b in zip(runs, runs[1:])]
        for sd in between_runs:
            inside: dict[int, list[bool]] = {}
            widths = []
            for length, a, b in pairs:
                interval = stats.rerun_interval(stats.with_between_run(a, sd))
                inside.setdefault(length, []).append(interval.contains(b.ratio))
                widths.append(interval.half_width)
            everything = [hit for hits in inside.values() for hit in hits]
            worst_length, worst = min(((n, statistics.fmean(h)) for n, h in inside.items()), key=lambda x: x[1])
            rows.append(f"| {rotations} | {sd:.2%} | {statistics.fmean(everything):.0%} | {worst:.0%} (T={worst_length}) "
                        f"| {statistics.median(widths):.1%} |")
    return rows


def disturbed_share(views: list[RecordView]) -> str:
    repetitions = [rep for view in views for rep in view.every_repetition()]
    total = len(repetitions)
    disturbed, reasons = tally((rep.seconds, rep.telemetry) for rep in repetitions)
    detail = ", ".join(f"{name} {count / total:.1%}" for name, count in reasons.items())
    return f"{disturbed / total:.1%} of {total} samples disturbed ({detail or 'none'})"


def analyze(root: Path) -> str:
    lines = ["# A/A noise study", "",
             "Same commit, default grid (lengths 16-512; full, concat, static, paged and an A/A control), "
             "runs back to back, variants interleaved. Per estimator: median and worst between-run spread of a "
             "cached speedup (max/min - 1 over the runs), median and worst relative half-width of one run's 95% "
             "confidence interval, how often the next run's value falls inside the previous run's confidence "
             "interval and inside its rerun interval (x sqrt 2), how often two consecutive runs agree within 10%, "
             "and the median half-width of the A/A control's interval.", ""]
    groups = {name: [RecordView.load(path) for path in sorted((root / name).glob("run-*.json"))]
              for name in sorted(p.name for p in root.iterdir() if p.is_dir())}
    groups = {name: views for name, views in groups.items() if len(views) >= 2}
    for name, views in groups.items():
        cpu = views[0].environment.get("cpu", {}).get("brand")
        lines += [f"## {name}: {len(views)} runs on {cpu}", "", disturbed_share(views), ""]
        for rotations in ROTATION_COUNTS:
            if rotations > min(view.planned_repeats for view in views):
                continue
            lines += [f"First {rotations} rotations of each run:", "",
                      "| estimator | spread median | spread worst | half-width median | half-width worst | "
                      "next run in CI | next run in rerun interval | agree within 10% | A/A half-width |",
                      "|---|--:|--:|--:|--:|--:|--:|--:|--:|", *variant_table(views, rotations),
                      *(blocked_table(views, rotations) if rotations >= 15 else []),
                      *raw_time_table(views, rotations), ""]
        lines += ["`kvbench compare` of consecutive runs (all rotations), verdicts per cell:", "",
                  "| cells | " + " | ".join(VERDICTS) + " |", "|---|" + "--:|" * len(VERDICTS), *compare_table(views), ""]
    rotations = min(view.planned_repeats for views in groups.values() for view in views)
    lines += ["## Between runs, all variants pooled", "",
              f"The standard deviation between runs that no run's own interval shows, from the first {rotations} "
              f"rotations (method of moments over consecutive runs; `{stats.DEFAULT_ESTIMATOR}` speedups):", "",
              "| quantity | length | pairs | rms difference | rms within-run SE | between-run SD |",
              "|---|--:|--:|--:|--:|--:|", *between_run_table(groups, rotations), "",
              "The next run's speedup inside the previous run's 95% rerun interval, with each between-run "
              "allowance (kvbench run --between-run):", "",
              "| rotations | allowance | inside | worst length | median half-width |", "|--:|--:|--:|--:|--:|",
              *coverage_table(groups, (0.0, 0.005, stats.BETWEEN_RUN["speedup"], 0.015)), ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    gather = commands.add_parser("collect", help="run kvbench run repeatedly, variants interleaved")
    gather.add_argument("--out", type=Path, default=Path("results/noise"))
    gather.add_argument("--runs", type=int, default=6)
    gather.add_argument("--rotations", type=int, default=31)
    gather.add_argument("--variants", default=",".join(VARIANTS))
    study = commands.add_parser("analyze", help="the evidence tables, as markdown")
    study.add_argument("root", type=Path, nargs="?", default=Path("results/noise"))
    args = parser.parse_args(argv)
    if args.command == "collect":
        collect(args.out, args.runs, args.rotations, args.variants.split(","))
    else:
        sys.stdout.write(analyze(args.root))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
