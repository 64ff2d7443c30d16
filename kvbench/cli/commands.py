"""The reading and tool commands: show, report, compare, export, history, env, budget, asv-machine, asv-show.

Each `cmd_*` checks its options against each other, turns them into typed values and
calls the library; the library's errors speak of values, never of options.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

from kvbench import files
from kvbench.budget import BudgetError, model_budget
from kvbench.cli.options import PLOT_SUFFIXES, REPOSITORY_VARIABLE
from kvbench.cli.parser import CliError
from kvbench.config import PlainConfig
from kvbench.files import write_bytes_atomic
from kvbench.measure import capture
from kvbench.record import RecordView
from kvbench.report.budget import budget_renderables
from kvbench.report.comparison import compare
from kvbench.report.comparison import markdown as comparison_markdown
from kvbench.report.comparison import terminal as comparison_terminal
from kvbench.report.comparison.differences import work_differences, work_text
from kvbench.report.format import splice, stdout_console
from kvbench.report.record import markdown, model, terminal


def config_from_args(args: argparse.Namespace) -> PlainConfig:
    """The preset with the fields the options override, checked without torch."""
    fields = {"width": args.width, "heads": args.heads, "kv_heads": args.kv_heads, "layers": args.layers,
              "vocab_size": args.vocab_size, "max_length": args.max_length, "dtype": args.dtype,
              "window": args.window, "window_pattern": args.window_pattern, "sinks": getattr(args, "sinks", None)}
    return PlainConfig.from_preset(args.preset, **{name: value for name, value in fields.items() if value is not None})


def check_output(path: Path, force: bool, option: str = "--output", reading: Path | None = None) -> None:
    """Refuse an output path before any work is done (`reading`: the input it must not replace)."""
    if reading is not None and same_file(path, reading):
        raise CliError(f"{option} {path} is the record being read; choose another file")
    try:
        files.check_output(path, force)  # OutputExistsError goes on to main, which adds the --force hint
    except files.OutputError as error:
        raise CliError(f"{option} {error}") from None


def same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def load_view(path: Path) -> RecordView:
    return RecordView.load(path)


def cmd_show(args: argparse.Namespace, view: RecordView | None = None) -> int:
    """`view`: the record of args.record where the caller has read it already."""
    console, report = stdout_console(args.wide), model.build_report(view or load_view(args.record))
    for item in terminal.quick_renderables(report, console.width, args.wide):
        console.print(item)
    return 0


def check_report_options(args: argparse.Namespace) -> None:
    if args.into is not None and args.output is not None:
        raise CliError("--output and --into are exclusive: --into edits a file in place")
    if args.into is not None and args.format != "markdown":
        raise CliError(f"--into splices a markdown block: use --format markdown, not {args.format}")
    if args.plot is not None and args.plot.suffix.lower() not in PLOT_SUFFIXES:
        raise CliError(f"--plot {args.plot}: the file name must end in {' or '.join(PLOT_SUFFIXES)}")
    targets = [(option, target) for option, target in (("--output", args.output), ("--plot", args.plot),
                                                        ("--into", args.into)) if target is not None]
    for (option, target), (other, path) in itertools.combinations(targets, 2):
        if same_file(target, path):
            raise CliError(f"{option} and {other} both name {target}: the report and the plot need different files")
    for option, target in targets:
        check_output(target, args.force or option == "--into", option, reading=args.record)
    if args.into is not None and not args.into.is_file():
        raise CliError(f"--into {args.into}: no such file")


def cmd_report(args: argparse.Namespace, view: RecordView | None = None) -> int:
    check_report_options(args)
    report = model.build_report(view or load_view(args.record))
    if args.plot is not None:
        from kvbench.report.record import plots

        write_bytes_atomic(args.plot, plots.render_overview(report, args.plot.suffix.lower()), args.force)
    if args.format == "text":
        if args.output is None:
            console = stdout_console(args.wide)
            for item in terminal.report_renderables(report, console.width, args.wide):
                console.print(item)
            return 0
        content = terminal.render_report(report)  # a file: every column
    elif args.format == "markdown":
        content = markdown.render_report(report, image=plot_link(args))
    else:
        from kvbench.report.record import html, plots

        content = html.render_report(report, plots.render_panels(report))
    return deliver_report(args, content)


def plot_link(args: argparse.Namespace) -> str | None:
    """--plot as a markdown report links it: relative to the file the report goes to (or to here)."""
    if args.plot is None:
        return None
    target = args.into or args.output
    anchor = target.parent if target else Path.cwd()
    return Path(os.path.relpath(args.plot.resolve(), anchor.resolve())).as_posix()


def deliver_report(args: argparse.Namespace, content: str) -> int:
    """A rendered report where it was asked: spliced --into a markdown file, written to --output, or to stdout."""
    if args.into is not None:
        content = splice(files.read_regular_file(args.into, "markdown file").decode(), content, str(args.into))
        write_bytes_atomic(args.into, content.encode(), force=True)
    elif args.output is None:
        sys.stdout.write(content)
    else:
        write_bytes_atomic(args.output, content.encode(), args.force)
    return 0


def check_comparison_options(args: argparse.Namespace) -> None:
    """--factor and --alpha, which compare and history share."""
    if not args.factor > 1:
        raise CliError(f"--factor must be greater than 1, got {args.factor:g}")
    if not 0 < args.alpha < 1:
        raise CliError(f"--alpha must lie strictly between 0 and 1, got {args.alpha:g}")


def check_same_work(old: RecordView, new: RecordView, force: bool) -> None:
    """Refuse to judge records that timed different work (a verdict between them means nothing), unless forced."""
    differences = work_differences(old, new)
    if differences and not force:
        raise CliError(f"{old.source} and {new.source} timed different work ({work_text(differences)}): their "
                       "times do not compare; pass --force to line them up anyway")


def check_compare_arguments(args: argparse.Namespace) -> None:
    """Options that do not fit together are refused before any record is read, whatever kind of record."""
    check_comparison_options(args)
    if args.more and not args.across_machines:
        raise CliError(f"compare takes OLD and NEW; {len(args.more)} more record(s) need --across-machines")
    if args.across_machines:
        for option, given in (("--pair", args.pair), ("--fail-on-regression", args.fail_on_regression)):
            if given:
                raise CliError(f"{option} judges NEW against OLD; --across-machines lines records up instead")
    if len(dict(args.pair)) < len(args.pair):
        raise CliError("--pair names a NEW mode twice")


def print_layout(layout: str, markdown_text, renderables) -> None:
    """A comparison in the layout asked for: `markdown_text()` to stdout, or `renderables()` on the terminal."""
    if layout == "markdown":
        sys.stdout.write(markdown_text())
        return
    console = stdout_console()
    for item in renderables():
        console.print(item)


def cmd_compare(args: argparse.Namespace, views: list[RecordView] | None = None) -> int:
    """kvbench records side by side; `views`, the records of args.old, args.new and args.more where the caller
    has read them already."""
    check_compare_arguments(args)
    if views is None:
        views = [load_view(path) for path in (args.old, args.new, *args.more)]
    if args.across_machines:
        for view in views[1:]:
            check_same_work(views[0], view, args.force)
        print_layout(args.format, lambda: comparison_markdown.render_across(views),
                     lambda: comparison_terminal.across_renderables(views))
        return 0
    mapping = dict(args.pair)
    old, new = views
    check_same_work(old, new, args.force)
    comparison = compare.compare_records(old, new, factor=args.factor, alpha=args.alpha, mapping=mapping)
    print_layout(args.format, lambda: comparison_markdown.render_comparison(comparison),
                 lambda: comparison_terminal.compare_renderables(comparison))
    if args.fail_on_regression and comparison.not_comparable:  # a machine change is no regression of the code
        print(f"kvbench: no regression check: {comparison.not_comparable}, so no cell is slower or faster; "
              f"{comparison.instead}", file=sys.stderr)
    if args.fail_on_regression and comparison.regressions:
        worst = max(comparison.regressions, key=lambda cell: cell.judged.ratio)
        judged = worst.judged
        print(f"kvbench: regression: {len(comparison.regressions)} cell(s) slower beyond their MDE and "
              f"{args.factor:g}x; worst {worst.label} at length {worst.length}: {judged.ratio:.2f}x "
              f"[{judged.low:.2f}, {judged.high:.2f}], MDE ±{judged.mde:.1%}", file=sys.stderr)
        return 1
    return 0


def exportable(path: Path):
    """A record as the exporters take it: the Source its view gives, whatever its workload (kvbench.export.serving)."""
    from kvbench.export.serving import record_source

    return record_source(load_view(path))


def cmd_export(args: argparse.Namespace) -> int:
    from kvbench.export import export_bytes

    if args.repository is not None and args.format != "conbench":
        raise CliError(f"--repository is conbench's github.repository; --format {args.format} has no such field")
    for record in args.records:
        check_output(args.output, args.force, reading=record)
    views = [exportable(record) for record in args.records]
    repository = args.repository or os.environ.get(REPOSITORY_VARIABLE)
    write_bytes_atomic(args.output, export_bytes(views, args.format, {"repository": repository}), args.force)
    print(f"wrote {args.output}: {args.format}, {len(views)} record(s)")
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    from kvbench.report.history import charts as history
    from kvbench.report.history import page as historypage

    check_comparison_options(args)
    check_output(args.output, args.force)
    if not args.results_dir.is_dir() or history.asv_machines(args.results_dir):
        model = history.build_history(args.results_dir, factor=args.factor, alpha=args.alpha)
    else:  # records, of any workload (kvbench.export.history)
        from kvbench.export.history import build_record_history

        model = build_record_history(args.results_dir, factor=args.factor, alpha=args.alpha)
    write_bytes_atomic(args.output, historypage.render_page(model).encode(), args.force)
    print(f"wrote {args.output}: {len(model.charts)} chart(s), {len(model.machines)} machine(s), "
          f"{len(model.commits)} commit(s)")
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    print(json.dumps(capture.collect_environment(), indent=2))
    return 0


def budget_config(args: argparse.Namespace) -> PlainConfig:
    """The preset's config with the shapes given overriding it; without a preset, the shapes alone."""
    shapes = {"layers": args.layers, "kv_heads": args.kv_heads, "head_dim": args.head_dim}
    if args.preset is not None:
        return PlainConfig.from_preset(args.preset, dtype=args.dtype,
                                       **{name: value for name, value in shapes.items() if value is not None})
    missing = [f"--{name.replace('_', '-')}" for name, value in shapes.items() if value is None]
    if missing:
        raise CliError(f"budget needs --preset NAME or all of --layers, --kv-heads and --head-dim; missing "
                       f"{', '.join(missing)}")
    return PlainConfig(vocab_size=1, width=args.kv_heads * args.head_dim, heads=args.kv_heads, layers=args.layers,
                       max_length=max(args.tokens, args.max_length or args.tokens), dtype=args.dtype)


BUDGET_OPTIONS = {"tokens": "--tokens", "max_length": "--max-length", "memory_bytes": "--memory",
                  "reserved_bytes": "--reserved"}  # model_budget's arguments the user gives by these options


def cmd_budget(args: argparse.Namespace) -> int:
    try:
        result = model_budget(budget_config(args), args.tokens, args.memory, block_size=args.block_size,
                              max_length=args.max_length, reserved_bytes=args.reserved, quantize=args.quantize,
                              group_size=args.quant_group, residual=args.quant_residual, preset=args.preset)
    except BudgetError as error:
        raise CliError(f"{BUDGET_OPTIONS[error.argument]}: {error}") from None
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    console = stdout_console()
    for item in budget_renderables(result):
        console.print(item)
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
    from kvbench.report.history import asvresult

    print(asvresult.show_result(args.result, stdout_console().width))  # the terminal's width, or $COLUMNS
    return 0
