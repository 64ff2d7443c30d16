"""Compare two records: what changed around the numbers first, then the numbers.

`environment_diff` ranks every captured fact that differs by how much it can
move a timing; `config_diff` does the same for the run's own settings;
`compare_records` pairs the cells both records measured and gives each a ratio
of medians NEW / OLD with a bootstrap interval, a Mann-Whitney U p-value and a
verdict. `compare_command` is `kvbench compare`.
"""

from __future__ import annotations

import difflib
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from kvbench import stats

FACTOR = 1.1  # a change smaller than this ratio is "unchanged" however significant
ALPHA = 0.05  # significance level of the Mann-Whitney U test
FORMATS = ("text", "markdown")

CRITICAL, NOTABLE, INFORMATIONAL = "critical", "notable", "informational"
RANKS = (CRITICAL, NOTABLE, INFORMATIONAL)

# "section.key" of the captured environment -> rank. A key not listed is NOTABLE:
# an unknown difference is worth a look, never silently dropped.
ENVIRONMENT_RANKS = {
    **dict.fromkeys((
        "torch.version", "torch.git_version", "torch.debug", "torch.intra_op_threads", "torch.inter_op_threads",
        "torch.cpu_capability", "torch.mkl_available", "torch.mkldnn_available", "torch.float32_matmul_precision",
        "cpu.brand", "cpu.vendor", "cpu.arch", "cpu.flags", "cpu.has_avx2", "cpu.has_avx512", "cpu.has_avx512_bf16",
        "cpu.has_vnni", "cpu.has_amx", "cpu.has_neon", "cpu.has_sve",
        "python.version", "python.implementation",
    ), CRITICAL),
    **dict.fromkeys((
        "system.load_average", "system.memory_available_bytes", "system.cpu_freq_current_mhz",
        "cpu.hz_actual", "cpu.hz_actual_friendly", "kvbench.git_commit", "kvbench.git_dirty", "kvbench.git_branch",
        "kvbench.version", "os.hostname", "python.executable",
    ), INFORMATIONAL),
}
IGNORED_ENVIRONMENT = ("timestamp_utc", "unavailable")  # always differ / explain None values instead

# Settings of the run itself. Model shape, dtype, batch, seed and threads change the
# workload or the machine it runs on; repeats and warmup change only the statistics.
CONFIG_RANKS = {"run.repeats": NOTABLE, "run.warmup": NOTABLE, "run.per_step_length": INFORMATIONAL,
                "run.lengths": INFORMATIONAL, "run.modes": INFORMATIONAL}
IGNORED_CONFIG = ("protocol.threads_in_effect",)  # the same facts as torch.*_threads in the environment


@dataclass(frozen=True)
class Difference:
    key: str
    rank: str
    old: str
    new: str


def _flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flatten(value, path + "."))
        else:
            out[path] = value
    return out


def _show(key: str, value: object, reason: str | None = None) -> str:
    if value is None:
        return f"unavailable ({reason})" if reason else "absent"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return "[" + ", ".join(f"{v:.2f}" if isinstance(v, float) else str(v) for v in value) + "]"
    if isinstance(value, int) and not isinstance(value, bool) and key.endswith("_bytes"):
        from kvbench.report import format_bytes

        return format_bytes(value)
    return str(value)


def _long_text_difference(old: str, new: str) -> tuple[str, str]:
    """For multi-line values (torch's build and parallel info): the first lines that differ."""
    old_lines, new_lines = old.splitlines(), new.splitlines()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False).get_opcodes():
        if tag != "equal":
            first_old = old_lines[i1].strip() if i1 < i2 else "(no line)"
            first_new = new_lines[j1].strip() if j1 < j2 else "(no line)"
            return first_old[:90], first_new[:90]
    return old[:90], new[:90]


def _diff(old: dict[str, object], new: dict[str, object], ranks: dict[str, str], default: str,
          reasons: tuple[dict, dict] = ({}, {})) -> list[Difference]:
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if isinstance(a, str) and isinstance(b, str) and ("\n" in a or "\n" in b or max(len(a), len(b)) > 90):
            shown_a, shown_b = _long_text_difference(a, b)
        else:
            shown_a, shown_b = _show(key, a, reasons[0].get(key)), _show(key, b, reasons[1].get(key))
        out.append(Difference(key, ranks.get(key, default), shown_a, shown_b))
    return sorted(out, key=lambda d: RANKS.index(d.rank))  # stable: alphabetical within a rank


