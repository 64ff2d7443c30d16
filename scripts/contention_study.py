"""Which speedup estimator to trust on a contended machine, by evidence.

`collect` runs the default grid again and again under conditions anyone can produce, the
conditions interleaved so that each sees the same stretch of machine time:

  quiet     nothing else running (the run pinned to CPU 0, as in the other conditions)
  busy-25   a busy loop pinned to CPU 0, the run's CPU, 2.5 ms of every 10 ms (scripts/antagonist.py)
  memory    a memory-bandwidth hog streaming 256 MiB copies on CPU 1, the other core

Each run is a `kvbench run --repeats R` record, so the analysis can replay precision-targeted
sampling at every rotation count. `collect --best-of K` adds, per condition, runs in which
every mode runs K loops back to back in each rotation (the per-rotation minimum of repeated
loops), timed with kvbench's own `timing.time_observed`.

`analyze` replays, per condition and estimator, what kvbench run would do: stop a run when
every speedup's rerun interval is within ±5% and say how long that took; how often the next
run's speedup falls inside the previous run's interval (coverage); and how many cells
`kvbench compare`'s rule would call slower or faster between two runs of the same code
(false alarms). The shared records of a stealing VM (../shared/noisy-records) are a further
condition, read as they are.

    python scripts/contention_study.py collect --runs 6 --rotations 41 --out results/contention
    python scripts/contention_study.py analyze results/contention [--shared ../shared/noisy-records]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

from antagonist import contended

from kvbench.files import write_json_atomic
from kvbench.measure import stats
from kvbench.measure.telemetry import disturbances
from kvbench.record import RecordView
from kvbench.report.comparison.compare import FASTER, SLOWER, change

TARGET = 0.05  # every speedup within ±5%
BUDGET = 120.0  # seconds of sampling: the goal's two minutes
ESTIMATORS = {  # name -> (clock, kvbench.measure.stats estimator, keep only undisturbed pairs)
    "median of ratios, wall": ("seconds", "median-of-ratios", False),
    "median of ratios, on-CPU": ("cpu_seconds", "median-of-ratios", False),
    "median of ratios, undisturbed pairs": ("seconds", "median-of-ratios", True),
    "ratio of 20th percentiles, wall": ("seconds", "ratio-of-p20", False),
    "ratio of 20th percentiles, on-CPU": ("cpu_seconds", "ratio-of-p20", False),
    "ratio of minima, wall": ("seconds", "ratio-of-minima", False),
    "ratio of minima, on-CPU": ("cpu_seconds", "ratio-of-minima", False),
}


# -- collect -------------------------------------------------------------------------------


def with_antagonist(condition: str, command: list[str]) -> subprocess.CompletedProcess:
    with contended(condition):
        return subprocess.run(command, capture_output=True, text=True)


def collect(out: Path, runs: int, rotations: int, conditions: list[str], best_of: int, best_rotations: int) -> None:
    for index, condition in itertools.product(range(runs), conditions):
        path = out / condition / f"run-{index:02d}.json"
        if not path.exists():
            done = with_antagonist(condition, [sys.executable, "-m", "kvbench", "run", "--repeats", str(rotations),
                                               "--cpu", "0", "--no-progress", "--output", str(path)])
            print(f"{condition} {index}: exit {done.returncode} {path}", flush=True)
            if done.returncode != 0:
                print(done.stderr, file=sys.stderr)
        best = out / condition / f"best-of-{best_of}-{index:02d}.json"
        if best_of > 1 and not best.exists():
            done = with_antagonist(condition, [sys.executable, __file__, "best-of", "--loops", str(best_of),
                                               "--rotations", str(best_rotations), "--output", str(best)])
            print(f"{condition} {index} best of {best_of}: exit {done.returncode} {best}", flush=True)


def best_of(loops: int, rotations: int, output: Path) -> None:
    """Rotations of the default grid in which every mode runs `loops` timed loops back to back."""
    from kvbench.measure.telemetry import Counters
    from kvbench.measure.timing import DEFAULT_LENGTHS, Protocol, pin_cpu, rotation_order, set_threads, time_observed
    from kvbench.model import build_model
    from kvbench.modes import DEFAULT_MODES
    from kvbench.workloads.decode import decode, token_ids

    protocol = Protocol()
    set_threads(protocol.threads)
    pin_cpu("0")
    model = build_model(seed=protocol.seed)
    longest = token_ids(model.config, 1, max(DEFAULT_LENGTHS), protocol.seed)
    counters, samples, start = Counters(), [], time.perf_counter()
    modes = list(DEFAULT_MODES)
    for length in DEFAULT_LENGTHS:
        for mode in modes:
            decode(model, longest[:, :length], mode)  # warmup
    start = time.perf_counter()
    for rotation in range(rotations):
        for length in DEFAULT_LENGTHS:
            ids = longest[:, :length]
            for mode in rotation_order(modes, rotation, protocol.order, protocol.seed, length):
                for loop in range(loops):
                    seconds, telemetry = time_observed(lambda: decode(model, ids, mode), counters)
                    samples.append({"mode": mode, "length": length, "repetition": rotation, "loop": loop,
                                    "seconds": seconds, "started": time.perf_counter() - start - seconds, **telemetry})
    write_json_atomic({"loops": loops, "rotations": rotations, "lengths": list(DEFAULT_LENGTHS), "modes": modes,
                       "samples": samples}, output, force=True)


# -- replaying a run -----------------------------------------------------------------------


class Run:
    """One run's samples per (mode, length): {rotation: (seconds, cpu_seconds, disturbed)}, and when each
    rotation ended (seconds of sampling)."""

    def __init__(self, name: str, lengths: list[int], modes: list[str], samples: list[dict],
                 timeline: list[dict] | None = None) -> None:
        """`samples` become the cells (the control left out); `timeline`, every loop that ran (default: the
        samples), gives the time: each rotation ends after the loops' own seconds up to its last sample. A
        sample's time between loops is left out, as kvbench's sampler now spends almost none (statistics.md,
        "What a sample costs besides the loop"); the records of 2026-12-01/02 spent 36 ms a sample there."""
        self.name, self.lengths, self.modes = name, lengths, [m for m in modes if m not in ("full", "control")]
        self.cells: dict[tuple[str, int], dict[int, tuple[float, float, bool]]] = {}
        for sample in samples:
            if sample["mode"] == "control":
                continue
            key, rotation = (sample["mode"], sample["length"]), sample["repetition"]
            cpu = sample.get("cpu_seconds") or sample["seconds"]
            self.cells.setdefault(key, {})[rotation] = (sample["seconds"], cpu,
                                                        bool(disturbances(sample["seconds"], sample)))
        self.ended: dict[int, float] = {}
        spent = 0.0
        for sample in sorted(timeline or samples, key=lambda s: s["started"]):
            spent += sample["seconds"]
            self.ended[sample["repetition"]] = spent
        self.rotations = min(len(cell) for cell in self.cells.values())

    @classmethod
    def from_record(cls, path: Path) -> Run:
        view = RecordView.load(path)
        samples = [{"mode": rep.mode, "length": rep.length, "repetition": rep.repetition, "seconds": rep.seconds,
                    "started": rep.started, **rep.telemetry} for rep in view.every_repetition()]
        return cls(path.name, view.lengths, view.modes, samples)

    @classmethod
    def from_best_of(cls, path: Path) -> Run:
        """Each (mode, length, rotation): the loop with the fewest seconds, its telemetry with it."""
        document = json.loads(path.read_text())
        fastest: dict[tuple, dict] = {}
        for sample in document["samples"]:
            key = (sample["mode"], sample["length"], sample["repetition"])
            if key not in fastest or sample["seconds"] < fastest[key]["seconds"]:
                fastest[key] = sample
        return cls(path.name, document["lengths"], document["modes"], list(fastest.values()), document["samples"])

    def speedup(self, mode: str, length: int, estimator: str, rotations: int,
                between_run: float) -> stats.RatioEstimate | None:
        clock, name, undisturbed = ESTIMATORS[estimator]
        index = 0 if clock == "seconds" else 1
        base, mine = self.cells[("full", length)], self.cells[(mode, length)]
        shared = [r for r in base if r in mine and r < rotations and not (undisturbed and (base[r][2] or mine[r][2]))]
        if len(shared) < 3:
            return None
        return stats.speedup({r: base[r][index] for r in shared}, {r: mine[r][index] for r in shared},
                             estimator=name, interval="confidence", between_run=between_run,
                             key=(self.name, mode, length, rotations))

    def widest(self, estimator: str, between_run: float, seconds: float) -> float:
        """The widest rerun half-width over every speedup with the rotations done within `seconds` of sampling."""
        rotations = max([r + 1 for r, ended in self.ended.items() if ended <= seconds] or [3])
        estimates = [self.speedup(mode, length, estimator, rotations, between_run)
                     for length in self.lengths for mode in self.modes]
        return max((stats.rerun_interval(e).half_width for e in estimates if e is not None), default=math.inf)

    def stop(self, estimator: str, between_run: float, minimum: int = 7) -> tuple[int, float, bool]:
        """(rotations, seconds of sampling, reached ±5%) where precision-targeted sampling would stop
        (kvbench.measure.stats.stop_rule, replayed): the first rotation count from `minimum` on with every rerun
        interval within TARGET, or all."""
        for rotations in range(minimum, self.rotations + 1):
            estimates = [self.speedup(mode, length, estimator, rotations, between_run)
                         for length in self.lengths for mode in self.modes]
            widest = (None if any(e is None for e in estimates)
                      else max(stats.rerun_interval(e).half_width for e in estimates))
            stop = stats.stop_rule(rotations, widest, repeats=minimum, precision=TARGET, max_repeats=self.rotations)
            if stop is not None:
                return rotations, self.ended[rotations - 1], stop == "precise"
        return self.rotations, self.ended[self.rotations - 1], False


# -- analysis ------------------------------------------------------------------------------


def condition_rows(condition: str, runs: list[Run]) -> list[str]:
    """One row per estimator; each estimator's intervals allow for its own between-run SD in this condition."""
    rows = []
    for estimator in ESTIMATORS:
        sd = between_run_sd(runs, estimator)
        between_run = max(sd if math.isfinite(sd) else 0.0, stats.BETWEEN_RUN["speedup"])
        stops = [run.stop(estimator, between_run) for run in runs]
        estimates = [{(m, n): run.speedup(m, n, estimator, rotations, between_run)
                      for m in run.modes for n in run.lengths} for run, (rotations, _, _) in zip(runs, stops)]
        covered = pairs = alarms = 0
        for a, b in zip(estimates, estimates[1:]):
            for key, first in a.items():
                second = b.get(key)
                if first is None or second is None:
                    continue
                pairs += 1
                covered += stats.rerun_interval(first).contains(second.ratio)
                alarms += change(first, second, factor=1.1, alpha=0.05).verdict in (SLOWER, FASTER)
        reached = [seconds for _, seconds, ok in stops if ok]
        within = sum(ok and seconds <= BUDGET for _, seconds, ok in stops)
        median_stop = f"{statistics.median(reached):.0f} s" if reached else "never"
        widest = statistics.median(run.widest(estimator, between_run, BUDGET) for run in runs)
        cells = (f"{statistics.median(r for r, _, _ in stops):.0f} | {covered / pairs:.0%} | {alarms}/{pairs}"
                 if pairs else " | | ")
        rows.append(f"| {condition} | {estimator} | {within}/{len(runs)} | {median_stop} | ±{widest:.1%} | "
                    f"{cells} | {sd:.1%} |")
    return rows


