"""`kvbench run`: the gate, the timed repetitions and the record, with progress on stderr."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from kvbench import kinds, modes, plugins, record
from kvbench.measure import memory, timing
from kvbench.cli.commands import check_output
from kvbench.cli.device import checked_device, device_section, settle
from kvbench.cli.needle import check_needle, measure_needle, needle_bytes, prepare_needle
from kvbench.cli.parser import CliError, did_you_mean
from kvbench.cli.progress import ProgressBar, stage
from kvbench.cli.real_model import QUALITY_CHUNKS, load_weights, model_config, model_named
from kvbench.cli.serve import check_serve, cmd_serve
from kvbench.cli.usage import (CONTEXTS, LOOP, REQUEST, SERVED, cache_options, check_read, check_used, given_options,
                               option_readers)
from kvbench.config import PlainConfig
from kvbench.report.record import model as report_model
from kvbench.report.record import columns, terminal
from kvbench.report.format import format_bytes, stdout_console
from kvbench.measure.timing import Protocol


def cmd_run(args: argparse.Namespace) -> int:
    """Every argument, path and memory check first (check_run), torch-free, so a refusal costs no import of it;
    then the model, the gate, the timed rotations and the record. With --trace: a serving run (kvbench.cli.serve)."""
    checked = check_run(args)
    if args.workload_name in SERVED:
        return cmd_serve(args, checked)
    config, protocol, output = checked
    from kvbench.measure import capture
    from kvbench.workloads import benchmark
    from kvbench.workloads import workload as workloads

    protocol, device, in_effect = settle(args, protocol)  # threads, CPU, device; refused here without CUDA
    environment = capture.collect_environment()  # first, so that no interrupt can cost it
    workload = workloads.workload_from(**args.workload)
    stderr = Console(stderr=True)
    model, ids, tokenizer, sections = load_model(args, config, protocol, workload, stderr)
    cells = prepare_needle(args, tokenizer, config.max_length, protocol.seed)  # before the timing: a grid too long
    with ProgressBar(stderr, disabled=args.no_progress, protocol=protocol) as on_progress:
        outcome = benchmark.run_benchmark(model, args.lengths, args.modes, protocol, on_progress=on_progress,
                                          options=args.cache_options, workload=workload, ids=ids)
    sections.update(device_section(device, outcome.attention))
    if args.quality is not None and not outcome.interrupted:  # after the timing, which it must not disturb
        from kvbench.models import corpus
        from kvbench.workloads import quality

        text = corpus.corpus_ids(tokenizer, 1, args.quality * QUALITY_CHUNKS)
        with stage(stderr, "quality", disabled=args.no_progress) as update:  # minutes on a real model
            sections["quality"] = quality.measure(model, text, args.modes, tokenizer, args.cache_options,
                                                  QUALITY_CHUNKS, on_progress=lambda done, total, what: update(
                                                      done, total, f"quality: {what}"))
    if cells and not outcome.interrupted:
        sections["needle"] = measure_needle(args, model, tokenizer, cells, stderr)
    with args.signals.deferred():  # from here on a signal is only counted: the record is saved first
        if outcome.interrupted and not (outcome.checks or outcome.repetitions):
            raise args.signals.first or KeyboardInterrupt()  # nothing was completed: nothing to save
        result = record.record_from_run(
            outcome, command=["kvbench", *args.argv], preset=args.model_name, config=config, lengths=args.lengths,
            modes=args.modes, protocol=protocol, in_effect=in_effect, environment=environment, plugins=args.plugins,
            cache_options=args.cache_options, workload=args.workload, sections=sections,
        )
        path = save_record(result, output, args.force)
    console, view = stdout_console(args.wide), record.RecordView(result, str(path))
    report = report_model.build_report(view)
    for item in terminal.quick_renderables(report, console.width, args.wide, verdict=False):
        console.print(item)
    failed = [check for check in outcome.checks if not check["passed"]]
    for check in failed:
        stderr.print(f"[bold red]EQUIVALENCE FAILED[/]: {failure_sentence(check)}")
    for sentence in columns.unquantized_sentences(report):  # the tables mark them ∅; said here too
        stderr.print(f"[yellow]warning[/]: {escape(sentence)}")
    for sentence in uncompressed_sentences(args):
        stderr.print(f"[yellow]warning[/]: {escape(sentence)}")
    console.print(f"record: {path}")
    if report.verdict:  # the last line: what precision the run reached, and if short of it why, in words
        console.print(terminal.verdict_line(report))
    if outcome.interrupted or args.signals.received:
        print(interrupted_sentence(args.signals.first, outcome, args.lengths, args.modes, path), file=sys.stderr)
        return 130
    return 1 if failed else 0


def check_run(args: argparse.Namespace) -> tuple:
    """Every refusal of `kvbench run`, torch-free, before anything is built, measured or written: an option that
    the chosen workload does not use, then the settings' values, the paths and the memory. Returns what cmd_run
    goes on with: (config, protocol, output path), or a serving run's (kvbench.cli.serve.check_serve)."""
    args.given = given_options(args.argv[1:])  # main records "run" and its options as args.argv
    args.workload_name = check_used(args.given, args.trace)
    if args.workload_name in SERVED:
        return check_serve(args)
    config, protocol = settings(args)
    output = args.output or record.default_record_path()
    check_output(output, args.force)  # before any measurement: a bad path costs nothing
    after = args.workload.get("warmup_steps", 0) + args.workload.get("timed_steps", 0)  # a contexts run's steps
    check_needle(args, config.max_length, model_named(args))
    check_fits_in_memory(config, protocol, [n + after for n in args.lengths], args.modes, model_named(args))
    if args.needle:  # after the timing, its largest cell: a prefill, a cache and its copy
        check_fits_in_memory(config, protocol, [], [], model_named(args), needle_bytes(config, args.needle))
    return config, protocol, output


