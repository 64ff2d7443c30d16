"""What changed around the numbers: every captured fact and run setting that differs, ranked.

`environment_diff` ranks every captured fact that differs by how much it can move a
timing; `config_diff` does the same for the run's own settings. `kvbench compare` prints
them before any number, so a reader sees first whether two records are comparable.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from kvbench.record import RecordView
from kvbench.report.format import format_bytes

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
        run = {"workload": {"kind": "loop"}, **view.run}  # a record without a workload timed the loop
        flat = _flatten({"config": view.config, "run": run, "protocol": view.protocol})
        return {k: v for k, v in flat.items() if not k.startswith(IGNORED_CONFIG)}

    ranks = dict(CONFIG_RANKS)
    ranks.update({key: NOTABLE for key in settings(old) | settings(new) if key.startswith("protocol.")})
    return _diff(settings(old), settings(new), ranks, CRITICAL)


WORK = ("config.", "run.workload", "run.batch")  # the model, the workload and the batch: what one sample computes


def work_differences(old: RecordView, new: RecordView) -> list[Difference]:
    """What makes two records time different work: the model (family, shapes, dtype, window), the workload
    (a loop, a request of P + N tokens, a contexts sweep) or the batch. Their times and ratios do not compare."""
    found = [d for d in config_diff(old, new) if d.key.startswith(WORK)]
    return sorted(found, key=lambda d: (d.key not in ("run.workload.kind", "config.family", "run.batch"), d.key))


def work_text(differences: list[Difference], shown: int = 3) -> str:
    """The first differences of work in a few words, for a one-line refusal."""
    text = "; ".join(f"{d.key} {d.old} -> {d.new}" for d in differences[:shown])
    return text + (f"; {len(differences) - shown} more" if len(differences) > shown else "")
