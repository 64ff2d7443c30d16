"""`kvbench run --trace ...`: many requests under one KV budget (kvbench.serving), and `kvbench report` of its
record. Every option, the trace and the budget are checked torch-free, before anything is measured."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvbench import files, plugins, record
from kvbench.measure import memory, timing
from kvbench.serving import admission, sharing, trace
from kvbench.cli.commands import (
    check_compare_arguments,
    check_output,
    check_report_options,
    cmd_compare,
    cmd_report,
    cmd_show,
    deliver_report,
    load_view,
    plot_link,
    print_layout,
    same_file,
)
from kvbench.cli.device import checked_device, settle
from kvbench.cli.goodput import check_sweep, run_planned
from kvbench.cli.options import fraction
from kvbench.cli.parser import CliError, did_you_mean
from kvbench.cli.progress import stage
from kvbench.cli.real_model import load_served, model_config, model_named
from kvbench.cli.serving_options import DEFAULT_KINDS, DEFAULT_REPEATS, DEFAULT_BUDGET_REQUESTS
from kvbench.cli.usage import REPLAY, SERVING, cache_options, check_read, option_readers
from kvbench.modes import CONTROL, PAGES, SPECS
from kvbench.record.serving import assemble

PEER_DEVICES = ("cpu",)  # where the serving peer (kvbench.serving.peer) has run: its greedy paths are made on the host
from kvbench.report.format import format_bytes, render_plain, stdout_console

FILE_WIDTH = 220  # a text report written to a file: wide enough that no column of the serving table is dropped

def cancel_spec(text: str | None) -> dict:
    if text is None:
        return {}
    share, _, after = text.partition(":")
    try:
        after = int(after)  # kvbench.trace says what a count of 0 or less is
    except ValueError:
        raise CliError(f"--cancel must be F:K (a fraction of the requests, then output tokens), got {text!r}") from None
    try:
        return {"cancel_fraction": fraction(share), "cancel_after": after}
    except argparse.ArgumentTypeError:
        raise CliError(f"--cancel {text}: F, the fraction of the requests cancelled, must be in (0, 1), "
                       f"got {share!r}") from None


def check_cancel(text: str, served: trace.Trace) -> None:
    """A drawn trace cancels only requests whose output is longer than K (kvbench.trace.make_trace): a K that no
    output exceeds would cancel none of them."""
    after, longest = cancel_spec(text)["cancel_after"], max(request.output for request in served.requests)
    if after >= longest:
        raise CliError(f"--cancel {text}: K must be below a request's output, and {after} tokens is at or beyond "
                       f"every one (the longest is {longest}): no request would be cancelled")


def load_trace(args: argparse.Namespace, config) -> trace.Trace:
    """The trace drawn from the options, or read from a file (a trace, or the trace of a serving record)."""
    name = args.trace.partition(":")[0]
    try:
        if name in trace.SHAPES:  # prompts that reuse prefixes: the shape says every request
            return sharing.make_shaped(sharing.parse_shape(args.trace), args.seed, config.max_length)
        if name in trace.LENGTHS:
            spec = {**trace.parse_lengths(args.trace), **trace.parse_arrivals(args.arrivals), "requests": args.requests,
                    **cancel_spec(args.cancel)}
            if args.prefix:
                spec.update(prefix=args.prefix, prefix_fraction=args.prefix_fraction)
            return trace.make_trace(spec, args.seed, config.max_length)
        data = files.read_json(args.trace, "trace file")
        if isinstance(data, dict) and isinstance(data.get("serving"), dict):  # a serving record (kvbench.record/4)
            data = data["serving"]
        return trace.trace_from_dict(data.get("trace", data) if isinstance(data, dict) else data, config.max_length)
    except (ValueError, OSError) as error:
        raise CliError(f"--trace {args.trace}: {getattr(error, 'strerror', None) or error}") from None


def serving_settings(args: argparse.Namespace, config, kinds: list[str]) -> dict[str, dict]:
    settings = {}
    for kind in kinds:
        if admission.holds_pages(kind):  # the peer's pages too: block_size positions, shared only if asked
            settings[kind] = {"block_size": args.block_size, "share_prefix": args.share_prefix}
        else:
            options = cache_options(args, kind)
            settings[kind] = {"policy": args.reserve, **({"options": options} if options else {})}
        settings[kind]["max_batched_tokens"] = args.max_batched_tokens  # the scheduler's, the same for every kind
    for kind in kinds if args.prefix_cache else ():  # check_prefix_cache's twins: the kind, with its prefix cache
        if kind.endswith(PREFIX_SUFFIX):
            base = kind[: -len(PREFIX_SUFFIX)]
            settings[kind] = {**settings[base], "kind": base, "prefix_cache": True, "order": args.queue_order}
    return settings


PREFIX_SUFFIX = "-prefix"  # the serving mode of a kind replayed with its prefix cache: paged-prefix


def check_prefix_cache(args: argparse.Namespace, kinds: list[str], served: trace.Trace) -> list[str]:
    """The run's kinds: with --prefix-cache, each followed by its twin replayed with a prefix cache (paged alone by
    default), every one a kind that can keep one; a trace whose groups or turns the holder or the peer cannot
    replay is refused."""
    structured = any(request.parent is not None or request.group for request in served.requests)
    if args.share_prefix and structured:
        raise CliError("--share-prefix forks one prefix's holder: this trace has several prefixes or conversations "
                       "(--prefix-cache shares them)")
    if admission.PEER in kinds and structured:
        raise CliError(f"--modes {admission.PEER}: the peer generates its own outputs, and this trace's turns carry "
                       "drawn outputs in their histories")
    if not args.prefix_cache:
        return kinds
    kinds = kinds if "--modes" in args.given else [kind for kind in kinds if kind in SPECS and
                                                   SPECS[kind].serving == PAGES]  # the kinds that keep one
    lacking = [kind for kind in kinds if kind not in SPECS or SPECS[kind].serving != PAGES]
    if lacking:
        raise CliError(f"--prefix-cache: kind {lacking[0]} keeps no prefix cache (the paged kinds do, of one "
                       f"shared block pool)")
    if args.share_prefix:
        raise CliError("--prefix-cache and --share-prefix: the prefix cache shares prefixes itself, give one")
    return [name for kind in kinds for name in (kind, kind + PREFIX_SUFFIX)]


def check_peer(config, served: trace.Trace) -> None:
    """The peer runs transformers' model of the same weights: the llama family, the pinned transformers, and
    arrivals it can be handed in order (all, poisson)."""
    from kvbench.models import hf

    try:
        hf.hf_architecture(config)
        hf.require_transformers()
    except ValueError as error:
        raise CliError(f"--modes {admission.PEER}: {error}") from None
    if served.arrivals == "closed":
        raise CliError(f"--modes {admission.PEER}: the peer replays arrivals all or poisson, got closed-loop clients")


SETTINGS_READ = {"--block-size": "block_size", "--reserve": "policy"}  # usage.KIND_OPTIONS: the setting each becomes


def check_budget_fits(given: str | None, budget: int, config) -> None:
    """A kind may allocate the whole budget (paged's pool does, at once): with the weights it must fit in the memory
    this process may take, or torch fails later, after the trace is drawn and the model built."""
    weights = memory.weight_build_bytes(config)
    try:
        available = memory.available_bytes()
    except ValueError as error:
        raise CliError(str(error)) from None
    if budget + weights > available:
        named = f"--kv-budget {given}" if given is not None else \
            f"the default --kv-budget (static's need for the trace's {DEFAULT_BUDGET_REQUESTS} largest requests)"
        caches = format_bytes(budget) if budget < 1 << 40 else f"{budget:.3g} bytes"  # not 10^21 GiB for 1e30
        raise CliError(f"{named}: {caches} of KV caches and {format_bytes(weights)} of weights need more than the "
                       f"{format_bytes(available)} of memory available")


def check_serve(args: argparse.Namespace) -> tuple:
    """check_serving, then the paths: the record's and --save-trace's, never the same file, nor the trace file
    replayed. Returns check_serving's values and the record's path."""
    checked = check_serving(args)
    output = args.output or record.default_record_path()
    replayed = Path(args.trace) if args.workload_name == REPLAY and args.trace.partition(":")[0] not in \
        trace.SHAPES else None
    if args.save_trace is not None and same_file(args.save_trace, output):
        raise CliError(f"--save-trace and --output both name {args.save_trace}: the trace and the record need "
                       "different files")
    check_output(output, args.force, reading=replayed)
    if args.save_trace is not None:
        check_output(args.save_trace, args.force, "--save-trace", reading=replayed)
    return (*checked, output)


def check_serving(args: argparse.Namespace):
    """Everything a serving run needs, torch-free but for a --plugin file's kinds: (config, kinds, trace, budget,
    settings, protocol, minimum, the sweep's plan or None)."""
    args.plugins = [plugins.load_plugin(path) for path in args.plugin]  # before the kinds are checked
    config = model_config(args)
    kinds = list(args.modes) if "--modes" in args.given else list(DEFAULT_KINDS)  # run's default modes are not its
    served_kinds = admission.serving_kinds()  # a plugin's kind too, when its spec says how it is served
    unknown = [kind for kind in kinds if kind not in served_kinds]
    if unknown:
        raise CliError(f"--modes {unknown[0]}: a serving run takes kinds {list(served_kinds)}"
                       f"{did_you_mean(unknown[0], served_kinds)}")
    if config.window is not None:
        raise CliError(f"--trace: a serving run needs full attention; {model_named(args)} slides a window")
    if args.share_prefix and not any(kind in SPECS and SPECS[kind].serving == PAGES for kind in kinds):
        raise CliError("--share-prefix forks paged blocks: add paged to --modes")
    served = load_trace(args, config)
    kinds = check_prefix_cache(args, kinds, served)
    if args.share_prefix and not any(request.prefix for request in served.requests):
        raise CliError("--share-prefix: no request of the trace carries a shared prefix to share"
                       + (" (--prefix S draws one)" if args.workload_name == SERVING else ""))
    if args.cancel is not None:
        check_cancel(args.cancel, served)
    if admission.PEER in kinds:
        check_peer(config, served)
    settings = serving_settings(args, config, kinds)
    check_read(args.given, {**option_readers(kinds), **{option: [kind for kind in kinds if setting in settings[kind]]
                                                        for option, setting in SETTINGS_READ.items()}}, kinds)
    minimum = {kind: admission.minimum_budget(settings[kind].get("kind", kind), config, served, args.reserve, args.block_size,
                                              settings[kind].get("options"), args.share_prefix,
                                              args.max_batched_tokens) for kind in kinds}
    if args.kv_budget is None:
        largest = sorted(served.requests, key=lambda r: r.positions)[-DEFAULT_BUDGET_REQUESTS:]
        budget = sum(admission.reservation("static", config, admission.capacity(r, config, args.reserve))
                     for r in largest)
    else:
        try:
            budget = admission.parse_budget(args.kv_budget, memory.available_bytes())
        except ValueError as error:
            raise CliError(str(error)) from None
    short = [kind for kind in kinds if budget < minimum[kind]]
    if short:
        raise CliError(f"--kv-budget {budget} bytes is below one request's minimum for {short[0]}: "
                       f"{minimum[short[0]]} bytes ({format_bytes(minimum[short[0]])}), its largest request alone")
    check_budget_fits(args.kv_budget, budget, config)
    repeats = args.repeats if args.repeats is not None else DEFAULT_REPEATS
    try:
        protocol = timing.Protocol(repeats=repeats, precision=args.precision, max_seconds=args.max_seconds or 75.0,
                                   max_repeats=args.max_repeats or 1001, order=args.order, cpu=args.cpu,
                                   control=args.control, warmup=0, seed=args.seed, threads=args.threads,
                                   between_run=args.between_run, device=checked_device(args))
        timing.control_mode(protocol.control, [kind for kind in kinds if kind in SPECS])  # nor peer nor twin
    except ValueError as error:
        raise CliError(str(error)) from None
    return config, kinds, served, budget, settings, protocol, minimum, check_sweep(args, kinds, served)


def cmd_serve(args: argparse.Namespace, checked: tuple) -> int:
    """A serving run, once check_serve has passed (`checked`: what it returned)."""
    config, kinds, served, budget, settings, protocol, minimum, plan, output = checked
    if args.save_trace is not None:
        files.write_json_atomic(served.to_dict(), args.save_trace, args.force)
    from kvbench.measure import capture
    from kvbench.serving import replay as serving
    from rich.console import Console

    protocol, _, in_effect = settle(args, protocol)  # a serving record names the device in its protocol
    if protocol.device not in PEER_DEVICES and admission.PEER in kinds:
        raise CliError(f"--device {protocol.device}: the serving peer ({admission.PEER}) runs transformers' "
                       "continuous batching on the CPU only here; leave it out of --modes")
    environment = capture.collect_environment()
    model, text, sections = load_served(args, config, protocol.seed, Console(stderr=True), protocol.device)
    from kvbench.measure.sampling import Sampling

    state, checks, interrupted = Sampling(), {}, False
    try:
        with stage(Console(stderr=True), "serving", disabled=args.no_progress) as update:
            outcome = serving.serve(model, served, kinds, budget, settings, protocol, state=state, checks=checks,
                                    text=text,
                                    on_progress=lambda done, total, what: update(  # replays are timed: no ticking
                                        done, total, what, timed=what.startswith(serving.REPLAY_STAGE)))
    except KeyboardInterrupt:  # keep what was measured, as every run does
        if not checks:
            raise
        interrupted, outcome = True, {"checks": checks, "control": interrupted_control(protocol, kinds, checks, state),
                                      "sampling": state}
    samples = [kept.to_dict() for kept in outcome["sampling"].samples]
    sweep = None
    if plan is not None and not interrupted:  # after the sampled replays, whose times estimate the sweep's
        with stage(Console(stderr=True), "sweep", disabled=args.no_progress) as update:
            sweep = run_planned(plan, model, served, budget, settings, outcome["checks"], samples,
                                on_progress=lambda done, total, what: update(done, total, what, timed=True), text=text)
    # the one record every workload writes (kvbench.record.serving), validated on write as every record is
    result = record.validate_record(assemble(
        complete=not interrupted, created_utc=record.utc_now(), command=["kvbench", *args.argv], preset=args.model_name,
        config=config.to_dict(), trace=served.to_dict(), kinds=kinds, settings=settings,
        budget={"bytes": budget, "given": args.kv_budget, "reserve": args.reserve, "minimum": minimum},
        protocol=protocol.describe(in_effect), environment=environment, checks=outcome["checks"],
        control=outcome["control"], outputs=outputs_of(outcome.get("continuations"), kinds, text is not None),
        samples=samples, sampling={length: state.to_dict() for length, state in outcome["sampling"].lengths.items()},
        sweep=sweep, sections=sections))
    path = record.write_record(result, output, args.force)
    print_serving(record.RecordView(result, str(path)), args.wide)
    stdout_console().print(f"record: {path}")
    failed = [kind for kind, check in outcome["checks"].items() if not check["passed"]]
    if interrupted:
        print(f"kvbench: interrupted: the record keeps {len(result['repetitions'])} replays and "
              f"{len(checks)} of {len(kinds)} checks, marked incomplete: {path}", file=sys.stderr)
        return 130
    if sweep is not None and sweep["stopped"]:
        print(f"kvbench: {'--rate-sweep' if plan.rates else '--capacity'}: {sweep['stopped']}; the record keeps "
              f"what was measured: {path}", file=sys.stderr)
        return 2
    return 1 if failed else 0


def interrupted_control(protocol: timing.Protocol, kinds: list[str], checks: dict, state) -> str | None:
    """The kind the A/A control's kept replays repeated, as serve() chose it once every gate was passed (None
    before any was kept): without it an interrupted record's control replays would name no kind."""
    if not any(kept.mode == CONTROL for kept in state.samples):
        return None
    return timing.control_mode(protocol.control, [kind for kind in kinds if kind in SPECS
                                                  and checks[kind]["passed"]])


def outputs_of(continuations: dict | None, kinds: list[str], text: bool = False) -> dict:
    """What the requests' output ids were: random, the corpus's next tokens (`text`), or (with the peer) the full
    path's greedy continuation."""
    if continuations is None and admission.PEER in kinds:  # interrupted before serve() handed them back
        return {"source": "the full path's greedy continuation of each prompt (kvbench.peer); not kept: interrupted"}
    from kvbench.serving.tokens import describe_source

    return describe_source(continuations, text)


def print_serving(view: record.RecordView, wide: bool = False) -> None:
    from kvbench.report.record import serving as serving_report

    console = stdout_console(wide)
    for item in serving_report.terminal_renderables(view, None if wide else console.width):
        console.print(item)


def cmd_show_any(args: argparse.Namespace) -> int:
    """`kvbench show`: the record through its RecordView; a serving one shows its tables."""
    view = load_view(args.record)
    if view.serving is None:
        return cmd_show(args, view)
    print_serving(view, args.wide)
    return 0


def cmd_report_any(args: argparse.Namespace) -> int:
    """`kvbench report`: the record through its RecordView; a serving one has its own tables and plot."""
    check_report_options(args)  # before the record is read, whatever its workload
    view = load_view(args.record)
    return cmd_report(args, view) if view.serving is None else cmd_report_serving(args, view)


def cmd_report_serving(args: argparse.Namespace, result: record.RecordView) -> int:
    """A serving record's report in the layout asked (its tables as sections, as a loop record's), and --plot its
    rate sweep's throughput-latency curve, or without a sweep its memory over time."""
    from kvbench.report.record import serving as serving_report

    if args.plot is not None:
        files.write_bytes_atomic(args.plot, serving_report.report_plot(result, args.plot.suffix.lower()), args.force)
    if args.format == "text" and args.output is None:
        print_serving(result, args.wide)
        return 0
    if args.format == "text":  # a file: every column
        content = render_plain(serving_report.terminal_renderables(result), FILE_WIDTH)
    elif args.format == "markdown":
        content = serving_report.render_markdown(result, str(args.record), plot_link(args))
    else:
        content = serving_report.render_html(result, str(args.record))
    return deliver_report(args, content)


def cmd_compare_any(args: argparse.Namespace) -> int:
    """`kvbench compare`: two serving records line their kinds' measures up (kvbench.report.comparison.serving); any
    other records go to cmd_compare."""
    check_compare_arguments(args)
    views = [load_view(path) for path in (args.old, args.new, *args.more)]  # each read once, or one line, exit 2
    if all(view.serving is None for view in views):
        return cmd_compare(args, views)
    return cmd_compare_serving(args, views)


def cmd_compare_serving(args: argparse.Namespace, views: list[record.RecordView]) -> int:
    from kvbench.report.comparison import serving as serving_compare

    if any(view.serving is None for view in views):
        other = next(view.source for view in views if view.serving is None)
        raise CliError(f"{other} is not a serving record: compare a serving record with another serving record")
    if args.more or args.across_machines:
        raise CliError("compare of serving records takes OLD and NEW (no --across-machines)")
    mapping = dict(args.pair)
    old, new = (serving_compare.replayed(view) for view in views)
    problem = serving_compare.same_trace_problem(old, new)
    if problem and not args.force:
        raise CliError(f"{args.old} and {args.new} replayed {problem}: their measures do not compare; pass --force "
                       "to line them up anyway")
    comparison = serving_compare.compare_serving(old, new, factor=args.factor, alpha=args.alpha, mapping=mapping)
    print_layout(args.format, lambda: serving_compare.render_markdown(comparison),
                 lambda: serving_compare.compare_renderables(comparison, stdout_console().width))
    if args.fail_on_regression and comparison.regressions:
        worst = comparison.regressions[0]
        print(f"kvbench: regression: {len(comparison.regressions)} measure(s) worse beyond their MDE and "
              f"{args.factor:g}x; first {worst.kind} {worst.measure.key}: {worst.change.ratio:.2f}x "
              f"[{worst.change.low:.2f}, {worst.change.high:.2f}]", file=sys.stderr)
        return 1
    return 0