def load_model(args: argparse.Namespace, config: PlainConfig, protocol: Protocol, workload, console):
    """(model, ids, tokenizer, record sections) of a timed run (load_weights): a GGUF file's ids are as long as the
    longest run of `workload` and the per-step profile."""
    positions = max(workload.positions(n) for n in [*args.lengths, protocol.per_step_length or 1])
    return load_weights(args, config, protocol.seed, protocol.device, protocol.batch, positions, console)


def settings(args: argparse.Namespace) -> tuple[PlainConfig, Protocol]:
    args.plugins = [plugins.load_plugin(path) for path in args.plugin]  # before the modes are checked
    try:
        modes.check_modes(args.modes)  # the shipped modes and those the plugins registered
    except ValueError as error:
        unknown = [mode for mode in args.modes if mode not in modes.names()]
        raise CliError(f"--modes: {error}" + (did_you_mean(unknown[0], modes.names()) if unknown else "")) from None
    config = model_config(args)
    for mode in args.modes:
        try:
            modes.spec(mode).require(config)  # an hf-* mode imports transformers here, only to check its version
        except ValueError as error:
            raise CliError(f"--modes {mode}: {error}") from None
    args.cache_options = {mode: options for mode in args.modes if (options := cache_options(args, mode))}
    check_read(args.given, option_readers(args.modes), args.modes)
    workload_settings(args, config)
    check_eviction(args)
    too_long = [n for n in [*args.lengths, args.per_step or 0] if n > config.max_length]
    if too_long:
        raise CliError(f"length {too_long[0]} exceeds max_length {config.max_length} of {model_named(args)}")
    targeted = {"precision": args.precision, "min_repeats": args.min_repeats, "max_repeats": args.max_repeats,
                "max_seconds": args.max_seconds}
    if args.repeats is not None:
        given = [f"--{name.replace('_', '-')}" for name, value in targeted.items() if value is not None]
        if given:
            raise CliError(f"--repeats runs exactly N rotations; it cannot be combined with {', '.join(given)}")
        sampling = {"repeats": args.repeats, "precision": None}
    else:
        sampling = {name.replace("min_repeats", "repeats"): value for name, value in targeted.items()
                    if value is not None}
    try:
        protocol = Protocol(**sampling, between_run=args.between_run, order=args.order, cpu=args.cpu, control=args.control, warmup=args.warmup,
                            batch=args.batch, seed=args.seed, threads=args.threads, per_step_length=args.per_step,
                            device=checked_device(args))
        timing.control_mode(protocol.control, args.modes)
    except ValueError as error:
        raise CliError(str(error)) from None
    return config, protocol


def uncompressed_sentences(args: argparse.Namespace) -> list[str]:
    """A decode loop's prompt is its first token: a kind that compresses its prompt (ModeSpec.compresses_prompt)
    evicts nothing while a loop is timed unless --evict-every asks it to evict while decoding."""
    idle = [mode for mode in args.modes if modes.spec(mode).compresses_prompt
            and "evict_every" not in args.cache_options.get(mode, {})]
    if args.workload_name != LOOP or not idle:
        return []
    return [f"{', '.join(idle)} evicted nothing while timed: a decode loop's prompt is one token, and they compress "
            "their prompt; --evict-every N evicts while decoding, --contexts times the steps after a compressed "
            "prompt (their KV bytes are what each keeps once compressed)"]


def check_eviction(args: argparse.Namespace) -> None:
    """An evicting kind's options against what it always keeps (its cache class says: importing it is cheap beside
    the model) and against the prompt it compresses: a keep count above it would evict nothing."""
    prompt = args.prompt or min(args.contexts or args.lengths)
    for mode, options in args.cache_options.items():
        if "kv_keep" not in modes.spec(mode).options:
            continue
        try:
            modes.spec(mode).cache_factory().check_options(**options)
        except ValueError as error:
            raise CliError(f"--modes {mode}: {error}") from None
        if options.get("kv_keep", 0) > prompt:
            raise CliError(f"--kv-keep {options['kv_keep']} is above the {prompt} tokens of the shortest prompt this "
                           f"run compresses: expected at most {prompt}, or nothing is evicted")