PROJECTED = ("median of ratios, wall", "median of ratios, on-CPU", "ratio of minima, on-CPU")


def needed(run: Run, estimator: str) -> tuple[float, float]:
    """(rotations at the worst length, seconds of loops over every length) for every speedup's rerun interval to
    reach ±TARGET with kvbench's 1% between-run allowance, each length's own error scaled by 1/sqrt(rotations) from
    what the whole run gives; each length pays its own rotations, as equal-time rounds let it."""
    z = stats.normal_quantile(0.5 + stats.CONFIDENCE / 2)
    allowed = math.sqrt((math.log1p(TARGET) / (math.sqrt(2) * z)) ** 2 - stats.BETWEEN_RUN["speedup"] ** 2)
    worst = seconds = 0.0
    for length in run.lengths:
        estimates = [run.speedup(mode, length, estimator, run.rotations, 0.0) for mode in run.modes]
        rotations = max(run.rotations * (stats.log_standard_error(e) / allowed) ** 2 for e in estimates if e)
        rotation = sum(statistics.median(w for w, _, _ in cell.values())
                       for (_, n), cell in run.cells.items() if n == length)
        worst, seconds = max(worst, rotations), seconds + rotations * rotation
    return worst, seconds


def projection_rows(condition: str, runs: list[Run]) -> list[str]:
    rows = []
    for estimator in PROJECTED:
        found = [needed(run, estimator) for run in runs]
        rows.append(f"| {condition} | {estimator} | {statistics.median(r for r, _ in found):.0f} | "
                    f"{min(s for _, s in found):.0f}–{max(s for _, s in found):.0f} s |")
    return rows


