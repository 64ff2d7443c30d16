"""`kvbench run`: the gate, the timed repetitions and the record, with progress on stderr."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape

from kvbench import capture, record, timing
from kvbench.cli.commands import check_output, config_from_args
from kvbench.cli.options import CliError
from kvbench.model import build_model
from kvbench.report import model as report_model
from kvbench.report import terminal
from kvbench.report.format import stdout_console
from kvbench.timing import Protocol


def cmd_run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    too_long = [n for n in [*args.lengths, args.per_step or 0] if n > config.max_length]
    if too_long:
        raise CliError(f"length {too_long[0]} exceeds max_length {config.max_length} of preset {args.preset!r}")
    protocol = Protocol(repeats=args.repeats, warmup=args.warmup, batch=args.batch, seed=args.seed,
                        threads=args.threads, per_step_length=args.per_step)
    output = args.output or record.default_record_path()
    check_output(output, args.force)

    threads = timing.set_threads(protocol.threads)  # before any torch work in this process
    model = build_model(config, seed=protocol.seed)
    stderr = Console(stderr=True)
    with ProgressBar(stderr, disabled=args.no_progress) as on_progress:
        outcome = timing.run_benchmark(model, args.lengths, args.modes, protocol, on_progress=on_progress)
    result = record.record_from_run(
        outcome, command=["kvbench", *args.argv], preset=args.preset, config=config, lengths=args.lengths,
        modes=args.modes, protocol=protocol, threads_in_effect=threads, environment=capture.collect_environment(),
    )
    path = record.write_record(result, output, force=args.force)
    console = stdout_console()
    console.print(terminal.quick_table(report_model.build_report(record.RecordView(result, str(path)))))
    failed = [check for check in outcome.checks if not check["passed"]]
    for check in failed:
        stderr.print(f"[bold red]EQUIVALENCE FAILED[/]: {failure_sentence(check)}")
    console.print(f"record: {path}")
    if outcome.interrupted:
        stderr.print("[yellow]interrupted: the record keeps the completed repetitions and is marked incomplete[/]")
        return 130
    return 1 if failed else 0


def failure_sentence(check: dict) -> str:
    where = f"{escape(check['mode'])} at length {check['length']}"
    if check.get("error"):
        return f"{where} raised {escape(check['error'])}; it was not timed"
    return (f"{where} diverges from full-prefix logits at position {check['first_divergent_position']} "
            f"(max |diff| {check['max_abs_diff']:.3g} > atol {check['atol']:g} + rtol {check['rtol']:g}); "
            "its timings are not a valid speedup")


class ProgressBar:
    """A rich progress bar on stderr, fed by run_benchmark's (stage, done, total) events."""

    def __init__(self, console, disabled: bool) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

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
