"""`kvbench budget` in a terminal (rich): bytes per token, then how many requests fit in each layout."""

from __future__ import annotations

from rich.table import Table

from kvbench.kinds import parameters_text
from kvbench.report.format import format_bytes


def budget_renderables(result) -> list:
    """`kvbench budget`: bytes per token, then how many requests fit in each layout."""
    table = Table(title=f"{result.tokens} tokens per request, {format_bytes(result.kv_memory_bytes)} for KV caches",
                  title_justify="left")
    for name in ("layout", "bytes per request", "wasted per request", "requests that fit"):
        table.add_column(name, justify="left" if name == "layout" else "right")
    exact = "exact (no slack; a sliding layer keeps W)" if result.sliding_layers and not result.quantize else \
        "exact (no slack)"
    table.add_row(exact, format_bytes(result.request_bytes), "0 B", f"{result.exact_requests:,}")
    table.add_row(f"contiguous ({result.max_length} positions)", format_bytes(result.contiguous_request_bytes),
                  format_bytes(result.contiguous_request_bytes - result.request_bytes),
                  f"{result.contiguous_requests:,}")
    if result.paged_request_bytes is not None:
        every = ", every position" if result.sliding_layers else ""
        table.add_row(f"paged ({result.block_size}-position blocks{every})", format_bytes(result.paged_request_bytes),
                      format_bytes(result.paged_waste_bytes), f"{result.paged_requests:,}")
    representation = result.quantize or result.dtype
    out: list = []
    if result.preset is not None:
        out.append(f"{result.preset}: {parameters_text(result.parameters)} parameters, weights {format_bytes(result.weights_bytes)} "
                   f"in {result.dtype} ({result.weights_bytes:,} bytes), taken off {format_bytes(result.memory_bytes)}")
    out.append(f"bytes per token: {result.bytes_per_token:,.0f} ({representation}: {result.assumptions})")
    if result.quantize or result.sliding_layers:
        out.append(f"{result.request_bytes / result.full_precision_bytes:.2f} of the {result.dtype} cache keeping "
                   f"every position ({format_bytes(result.full_precision_bytes)} per request, "
                   f"{result.full_precision_bytes / result.tokens:,.0f} bytes per token)")
    out.append(table)
    out.append("Counts key/value storage" + (" and the weights" if result.preset else "")
               + ": activations and allocator slack need --reserved.")
    return out