def between_run_sd(runs: list[Run], estimator: str) -> float:
    """The between-run SD of a speedup (method of moments over consecutive runs, all rotations)."""
    terms = []
    for a, b in zip(runs, runs[1:]):
        for mode in a.modes:
            for length in a.lengths:
                first = a.speedup(mode, length, estimator, a.rotations, 0.0)
                second = b.speedup(mode, length, estimator, b.rotations, 0.0)
                if first and second:
                    terms.append(stats.between_run_term(first, second))
    return stats.between_run_sd(terms)


def telemetry_line(runs: list[Run]) -> str:
    flags = [flag for run in runs for cell in run.cells.values() for _, _, flag in cell.values()]
    off_cpu = [1 - cpu / wall for run in runs for cell in run.cells.values() for wall, cpu, _ in cell.values()]
    return (f"{sum(flags) / len(flags):.0%} of {len(flags)} samples disturbed; median share of wall time off "
            f"the CPU {statistics.median(off_cpu):.1%}")


def analyze(root: Path, shared: Path | None) -> str:
    groups: dict[str, list[Run]] = {}
    for directory in sorted(p for p in root.iterdir() if p.is_dir()):
        groups[directory.name] = [Run.from_record(p) for p in sorted(directory.glob("run-*.json"))]
        best = sorted(directory.glob("best-of-*.json"))
        if best:
            groups[f"{directory.name}, {best[0].name.rsplit('-', 1)[0]}"] = [Run.from_best_of(p) for p in best]
    if shared is not None:
        for prefix, label in (("contended", "stealing VM (shared records)"),
                              ("antagonist", "stealing VM + busy-25 (shared records)")):
            paths = sorted(shared.glob(f"{prefix}-*.json"))
            if paths:
                groups[label] = [Run.from_record(p) for p in paths]
    lines = ["# Contention study", "", "Generated by `python scripts/contention_study.py analyze` from the records "
             f"under `{root}`. Per condition and estimator: how many runs reach ±5% on every speedup (rerun interval) "
             f"within {BUDGET:.0f} s of sampling, the median sampling time to get there, the median rotations a "
             "precision-targeted run would take, how often the next run's speedup lies in the previous run's rerun "
             "interval, and how many cells `kvbench compare`'s rule calls slower or faster between two runs of the "
             "same code. Each estimator's intervals allow for its own between-run SD in that condition (the last "
             "column; at least kvbench's 1%); `widest ± at 2 min` is the median over runs of the widest rerun "
             "half-width with the rotations done in 120 s. Time is the loops' own seconds, in the order they ran: "
             "kvbench's sampler spends almost nothing between loops since 2026-12-02 (the records below spent 36 ms "
             "a sample in a garbage collection, left out here). The replay runs one rotation per round at every "
             "length, as the sampler did when these records were made, and a run holds at most its own rotations: "
             "today's sampler gives a short length many rotations a round, so it reaches a target sooner than "
             "replayed here. What the default reaches now, run for real: docs/statistics.md, \"Reproducibility "
             "check\".", ""]
    for condition, runs in groups.items():
        lines += [f"- {condition}: {len(runs)} runs, {telemetry_line(runs)}"]
    lines += ["", "| condition | estimator | ±5% within 2 min | median time to ±5% | widest ± at 2 min | rotations | "
              "next run inside | false alarms | between-run SD |", "|---|---|--:|--:|--:|--:|--:|--:|--:|"]
    for condition, runs in groups.items():
        lines += condition_rows(condition, runs)
    lines += ["", "## What ±5% would take", "",
              f"Per run, each length's within-run error scaled by 1/√n to the rotations that would bring every speedup's "
              f"rerun interval to ±{TARGET:.0%} with kvbench's {stats.BETWEEN_RUN['speedup']:.0%} between-run allowance, "
              "and the loops' seconds those rotations take at every length (each length its own count, as equal-time "
              "rounds allow): the median over runs of the worst length's rotations, and the range of seconds.", "",
              "| condition | estimator | rotations at the worst length | seconds of loops |", "|---|---|--:|--:|"]
    for condition, runs in groups.items():
        lines += projection_rows(condition, runs)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    gather = commands.add_parser("collect")
    gather.add_argument("--out", type=Path, default=Path("results/contention"))
    gather.add_argument("--runs", type=int, default=6)
    gather.add_argument("--rotations", type=int, default=41)
    gather.add_argument("--conditions", default="quiet,busy-25,memory")
    gather.add_argument("--best-of", type=int, default=1, help="also collect runs with K loops per mode per rotation")
    gather.add_argument("--best-of-rotations", type=int, default=15, help="rotations of those runs")
    loops = commands.add_parser("best-of", help="(used by collect) one run of K loops per mode per rotation")
    loops.add_argument("--loops", type=int, required=True)
    loops.add_argument("--rotations", type=int, required=True)
    loops.add_argument("--output", type=Path, required=True)
    study = commands.add_parser("analyze")
    study.add_argument("root", type=Path)
    study.add_argument("--shared", type=Path)
    args = parser.parse_args(argv)
    if args.command == "collect":
        collect(args.out, args.runs, args.rotations, args.conditions.split(","), args.best_of, args.best_of_rotations)
    elif args.command == "best-of":
        best_of(args.loops, args.rotations, args.output)
    else:
        sys.stdout.write(analyze(args.root, args.shared))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