def environment_diff(old: dict, new: dict) -> list[Difference]:
    """Every captured fact that differs, critical first, informational last."""
    def facts(env: dict) -> dict[str, object]:
        return _flatten({k: v for k, v in env.items() if k not in IGNORED_ENVIRONMENT})

    def reasons(env: dict) -> dict:
        unavailable = env.get("unavailable")
        return unavailable if isinstance(unavailable, dict) else {}

    return _diff(facts(old), facts(new), ENVIRONMENT_RANKS, NOTABLE, (reasons(old), reasons(new)))


def config_diff(old: dict, new: dict) -> list[Difference]:
    """The model config, the run settings and the protocol, ranked like the environment."""
    def settings(record: dict) -> dict[str, object]:
        flat = _flatten({"config": record["config"], "run": record["run"], "protocol": record["protocol"]})
        return {k: v for k, v in flat.items() if not k.startswith(IGNORED_CONFIG)}

    ranks = dict(CONFIG_RANKS)
    ranks.update({key: NOTABLE for key in settings(old) | settings(new) if key.startswith("protocol.")})
    return _diff(settings(old), settings(new), ranks, CRITICAL)


@dataclass(frozen=True)
class CellChange:
    mode: str
    length: int
    old_samples: int
    new_samples: int
    old_median: float
    new_median: float
    ratio: stats.RatioEstimate
    p_value: float | None
    verdict: str
    old_check: dict | None
    new_check: dict | None
    notes: tuple[str, ...]


@dataclass
class Comparison:
    old_source: str
    new_source: str
    old_status: str
    new_status: str
    environment: list[Difference]
    config: list[Difference]
    cells: list[CellChange]
    skipped: list[str]
    factor: float
    alpha: float
    notes: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[CellChange]:
        return [cell for cell in self.cells if cell.verdict == stats.SLOWER]

    def count(self, verdict: str) -> int:
        return sum(cell.verdict == verdict for cell in self.cells)


def _seconds(record: dict) -> dict[tuple[str, int], list[float]]:
    cells: dict[tuple[str, int], list[float]] = {}
    for rep in record["repetitions"]:
        cells.setdefault((rep["mode"], rep["length"]), []).append(rep["seconds"])
    return cells


def _cell_order(record: dict, keys: set) -> list[tuple[str, int]]:
    order = [(m, n) for n in record["run"]["lengths"] for m in record["run"]["modes"]]
    return [key for key in order if key in keys]


