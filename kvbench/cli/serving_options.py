"""The options of a serving run (`kvbench run --trace ...`); kvbench.cli.serve checks and runs them."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from kvbench.cli.parser import integer
from kvbench.serving import admission, disciplines, goodput, trace

DEFAULT_KINDS = ("static", "paged")
DEFAULT_REQUESTS = 16
DEFAULT_REPEATS = 3
DEFAULT_BUDGET_REQUESTS = 4  # no --kv-budget: what static ("request") needs for its 4 largest requests at once
DEFAULT_BATCHED_TOKENS = 512  # vLLM's default token budget when chunked prefill is on (vllm-project/vllm#4580)


def token_budget(text: str) -> int | None:
    """--max-batched-tokens: a positive integer, or 'none' (every admitted prompt prefilled whole)."""
    if text.lower() == "none":
        return None
    return integer(1, 1 << 20)(text)


def share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1], got {text!r}")
    return value


def add_serving_options(run: argparse.ArgumentParser) -> None:
    group = run.add_argument_group(
        "serving (--trace)", "Many requests under one KV budget, scheduled iteration by iteration (docs/serving.md). "
        f"Kinds: {', '.join(admission.SERVING_KINDS)} (default --modes {','.join(DEFAULT_KINDS)}).")
    group.add_argument("--trace", metavar="LENGTHS|SHAPE|FILE", help="chat | alpaca (the PagedAttention paper's "
                       "ShareGPT and Alpaca means) | fixed:P,N | uniform:P0-P1,N0-N1; shared-prefix[:G,P,S,Q,O] | "
                       "multi-turn[:C,T,U,O] (prompts that reuse prefixes, kvbench.serving.sharing); or a saved trace "
                       "or serving record")
    group.add_argument("--requests", type=integer(1, trace.MAX_REQUESTS), default=DEFAULT_REQUESTS, help="requests in the trace")
    group.add_argument("--arrivals", default="all", metavar="all|poisson:R|closed:C",
                       help="all at 0, Poisson at R requests/s, or C closed-loop clients")
    group.add_argument("--prefix", type=integer(1, 1 << 20), metavar="S", help="a shared system prompt of S tokens")
    group.add_argument("--prefix-fraction", type=share, default=1.0, metavar="F", help="requests that carry it")
    group.add_argument("--share-prefix", action="store_true", help="paged: fork the prefix's blocks (copy-on-write)")
    group.add_argument("--cancel", metavar="F:K", help="a fraction F of requests is cancelled after K output tokens")
    group.add_argument("--kv-budget", metavar="BYTES|N%", help="the KV memory budget: bytes ('64MiB') or a share of "
                       f"free memory; default: static's need for the trace's {DEFAULT_BUDGET_REQUESTS} largest requests")
    group.add_argument("--reserve", choices=admission.RESERVE_POLICIES, default="request",
                       help="static and quantized reserve prompt + output - 1 positions (request) or max_length")
    group.add_argument("--block-size", type=integer(1, 4096), default=admission.DEFAULT_BLOCK_SIZE,
                       help="paged: positions per block")
    group.add_argument("--max-batched-tokens", type=token_budget, default=DEFAULT_BATCHED_TOKENS, metavar="N|none",
                       help="tokens per iteration: one per decoding request, the rest prompt chunks (chunked "
                       f"prefill); 'none' prefills every admitted prompt whole (default {DEFAULT_BATCHED_TOKENS})")
    group.add_argument("--prefix-cache", action="store_true", help="paged: also replay each paged kind with a "
                       "prefix cache (KIND-prefix: full blocks kept after their request, LRU eviction), side by side")
    group.add_argument("--queue-order", choices=sorted(disciplines.ORDERS), default=disciplines.FirstComeFirstServed.name,
                       help="the waiting queue's order with --prefix-cache: arrival, or the longest cached prefix first")
    group.add_argument("--save-trace", type=Path, metavar="FILE.json", help="also write the trace alone here")
    sweep = run.add_argument_group(
        "goodput and capacity (--trace)", "The trace's requests replayed with Poisson arrivals at several rates "
        "after the sampled replays (docs/serving.md); --max-seconds bounds this sweep's time too.")
    sweep.add_argument("--rate-sweep", metavar="R1,R2,...", help="Poisson rates (requests/s): one replay per kind "
                       "at each, the same lengths and seed")
    sweep.add_argument("--capacity", action="store_true", help="search each kind's capacity: the highest rate at "
                       f"which {goodput.ATTAINMENT:.0%}% of requests meet --slo, within +-{goodput.TOLERANCE:.0%}% "
                       f"in at most {goodput.MAX_PROBES} probes")  # argparse formats help with %: 90%% prints 90%
    sweep.add_argument("--slo", metavar="NAME=MS|NAME=Nx,...", help=f"latency targets ({', '.join(goodput.TARGETS)}) "
                       "in ms, or N times one unloaded decode step measured in the run (Sarathi-Serve: tbt_p99=5x "
                       "strict, 25x relaxed)")