def workload_settings(args: argparse.Namespace, config: PlainConfig) -> None:
    """args.lengths and args.workload (what kvbench.workloads builds) from --lengths, --prompt/--generate or
    --contexts (check_used has refused more than one of them); every length a cell's positions."""
    request, contexts = args.workload_name == REQUEST, args.workload_name == CONTEXTS
    if request:
        if args.prompt is None or args.generate is None:
            raise CliError("a request needs both --prompt P (tokens prefilled) and --generate N (tokens generated)")
        positions = args.prompt + args.generate - 1
        if positions > config.max_length:
            raise CliError(f"--prompt {args.prompt} + --generate {args.generate} holds {positions} positions, beyond "
                           f"max_length {config.max_length} of {model_named(args)}")
        args.lengths, args.workload = [positions], {"kind": "request", "prompt": args.prompt, "generate": args.generate}
    elif contexts:
        after = kinds.CONTEXT_WARMUP_STEPS + kinds.CONTEXT_TIMED_STEPS
        beyond = [c for c in args.contexts if c + after > config.max_length]
        if beyond:
            raise CliError(f"--contexts {beyond[0]}: {kinds.CONTEXT_WARMUP_STEPS} warm-up and "
                           f"{kinds.CONTEXT_TIMED_STEPS} timed steps after {beyond[0]} tokens need {beyond[0] + after} "
                           f"positions, beyond max_length {config.max_length} of {model_named(args)}")
        args.lengths = list(args.contexts)
        args.workload = {"kind": "contexts", "warmup_steps": kinds.CONTEXT_WARMUP_STEPS,
                         "timed_steps": kinds.CONTEXT_TIMED_STEPS}
    else:
        args.lengths, args.workload = list(args.lengths or timing.DEFAULT_LENGTHS), {"kind": "loop"}


def check_fits_in_memory(config: PlainConfig, protocol: Protocol, lengths: list[int], modes: list[str],
                         model: str = "preset 'seed'", parts: dict | None = None) -> None:
    """Refuse a run whose model, ids, logits and caches (or `parts`, estimated otherwise) cannot fit, before
    allocating any of them."""
    parts = parts or memory.estimate_run_bytes(config, protocol.batch, lengths, modes)
    try:
        needed, available = sum(parts.values()), memory.available_bytes()
    except ValueError as error:
        raise CliError(str(error)) from None
    if needed > available:
        detail = ", ".join(f"{name} {format_bytes(size)}" for name, size in parts.items())
        raise CliError(f"{model} ({kinds.parameters_text(kinds.parameter_count(config))} parameters, "
                       f"{format_bytes(kinds.weight_bytes(config))} of {config.dtype} weights): the run would need "
                       f"about {format_bytes(needed)} ({detail}), but {format_bytes(available)} of memory is available")


def save_record(result: dict, output: Path, force: bool) -> Path:
    """Write the record to `output`; if that fails, to a fallback place, and say where."""
    try:
        return record.write_record(result, output, force=force)
    except (OSError, ValueError) as error:
        reason = f"cannot write {output}: {getattr(error, 'strerror', None) or error}"
    for directory in (record.DEFAULT_RECORDS_DIR, Path(tempfile.gettempdir())):
        try:
            path = record.write_record(result, record.default_record_path(directory))
        except (OSError, ValueError):
            continue
        raise CliError(f"{reason}; the record was saved to {path} instead")
    sys.stdout.write(json.dumps(result, indent=1) + "\n")  # the last place left: nothing measured is lost
    raise CliError(f"{reason}, nor under {record.DEFAULT_RECORDS_DIR} or {tempfile.gettempdir()}; "
                   "the record was printed on stdout")


def interrupted_sentence(signal, outcome, lengths: list[int], modes: list[str], path: Path) -> str:
    name = signal.name if signal is not None else "SIGINT"
    planned = len(lengths) * len(modes)
    if not outcome.interrupted:
        return f"kvbench: {name} arrived while the record was saved; it is complete: {path}"
    return (f"kvbench: interrupted by {name}: the record keeps {len(outcome.repetitions)} repetitions "
            f"and {len(outcome.checks)} of {planned} checks, marked incomplete: {path}")


def failure_sentence(check: dict) -> str:
    where = f"{escape(check['mode'])} at length {check['length']}"
    if check.get("error"):
        return f"{where} raised {escape(check['error'])}; it was not timed"
    if check.get("reference_non_finite"):
        return (f"{where} cannot be judged: the full-prefix reference has {check['reference_non_finite']} "
                f"non-finite logits from position {check['first_reference_non_finite']} (overflow in "
                f"{check['dtype']}?); no timing of this run is a valid speedup")
    if check.get("non_finite"):
        return (f"{where} produced {check['non_finite']} non-finite logits from position "
                f"{check['first_divergent_position']}; its timings are not a valid speedup")
    return (f"{where} diverges from full-prefix logits at position {check['first_divergent_position']} "
            f"(max |diff| {check['max_abs_diff']:.3g} > atol {check['atol']:g} + rtol {check['rtol']:g}); "
            "its timings are not a valid speedup")