def compare_records(old: dict, new: dict, *, factor: float = FACTOR, alpha: float = ALPHA,
                    old_source: str = "OLD", new_source: str = "NEW", seed: int = stats.SEED) -> Comparison:
    if not factor > 1:
        raise ValueError(f"--factor must be greater than 1, got {factor:g}")
    if not 0 < alpha < 1:
        raise ValueError(f"--alpha must lie strictly between 0 and 1, got {alpha:g}")
    old_cells, new_cells = _seconds(old), _seconds(new)
    shared = set(old_cells) & set(new_cells)
    if not shared:
        def grid(record, cells):
            return ", ".join(f"{m}@{n}" for m, n in _cell_order(record, set(cells))) or "nothing"
        raise ValueError(f"no cell measured in both records: {old_source} has {grid(old, old_cells)}; "
                         f"{new_source} has {grid(new, new_cells)}")

    skipped = []
    for key in _cell_order(old, set(old_cells) - shared):
        skipped.append(f"{key[0]}@{key[1]} only in OLD")
    for key in _cell_order(new, set(new_cells) - shared):
        skipped.append(f"{key[0]}@{key[1]} only in NEW")

    old_checks = {(c["mode"], c["length"]): c for c in old["checks"]}
    new_checks = {(c["mode"], c["length"]): c for c in new["checks"]}
    cells = []
    for key in _cell_order(new, shared):
        a, b = old_cells[key], new_cells[key]
        ratio = stats.unpaired_ratio(a, b, seed=seed, key=key)
        p_value = stats.mann_whitney_p(a, b)
        verdict = stats.verdict(ratio.ratio, p_value, factor, alpha)
        notes = []
        floor = stats.smallest_p_value(len(a), len(b))
        if verdict == stats.UNTESTED:
            notes.append("fewer than 2 repetitions on a side")
        elif floor >= alpha:
            notes.append(f"{len(a)}/{len(b)} repetitions cannot reach p < {alpha:g} (smallest p {floor:.2g})")
        elif verdict == stats.UNCHANGED and (ratio.ratio > factor or ratio.ratio < 1 / factor):
            notes.append(f"beyond {factor:g}x but not significant (p ≥ {alpha:g})")
        oc, nc = old_checks.get(key), new_checks.get(key)
        if oc is not None and nc is not None and oc["passed"] and not nc["passed"]:
            notes.append("equivalence now FAILS")
        elif oc is not None and nc is not None and not oc["passed"] and nc["passed"]:
            notes.append("equivalence fixed")
        elif nc is not None and not nc["passed"]:
            notes.append("equivalence fails in both")
        cells.append(CellChange(key[0], key[1], len(a), len(b), statistics.median(a), statistics.median(b), ratio, p_value, verdict, oc, nc, tuple(notes)))

    comparison = Comparison(
        old_source=old_source, new_source=new_source, old_status=old["status"], new_status=new["status"],
        environment=environment_diff(old["environment"], new["environment"]),
        config=config_diff(old, new), cells=cells, skipped=skipped, factor=factor, alpha=alpha,
    )
    for label, record in (("OLD", old), ("NEW", new)):
        if record["status"] != "complete":
            comparison.notes.append(f"{label} is INCOMPLETE (interrupted run): only its completed repetitions are compared")
    if any(d.key.startswith("config.") or d.key in ("run.batch", "run.seed", "run.threads") for d in comparison.config):
        comparison.notes.append("the records ran different workloads (config differs): ratios compare different work")
    underpowered = [c for c in cells if stats.smallest_p_value(c.old_samples, c.new_samples) >= alpha]
    if underpowered:
        comparison.notes.append(f"{len(underpowered)} cell(s) have too few repetitions for Mann-Whitney U to reach "
                                f"p < {alpha:g}: they can never be called faster or slower (use 5 or more per record)")
    return comparison


# --- layouts ------------------------------------------------------------------------------

def _p(p_value: float | None) -> str:
    return "-" if p_value is None else f"{p_value:.3f}" if p_value >= 0.001 else f"{p_value:.0e}"


def _eq(check: dict | None) -> str:
    if check is None:
        return "not checked"
    return f"{check['max_abs_diff']:.1e}" + ("" if check["passed"] else " FAILED")


def _cell_texts(cell: CellChange) -> list[str]:
    from kvbench.report import _ms

    n = f"{cell.old_samples}/{cell.new_samples}"
    return [str(cell.length), cell.mode, n, _ms(cell.old_median), _ms(cell.new_median),
            f"{cell.ratio.ratio:.3f}", f"[{cell.ratio.low:.3f}, {cell.ratio.high:.3f}]", _p(cell.p_value),
            cell.verdict, f"{_eq(cell.old_check)} → {_eq(cell.new_check)}", "; ".join(cell.notes)]


CELL_COLUMNS = ("length", "mode", "n old/new", "old ms", "new ms", "new/old", "95% CI", "p (MWU)", "verdict",
                "max |Δ| old → new", "notes")


def _summary_line(c: Comparison) -> str:
    counts = ", ".join(f"{c.count(v)} {v}" for v in (stats.SLOWER, stats.FASTER, stats.UNCHANGED, stats.UNTESTED)
                       if c.count(v) or v != stats.UNTESTED)
    return (f"{len(c.cells)} cells compared: {counts} (slower/faster = ratio beyond {c.factor:g}x "
            f"and Mann-Whitney p < {c.alpha:g})")


