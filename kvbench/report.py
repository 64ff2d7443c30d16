"""Tables generated from records, never typed by hand."""

from __future__ import annotations

from rich.table import Table


def format_bytes(count: int | float | None) -> str:
    if count is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            return f"{count:,.0f} {unit}" if unit == "B" else f"{count:,.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def summary_rows(record: dict) -> list[dict]:
    """One row per (length, mode) in run order, joining timings, speedup, bytes and the check."""
    cells = {(c["mode"], c["length"]): c for c in record["summary"]["cells"]}
    speedups = {(s["mode"], s["length"]): s for s in record["summary"]["speedups"]}
    checks = {(c["mode"], c["length"]): c for c in record["checks"]}
    memory = {(m["mode"], m["length"]): m for m in record["memory"]}
    rows = []
    for length in record["run"]["lengths"]:
        for mode in record["run"]["modes"]:
            key = (mode, length)
            if key not in cells:
                continue  # an interrupted run stops part-way through the grid
            rows.append({
                "length": length,
                "mode": mode,
                "cell": cells[key],
                "speedup": speedups.get(key),
                "check": checks.get(key),
                "memory": memory.get(key),
            })
    return rows


def _check_text(check: dict | None) -> str:
    if check is None:
        return "[yellow]not checked[/]"
    if check["passed"]:
        return f"ok {check['max_abs_diff']:.1e}"
    return f"[bold red]FAILED[/] {check['max_abs_diff']:.1e} @ {check['first_divergent_position']}"


def summary_table(record: dict) -> Table:
    run = record["run"]
    title = (
        f"kvbench {run['preset']}: batch {run['batch']}, {record['config']['dtype']}, "
        f"{run['threads']} thread(s), {run['repeats']} repetitions"
    )
    if record["status"] != "complete":
        title += " [bold yellow](INCOMPLETE: interrupted run)[/]"
    table = Table(title=title, title_justify="left")
    for name in ("length", "mode", "median ms", "IQR %", "us/token", "speedup", "KV bytes", "reserved", "equivalence"):
        table.add_column(name, justify="left" if name in ("mode", "equivalence") else "right", no_wrap=True)
    previous_length = None
    for row in summary_rows(record):
        cell, speedup, memory = row["cell"], row["speedup"], row["memory"]
        if speedup is None:
            speedup_text = "baseline" if row["mode"] == record["summary"]["baseline"] else "-"
        elif speedup["valid"]:  # full / cached, ratio of medians
            speedup_text = f"{speedup['speedup']:.2f}x"
        else:
            speedup_text = f"[red]({speedup['speedup']:.2f}x invalid)[/]"
        table.add_row(
            str(row["length"]) if row["length"] != previous_length else "",
            row["mode"],
            f"{cell['median'] * 1e3:.2f}",
            f"{(cell['q3'] - cell['q1']) / cell['median'] * 100:.1f}",
            f"{cell['per_token_median'] * 1e6:.1f}",
            speedup_text,
            format_bytes(memory and memory["measured_bytes"]),
            format_bytes(memory and memory["reserved_bytes"]),
            _check_text(row["check"]),
            end_section=False,
        )
        previous_length = row["length"]
    return table
