"""The options some cache kinds read (kvbench.cli.usage.KIND_OPTIONS says which): the quantized kinds' group and
residual, the evicting kinds' budget and schedule. Given to a cache by keyword (kvbench.cli.usage.CACHE_OPTIONS)."""

from __future__ import annotations

import argparse

from kvbench.cli.parser import finite_float, integer
from kvbench.kinds import DEFAULT_EVICT_RATIO, GROUP_SIZE, RESIDUAL

positive_int = integer(1)


def ratio_below_one(text: str) -> float:
    value = finite_float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1) such as 0.5, got {text!r}")
    return value


def add_eviction_options(parser: argparse.ArgumentParser) -> None:
    """--evict-ratio, --kv-keep and --evict-every: how much a score-based evicting kind keeps, and when."""
    group = parser.add_argument_group(
        "evicting kinds (knorm, snapkv, tova, h2o, pyramidkv, streamingllm, random)",
        "Each key/value head keeps its top-scored positions when the first decoding step after the prompt comes "
        "(docs/eviction.md).")
    size = group.add_mutually_exclusive_group()
    size.add_argument("--evict-ratio", type=ratio_below_one, metavar="R",
                      help=f"the fraction of the positions each head removes, in [0, 1) (default: {DEFAULT_EVICT_RATIO})")
    size.add_argument("--kv-keep", type=positive_int, metavar="N", help="the positions each head keeps, instead")
    group.add_argument("--evict-every", type=positive_int, metavar="N",
                       help="also evict back to that budget every N decoding steps (by default only after the prompt)")


def add_quantization_options(group, group_help: str, residual_help: str) -> None:
    """--quant-group and --quant-residual, with one range and default for `run` and `budget`."""
    group.add_argument("--quant-group", type=integer(1, 4096), default=GROUP_SIZE, metavar="G", help=group_help)
    group.add_argument("--quant-residual", type=integer(0, 1 << 20), default=RESIDUAL, metavar="R", help=residual_help)


