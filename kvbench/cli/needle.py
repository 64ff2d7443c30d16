"""`kvbench run --needle C,C,...`: its options, their checks, and the stage that runs after the timing.

The checks come in two steps. Before anything loads (torch-free, kvbench.cli.run.check_run): the depths' range
(the argument type), a context that alone fills the model's positions, and --needle-ratios beside no kind that
reads evict_ratio. Once the model's tokenizer is loaded, before anything is timed: every cell built, which knows
how many tokens the needle, the question and the answer take, so a context that leaves them no room is one line
naming the longest that fits (kvbench.workloads.needle.build_cells).
"""

from __future__ import annotations

import argparse

from kvbench.cli.kind_options import ratio_below_one
from kvbench.cli.parser import CliError
from kvbench.cli.progress import stage
from kvbench.kinds import EVICT_RATIO, NEEDLE_CONTEXTS, NEEDLE_DEPTHS
from kvbench.measure import memory
from kvbench.modes import FULL, SPECS


def depth_list(text: str) -> list[int]:
    """Distinct depths in [0, 100], percent of the context."""
    parts = [part.strip() for part in text.split(",")]
    bad = [part for part in parts if not part.isdigit() or not part.isascii() or int(part) > 100]
    if bad:
        raise argparse.ArgumentTypeError(f"expected comma-separated depths in [0, 100] (percent of the context), got "
                                         f"{bad[0]!r} in {text!r}")
    depths = [int(part) for part in parts]
    if len(set(depths)) != len(depths):
        raise argparse.ArgumentTypeError(f"depths must be distinct, got {text!r}")
    return depths


def ratio_list(text: str) -> list[float]:
    """Distinct ratios in [0, 1), each read as --evict-ratio reads one; each kind taking evict_ratio runs once per
    ratio."""
    ratios = []
    for part in text.split(","):
        try:
            ratios.append(ratio_below_one(part))
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"expected comma-separated fractions in [0, 1) such as 0.25,0.5,0.75, "
                                             f"got {part.strip()!r} in {text!r}") from None
    if len(set(ratios)) != len(ratios):
        raise argparse.ArgumentTypeError(f"ratios must be distinct, got {text!r}")
    return ratios


def add_needle_options(run: argparse.ArgumentParser, contexts_type) -> None:
    run.add_argument("--needle", type=contexts_type, metavar="C,C,...",
                     help="with --model/--gguf: after timing, retrieval of a passkey hidden in corpus contexts of C "
                          f"tokens each (e.g. {','.join(map(str, NEEDLE_CONTEXTS))}), asked for after them: accuracy "
                          "and the answer's log-prob per mode against full's (docs/real-model.md)")
    run.add_argument("--needle-depths", type=depth_list, metavar="D,D,...",
                     help=f"where --needle hides it, percent of the context (default: "
                          f"{','.join(map(str, NEEDLE_DEPTHS))})")
    run.add_argument("--needle-ratios", type=ratio_list, metavar="R,R,...",
                     help="--needle runs each kind that takes evict_ratio once per ratio, and names the largest "
                          "that loses at most 1 point of accuracy and 0.1 nats of answer log-prob against full")


def check_needle(args: argparse.Namespace, max_length: int, model: str) -> None:
    """What can be refused before the model loads (usage.NEEDS has refused --needle without a model and its
    companions without --needle)."""
    if args.needle is None:
        return
    beyond = [context for context in args.needle if context >= max_length]
    if beyond:
        raise CliError(f"--needle {beyond[0]}: a context and its question need more than {beyond[0]} positions, "
                       f"expected fewer than max_length {max_length} of {model}")
    if args.needle_ratios and not any(EVICT_RATIO in SPECS[mode].options for mode in args.modes if mode in SPECS):
        raise CliError(f"--needle-ratios is read by kinds that take {EVICT_RATIO} only, and --modes "
                       f"{','.join(args.modes)} runs none of them")
    if args.needle_ratios and getattr(args, "kv_keep", None) is not None:  # a kind's budget is one or the other
        raise CliError(f"--needle-ratios runs each kind at each {EVICT_RATIO}; --kv-keep {args.kv_keep} gives them a "
                       "count of positions instead: give one of them")


def needle_bytes(config, contexts: list[int]) -> dict:
    """What --needle's largest cell allocates at its peak: its context's one-call prefill is the full-prefix
    forward the run's estimate counts (logits at every position, the attention weights among them), beside a
    cache and the copy it continues from; unlike a gate, it keeps no logits a step."""
    parts = memory.estimate_run_bytes(config, 1, [max(contexts)], [FULL])
    parts.pop("gate logits")
    names = {"caches": "a cache and its copy", "full-prefix activations": f"the --needle {max(contexts)} prefill"}
    return {names.get(name, name): size for name, size in parts.items()}


def prepare_needle(args: argparse.Namespace, tokenizer, max_length: int, seed: int) -> list | None:
    """The cells, built once the tokenizer is loaded (None without --needle); a grid they cannot hold is one line."""
    if args.needle is None:
        return None
    from kvbench.workloads import needle

    try:
        return needle.build_cells(tokenizer, args.needle, args.needle_depths or NEEDLE_DEPTHS, seed, max_length)
    except ValueError as error:
        raise CliError(f"--needle: {error}") from None


def measure_needle(args: argparse.Namespace, model, tokenizer, cells: list, console) -> dict:
    """The record's needle section, each cell counted on stderr (a 4096-token context takes tens of seconds)."""
    from kvbench.workloads import needle

    runs = needle.runs_for(args.modes, args.cache_options, args.needle_ratios)
    with stage(console, "needle", disabled=args.no_progress) as update:
        return needle.measure(model, tokenizer, cells, runs,
                              on_progress=lambda done, total, what: update(done, total, f"needle: {what}"))
