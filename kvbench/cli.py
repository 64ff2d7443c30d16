"""kvbench's command line: `build_parser` builds it, `main` runs it, one `cmd_*` per subcommand.

Every error a user can cause ends the same way: one line on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvbench.decode import MODES

DEFAULT_LENGTHS = "16,32,64,128,256,512"
EXAMPLES = """examples:
  kvbench run                                   # the default grid, all modes
  kvbench run --lengths 64,256 --modes full,static --repeats 11
  kvbench run --preset medium --lengths 2048 --modes concat,static,paged
  kvbench show results/records/run-*.json
  kvbench env
"""


class CliError(Exception):
    """A user error: reported as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse prints usage too; one line is the rule here
        raise CliError(f"{self.prog}: {message}")


def _int_at_least(minimum: int, expected: str):
    """An argparse type: an integer >= minimum, rejected with one line naming what was given."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
        return value

    return parse


positive_int = _int_at_least(1, "a positive integer")
non_negative_int = _int_at_least(0, "an integer >= 0")


def int_list(text: str) -> list[int]:
    values = []
    for part in text.split(","):
        try:
            values.append(positive_int(part.strip()))
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {part.strip()!r} in {text!r}") from None
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"lengths must be distinct, got {text!r}")
    return values


def size(text: str) -> int:
    from kvbench.budget import parse_size

    if text.strip() == "0":
        return 0
    try:
        return parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def mode_list(text: str) -> list[str]:
    modes = [part.strip() for part in text.split(",")]
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown mode {unknown[0]!r}; choose from {','.join(MODES)}")
    if len(set(modes)) != len(modes):
        raise argparse.ArgumentTypeError(f"modes must be distinct, got {text!r}")
    return modes


def add_model_options(parser: argparse.ArgumentParser) -> None:
    from kvbench.model import DTYPES, PRESETS

    group = parser.add_argument_group("model (a preset, then per-field overrides)")
    group.add_argument("--preset", choices=sorted(PRESETS), default="seed", help="named model dimensions; seed = the source document's lab")
    group.add_argument("--width", type=positive_int, help="model width C (default: the preset's)")
    group.add_argument("--heads", type=positive_int, help="query heads H (default: the preset's)")
    group.add_argument("--kv-heads", type=positive_int, help="key/value heads, dividing --heads (default: = heads)")
    group.add_argument("--layers", type=positive_int, help="decoder blocks (default: the preset's)")
    group.add_argument("--vocab-size", type=positive_int, help="vocabulary size (default: the preset's)")
    group.add_argument("--max-length", type=positive_int, help="position capacity (default: the preset's)")
    group.add_argument("--dtype", choices=sorted(DTYPES), help="parameter and cache dtype (default: float32)")


def build_parser() -> argparse.ArgumentParser:
    from kvbench import __version__

    formatter = argparse.ArgumentDefaultsHelpFormatter
    parser = Parser(prog="kvbench", description="What a KV cache saves, measured against full-prefix decoding.",
                    epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"kvbench {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    commands.required = True

    run = commands.add_parser("run", help="check equivalence, time every mode and length, write a record", formatter_class=formatter)
    run.add_argument("--lengths", type=int_list, default=int_list(DEFAULT_LENGTHS), metavar="N,N,...", help="sequence lengths (tokens decoded per loop)")
    run.add_argument("--modes", type=mode_list, default=list(MODES), metavar="M,M,...", help=f"modes among {','.join(MODES)}")
    run.add_argument("--repeats", type=positive_int, default=7, help="timed repetitions per mode and length")
    run.add_argument("--warmup", type=non_negative_int, default=1, help="untimed loops per mode before timing")
    run.add_argument("--batch", type=positive_int, default=1, help="sequences per request")
    run.add_argument("--seed", type=non_negative_int, default=0, help="seed for weights and token ids")
    run.add_argument("--threads", type=positive_int, default=1, help="torch intra- and inter-op threads")
    run.add_argument("--per-step", type=positive_int, metavar="LENGTH", help="also record every step's duration of one loop at LENGTH")
    run.add_argument("--output", type=Path, help="record path (default: a new timestamped file under results/records/)")
    run.add_argument("--force", action="store_true", help="overwrite --output if it exists")
    run.add_argument("--no-progress", action="store_true", help="do not show progress bars")
    add_model_options(run)
    run.set_defaults(handler=cmd_run)

    show = commands.add_parser("show", help="print the table of a saved record", formatter_class=formatter)
    show.add_argument("record", type=Path)
    show.set_defaults(handler=cmd_show)

    from kvbench import compare, report  # light: scipy and matplotlib load only when used

    report_parser = commands.add_parser(
        "report", help="timings with spread, speedups with 95%% CIs, scaling fit, per-step profile, plots",
        formatter_class=formatter,
        epilog="example: kvbench report run.json --format html --output run.html --plot run.svg",
    )
    report_parser.add_argument("record", type=Path)
    report_parser.add_argument("--format", choices=report.FORMATS, default="text", help="layout of the report")
    report_parser.add_argument("--plot", type=Path, metavar="PATH.png|.svg", help="also write the four plots to one image")
    report_parser.add_argument("--output", type=Path, help="write the report here instead of stdout")
    report_parser.add_argument("--into", type=Path, metavar="FILE.md",
                               help="replace the marked block in FILE.md with the markdown report (for the README)")
    report_parser.add_argument("--force", action="store_true", help="overwrite --output / --plot if they exist")
    report_parser.set_defaults(handler=cmd_report)

    compare_parser = commands.add_parser(
        "compare", help="environment diff, then per cell NEW/OLD ratio with 95%% CI and Mann-Whitney U",
        formatter_class=formatter,
        epilog="exit status: 0; 1 with --fail-on-regression when a cell is significantly slower by more than --factor; 2 on bad input",
    )
    compare_parser.add_argument("old", type=Path, metavar="OLD")
    compare_parser.add_argument("new", type=Path, metavar="NEW")
    compare_parser.add_argument("--factor", type=float, default=compare.FACTOR,
                                help="a ratio of medians within [1/factor, factor] is unchanged")
    compare_parser.add_argument("--alpha", type=float, default=compare.ALPHA, help="significance level of the Mann-Whitney U test")
    compare_parser.add_argument("--fail-on-regression", action="store_true",
                                help="exit 1 when a cell is significantly slower by more than --factor")
    compare_parser.add_argument("--format", choices=compare.FORMATS, default="text", help="layout of the comparison")
    compare_parser.set_defaults(handler=cmd_compare)

    env = commands.add_parser("env", help="print the captured environment as JSON", formatter_class=formatter)
    env.set_defaults(handler=cmd_env)

    budget = commands.add_parser(
        "budget", help="KV-cache bytes per token and request, and how many requests fit", formatter_class=formatter,
        epilog="example: kvbench budget --layers 32 --kv-heads 8 --head-dim 128 --dtype bfloat16 --tokens 4096 --memory 80GiB",
    )
    budget.add_argument("--layers", type=positive_int, required=True)
    budget.add_argument("--kv-heads", type=positive_int, required=True, help="key/value heads (the GQA count)")
    budget.add_argument("--head-dim", type=positive_int, required=True, help="head width D")
    budget.add_argument("--dtype", choices=["float32", "bfloat16", "float16", "int8"], default="bfloat16")
    budget.add_argument("--int8-group", type=positive_int, help="int8 elements per float16 scale (default: head width)")
    budget.add_argument("--tokens", type=positive_int, required=True, help="tokens retained per request")
    budget.add_argument("--max-length", type=positive_int, help="positions a contiguous cache preallocates per request (default: --tokens)")
    budget.add_argument("--block-size", type=positive_int, default=16, help="positions per paged block")
    budget.add_argument("--memory", type=size, required=True, help="memory limit for KV caches, e.g. 24GiB, 80GB")
    budget.add_argument("--reserved", type=size, default=0, help="part of --memory kept for weights and workspace")
    budget.add_argument("--json", action="store_true", help="print the numbers as JSON")
    budget.set_defaults(handler=cmd_budget)

    asv_machine = commands.add_parser(
        "asv-machine", help="register this machine with asv (~/.asv-machine.json) from the capture, no prompts",
        formatter_class=formatter, epilog="example: kvbench asv-machine --name ci-runner-1 && asv run --machine ci-runner-1",
    )
    asv_machine.add_argument("--name", help="asv machine name; results go to results/asv/NAME/ (default: the hostname, as asv)")
    asv_machine.set_defaults(handler=cmd_asv_machine)

    asv_show = commands.add_parser(
        "asv-show", help="print an asv result file's samples, medians and CIs beside its captured environment",
        formatter_class=formatter, epilog="example: kvbench asv-show results/asv/MACHINE/1a2b3c4d-virtualenv-py3.11-....json",
    )
    asv_show.add_argument("result", type=Path, help="an asv result file under results/asv/<machine>/")
    asv_show.set_defaults(handler=cmd_asv_show)
    return parser


def config_from_args(args: argparse.Namespace):
    from kvbench.model import preset_config

    fields = {"width": args.width, "heads": args.heads, "kv_heads": args.kv_heads, "layers": args.layers,
              "vocab_size": args.vocab_size, "max_length": args.max_length, "dtype": args.dtype}
    return preset_config(args.preset, **{name: value for name, value in fields.items() if value is not None})


def cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from kvbench import capture, record, report, timing
    from kvbench.model import build_model

    config = config_from_args(args)
    too_long = [n for n in [*args.lengths, args.per_step or 0] if n > config.max_length]
    if too_long:
        raise CliError(f"length {too_long[0]} exceeds max_length {config.max_length} of preset {args.preset!r}")
    output = args.output or record.default_record_path()
    if output.is_dir():
        raise CliError(f"--output {output} is a directory; expected a file path")
    if output.exists() and not args.force:
        raise CliError(f"{output} already exists; pass --force to overwrite it")

    threads = timing.set_threads(args.threads)  # before any torch work in this process
    model = build_model(config, seed=args.seed)
    stderr = Console(stderr=True)
    with _progress(stderr, disabled=args.no_progress) as on_progress:
        outcome = timing.run_benchmark(
            model, args.lengths, args.modes, batch=args.batch, seed=args.seed, repeats=args.repeats,
            warmup=args.warmup, per_step_length=args.per_step, on_progress=on_progress,
        )
    protocol = timing.Protocol(repeats=args.repeats, warmup=args.warmup, threads=args.threads, threads_in_effect=threads)
    run_settings = {"preset": args.preset, "lengths": args.lengths, "modes": args.modes, "batch": args.batch,
                    "seed": args.seed, "repeats": args.repeats, "warmup": args.warmup, "threads": args.threads,
                    "per_step_length": args.per_step}
    result = record.build_record(
        command=["kvbench", *args.argv],
        config=config.to_dict(), run=run_settings, protocol=protocol.to_dict(),
        environment=capture.collect_environment(), checks=outcome.checks,
        repetitions=outcome.repetitions, memory=outcome.memory, per_step=outcome.per_step,
        status="incomplete" if outcome.interrupted else "complete",
    )
    path = record.write_record(result, output, force=args.force)
    console = _stdout_console()
    console.print(report.summary_table(result))
    failed = [c for c in outcome.checks if not c["passed"]]
    for check in failed:
        stderr.print(
            f"[bold red]EQUIVALENCE FAILED[/]: {check['mode']} at length {check['length']} diverges from full-prefix "
            f"logits at position {check['first_divergent_position']} (max |diff| {check['max_abs_diff']:.3g} > "
            f"atol {check['atol']:g} + rtol {check['rtol']:g}); its timings are not a valid speedup"
        )
    console.print(f"record: {path}")
    if outcome.interrupted:
        stderr.print("[yellow]interrupted: the record keeps the completed repetitions and is marked incomplete[/]")
        return 130
    return 1 if failed else 0


class _progress:
    """A rich progress bar on stderr, fed by run_benchmark's (stage, done, total) events."""

    def __init__(self, console, disabled: bool) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = None if disabled else Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console, transient=True,
        )
        self.tasks: dict[str, int] = {}

    def __enter__(self):
        if self.progress is None:
            return None
        self.progress.__enter__()
        return self.update

    def update(self, stage: str, done: int, total: int) -> None:
        if stage not in self.tasks:
            self.tasks[stage] = self.progress.add_task(stage, total=total)
        self.progress.update(self.tasks[stage], completed=done, total=total)

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.__exit__(*exc)