def text_renderables(c: Comparison) -> list:
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    styles = {CRITICAL: "bold red", NOTABLE: "yellow", INFORMATIONAL: "dim"}
    out: list = [f"[bold]kvbench compare[/]  OLD {escape(c.old_source)} ({c.old_status})  →  "
                 f"NEW {escape(c.new_source)} ({c.new_status})"]
    for title, diffs in (("environment", c.environment), ("run settings", c.config)):
        if not diffs:
            out.append(f"{title}: identical")
            continue
        critical = sum(d.rank == CRITICAL for d in diffs)
        table = Table(title=f"{title} differences ({critical} critical, {len(diffs)} in all), ranked by how much "
                            "they can move a timing", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        for name in ("rank", "key", "OLD", "NEW"):
            table.add_column(name, overflow="fold")
        for d in diffs:
            table.add_row(f"[{styles[d.rank]}]{d.rank}[/]", escape(d.key), escape(d.old), escape(d.new))
        out.append(table)
    if c.skipped:
        out.append(f"[yellow]skipped (not in both records): {escape(', '.join(c.skipped))}[/]")
    for note in c.notes:
        out.append(f"[yellow]note: {escape(note)}[/]")

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for name in CELL_COLUMNS[:-1]:
        table.add_column(name, justify="left" if name in ("mode", "verdict", "max |Δ| old → new") else "right", no_wrap=True)
    verdict_style = {stats.SLOWER: "bold red", stats.FASTER: "bold green", stats.UNCHANGED: "", stats.UNTESTED: "yellow"}
    previous = None
    for cell in c.cells:
        texts = [escape(t) for t in _cell_texts(cell)][:-1]  # notes go below the table
        texts[0] = texts[0] if cell.length != previous else ""
        if verdict_style[cell.verdict]:
            texts[8] = f"[{verdict_style[cell.verdict]}]{texts[8]}[/]"
        if cell.new_check is not None and not cell.new_check["passed"]:
            texts[9] = f"[bold red]{texts[9]}[/]"
        table.add_row(*texts)
        previous = cell.length
    out.append(table)
    for cell in c.cells:
        if cell.notes:
            out.append(f"  {cell.mode} at {cell.length}: " + escape("; ".join(cell.notes)))
    out.append(_summary_line(c))
    out.append(f"ratio = median NEW / median OLD (above 1: NEW is slower); 95% CI: percentile bootstrap, each "
               f"record resampled on its own ({stats.RESAMPLES:,} resamples, seed {stats.SEED})")
    return out


def render_text(c: Comparison, width: int = 150) -> str:
    from kvbench.report import render_plain

    return render_plain(text_renderables(c), width)


def render_markdown(c: Comparison) -> str:
    from kvbench.report import _md_table

    lines = [f"**kvbench compare** OLD `{c.old_source}` ({c.old_status}) → NEW `{c.new_source}` ({c.new_status})", ""]
    for title, diffs in (("Environment", c.environment), ("Run settings", c.config)):
        if not diffs:
            lines += [f"{title}: identical.", ""]
            continue
        lines += [f"{title} differences, ranked by how much they can move a timing:", ""]
        lines += _md_table(("rank", "key", "OLD", "NEW"),
                           [[f"**{d.rank}**" if d.rank == CRITICAL else d.rank, f"`{d.key}`", d.old, d.new] for d in diffs])
        lines.append("")
    if c.skipped:
        lines += [f"Skipped (not in both records): {', '.join(c.skipped)}.", ""]
    lines += [f"> **Note:** {note}" for note in c.notes] + ([""] if c.notes else [])
    rows = []
    for cell in c.cells:
        texts = _cell_texts(cell)
        if cell.verdict in (stats.SLOWER, stats.FASTER):
            texts[8] = f"**{texts[8]}**"
        rows.append(texts)
    lines += _md_table(CELL_COLUMNS, rows)
    lines += ["", _summary_line(c) + "."]
    return "\n".join(lines) + "\n"


def compare_command(old_path: Path, new_path: Path, *, factor: float = FACTOR, alpha: float = ALPHA,
                    fail_on_regression: bool = False, fmt: str = "text", console=None) -> int:
    """kvbench compare: 0, or 1 with --fail-on-regression when a cell is significantly slower."""
    from kvbench.record import load_record

    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    old, new = load_record(old_path), load_record(new_path)
    comparison = compare_records(old, new, factor=factor, alpha=alpha,
                                 old_source=str(old_path), new_source=str(new_path))
    if fmt == "markdown":
        sys.stdout.write(render_markdown(comparison))
    else:
        if console is None:
            from kvbench.cli import _stdout_console

            console = _stdout_console()
        for item in text_renderables(comparison):
            console.print(item)
    if fail_on_regression and comparison.regressions:
        worst = max(comparison.regressions, key=lambda cell: cell.ratio.ratio)
        print(f"kvbench: regression: {len(comparison.regressions)} cell(s) significantly slower by more than "
              f"{factor:g}x; worst {worst.mode} at length {worst.length}: {worst.ratio.ratio:.2f}x "
              f"(p = {_p(worst.p_value)})", file=sys.stderr)
        return 1
    return 0
