"""Compare two records: what changed around the numbers first, then the numbers.

`environment_diff` ranks every captured fact that differs by how much it can
move a timing; `config_diff` does the same for the run's own settings;
`compare_records` pairs the cells both records measured and gives each a ratio
of medians NEW / OLD with a bootstrap interval, a Mann-Whitney U p-value and a
verdict. The terminal and markdown modules lay a `Comparison` out.
"""

from __future__ import annotations

import difflib
import statistics
from dataclasses import dataclass, field

from kvbench import stats
from kvbench.record import RecordView
from kvbench.report.format import check_text, format_bytes, ms, p_value

FACTOR = 1.1  # a change smaller than this ratio is "unchanged" however significant
ALPHA = 0.05  # significance level of the Mann-Whitney U test

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


def config_diff(old: RecordView, new: RecordView) -> list[Difference]:
    """The model config, the run settings and the protocol, ranked like the environment."""
    def settings(view: RecordView) -> dict[str, object]:
        flat = _flatten({"config": view.config, "run": view.run, "protocol": view.protocol})
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


def _grid_text(view: RecordView) -> str:
    return ", ".join(f"{m}@{n}" for m, n in view.cells()) or "nothing"


def _cell_notes(a: list[float], b: list[float], ratio: stats.RatioEstimate, verdict: str, factor: float,
                alpha: float, old_check: dict | None, new_check: dict | None) -> tuple[str, ...]:
    notes = []
    floor = stats.smallest_p_value(len(a), len(b))
    if verdict == stats.UNTESTED:
        notes.append("fewer than 2 repetitions on a side")
    elif floor >= alpha:
        notes.append(f"{len(a)}/{len(b)} repetitions cannot reach p < {alpha:g} (smallest p {floor:.2g})")
    elif verdict == stats.UNCHANGED and (ratio.ratio > factor or ratio.ratio < 1 / factor):
        notes.append(f"beyond {factor:g}x but not significant (p ≥ {alpha:g})")
    if old_check is not None and new_check is not None and old_check["passed"] and not new_check["passed"]:
        notes.append("equivalence now FAILS")
    elif old_check is not None and new_check is not None and not old_check["passed"] and new_check["passed"]:
        notes.append("equivalence fixed")
    elif new_check is not None and not new_check["passed"]:
        notes.append("equivalence fails in both")
    return tuple(notes)


def compare_records(old: RecordView, new: RecordView, *, factor: float = FACTOR, alpha: float = ALPHA,
                    seed: int = stats.SEED) -> Comparison:
    """Every cell both records measured: ratio NEW / OLD, its interval, the U test and a verdict."""
    if not factor > 1:
        raise ValueError(f"factor must be greater than 1, got {factor:g}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie strictly between 0 and 1, got {alpha:g}")
    old_cells, new_cells = set(old.cells()), set(new.cells())
    shared = old_cells & new_cells
    if not shared:
        raise ValueError(f"no cell measured in both records: {old.source} has {_grid_text(old)}; "
                         f"{new.source} has {_grid_text(new)}")
    skipped = [f"{m}@{n} only in OLD" for m, n in old.cells() if (m, n) not in shared]
    skipped += [f"{m}@{n} only in NEW" for m, n in new.cells() if (m, n) not in shared]

    cells = []
    for key in [cell for cell in new.cells() if cell in shared]:
        a, b = old.seconds(*key), new.seconds(*key)
        ratio = stats.unpaired_ratio(a, b, seed=seed, key=key)
        p = stats.mann_whitney_p(a, b)
        verdict = stats.verdict(ratio.ratio, p, factor, alpha)
        old_check, new_check = old.check(*key), new.check(*key)
        notes = _cell_notes(a, b, ratio, verdict, factor, alpha, old_check, new_check)
        cells.append(CellChange(key[0], key[1], len(a), len(b), statistics.median(a), statistics.median(b), ratio,
                                p, verdict, old_check, new_check, notes))

    comparison = Comparison(
        old_source=old.source, new_source=new.source, old_status=old.status, new_status=new.status,
        environment=environment_diff(old.environment, new.environment),
        config=config_diff(old, new), cells=cells, skipped=skipped, factor=factor, alpha=alpha,
    )
    for label, view in (("OLD", old), ("NEW", new)):
        if not view.complete:
            comparison.notes.append(f"{label} is INCOMPLETE (interrupted run): only its completed repetitions are compared")
    if any(d.key.startswith("config.") or d.key in ("run.batch", "run.seed", "run.threads") for d in comparison.config):
        comparison.notes.append("the records ran different workloads (config differs): ratios compare different work")
    underpowered = [c for c in cells if stats.smallest_p_value(c.old_samples, c.new_samples) >= alpha]
    if underpowered:
        comparison.notes.append(f"{len(underpowered)} cell(s) have too few repetitions for Mann-Whitney U to reach "
                                f"p < {alpha:g}: they can never be called faster or slower (use 5 or more per record)")
    return comparison


def _check_pair(old: dict | None, new: dict | None) -> str:
    return f"{check_text(old)} → {check_text(new)}"


def cell_texts(cell: CellChange) -> list[str]:
    """The plain texts of one compared cell, in the order of the comparison table (notes last)."""
    return [str(cell.length), cell.mode, f"{cell.old_samples}/{cell.new_samples}", ms(cell.old_median),
            ms(cell.new_median), f"{cell.ratio.ratio:.3f}", f"[{cell.ratio.low:.3f}, {cell.ratio.high:.3f}]",
            p_value(cell.p_value), cell.verdict, _check_pair(cell.old_check, cell.new_check), "; ".join(cell.notes)]


def summary_line(c: Comparison) -> str:
    counts = ", ".join(f"{c.count(v)} {v}" for v in (stats.SLOWER, stats.FASTER, stats.UNCHANGED, stats.UNTESTED)
                       if c.count(v) or v != stats.UNTESTED)
    return (f"{len(c.cells)} cells compared: {counts} (slower/faster = ratio beyond {c.factor:g}x "
            f"and Mann-Whitney p < {c.alpha:g})")


COMPARE_HEADER = ("length", "mode", "n old/new", "old ms", "new ms", "new/old", "95% CI", "p (MWU)", "verdict",
                  "max |Δ| old → new", "notes")