def _stdout_console():
    from rich.console import Console

    console = Console()
    # Piped output (CI logs, files) would otherwise be cut to 80 columns.
    return console if console.is_terminal else Console(width=120)


def cmd_show(args: argparse.Namespace) -> int:
    from kvbench import record, report

    loaded = record.load_record(args.record)
    _stdout_console().print(report.summary_table(loaded))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from kvbench import report

    return report.report_command(args.record, fmt=args.format, plot=args.plot, output=args.output,
                                 into=args.into, force=args.force)


def cmd_compare(args: argparse.Namespace) -> int:
    from kvbench import compare

    return compare.compare_command(args.old, args.new, factor=args.factor, alpha=args.alpha,
                                   fail_on_regression=args.fail_on_regression, fmt=args.format)


def cmd_env(args: argparse.Namespace) -> int:
    from kvbench import capture

    print(json.dumps(capture.collect_environment(), indent=2))
    return 0


def cmd_budget(args: argparse.Namespace) -> int:
    from rich.table import Table

    from kvbench.budget import kv_budget
    from kvbench.report import format_bytes

    result = kv_budget(args.layers, args.kv_heads, args.head_dim, args.dtype, args.tokens, args.memory,
                       block_size=args.block_size, max_length=args.max_length, reserved_bytes=args.reserved,
                       int8_group=args.int8_group)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    table = Table(title=f"{args.tokens} tokens per request, {format_bytes(args.memory - args.reserved)} for KV caches",
                  title_justify="left")
    for name in ("layout", "bytes per request", "wasted per request", "requests that fit"):
        table.add_column(name, justify="left" if name == "layout" else "right")
    table.add_row("exact (no slack)", format_bytes(result.request_bytes), "0 B", f"{result.exact_requests:,}")
    table.add_row(f"contiguous ({result.max_length} positions)", format_bytes(result.contiguous_request_bytes),
                  format_bytes(result.contiguous_request_bytes - result.request_bytes), f"{result.contiguous_requests:,}")
    table.add_row(f"paged ({args.block_size}-position blocks)", format_bytes(result.paged_request_bytes),
                  format_bytes(result.paged_waste_bytes), f"{result.paged_requests:,}")
    console = _stdout_console()
    console.print(f"bytes per token: {result.bytes_per_token:,.0f} (2 x layers x KV heads x head width x "
                  f"{result.bytes_per_element:g} bytes per element)")
    if args.dtype == "int8":
        console.print(f"int8 includes one float16 scale per {result.int8_group} elements: "
                      f"+{result.scale_overhead:.2%} over the int8 elements")
    console.print(table)
    console.print("Counts key/value storage only: weights, activations and allocator slack need --reserved.")
    return 0


def cmd_asv_machine(args: argparse.Namespace) -> int:
    from kvbench import asvtools

    info, replaced = asvtools.register_machine(args.name)
    print(f"{'updated' if replaced else 'registered'} asv machine {info['machine']!r} in {asvtools.machine_file_path()}")
    for key in ("os", "arch", "cpu", "num_cpu", "ram"):
        print(f"  {key}: {info[key]}")
    print(f"run: asv run --machine {info['machine']}  (results under {asvtools.RESULTS_DIR / info['machine']}/)")
    return 0


def cmd_asv_show(args: argparse.Namespace) -> int:
    from kvbench import asvtools

    print(asvtools.show_result(args.result))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        args.argv = [str(a) for a in (sys.argv[1:] if argv is None else argv)]  # recorded with each run
        return args.handler(args)
    except (CliError, ValueError, OSError) as error:  # RecordError is a ValueError
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        print(f"kvbench: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # run keeps completed repetitions itself; elsewhere nothing is half-written
        print("kvbench: interrupted; nothing was written", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
