"""Which of `kvbench run`'s workloads uses each of its options, and the check that refuses an option the chosen
workload does not use (or that does nothing without another), before anything is built: a run never measures
something other than what its command line, which the record repeats, says."""

from __future__ import annotations

import argparse

from kvbench import modes
from kvbench.cli.options import run_parser
from kvbench.cli.parser import CliError
from kvbench.kinds import DEFAULT_EVICT_RATIO
from kvbench.serving.trace import LENGTHS as TRACE_LENGTHS

# Every option of `run` (kvbench.cli.options, .serving_options) has its row in USED_BY: tests/test_cli.py crosses
# each option with each workload, so a new option cannot be left out.
LOOP, REQUEST, CONTEXTS, SERVING, REPLAY = "loop", "request", "contexts", "serving", "replay"
WORKLOADS = {LOOP: "--lengths, the default", REQUEST: "--prompt/--generate", CONTEXTS: "--contexts",
             SERVING: "--trace LENGTHS", REPLAY: "--trace FILE or SHAPE"}  # each workload: the options that choose it
TIMED = (LOOP, REQUEST, CONTEXTS)  # one model's modes timed in rotations
SERVED = (SERVING, REPLAY)  # a trace of requests under one KV budget, drawn or saved
EVERY = TIMED + SERVED
CHOOSERS = {"--lengths": LOOP, "--prompt": REQUEST, "--generate": REQUEST, "--contexts": CONTEXTS, "--trace": SERVING}
USED_BY = {
    "--lengths": (LOOP,), "--prompt": (REQUEST,), "--generate": (REQUEST,), "--contexts": (CONTEXTS,),
    "--trace": SERVED, "--modes": EVERY,
    "--plugin": EVERY,  # a serving run takes a plugin's kind too when its spec says how it is held (ModeSpec.serving)
    "--repeats": EVERY, "--precision": EVERY,
    "--min-repeats": TIMED,  # a serving run's minimum under --precision is --repeats
    "--max-repeats": EVERY, "--max-seconds": EVERY, "--between-run": EVERY, "--order": EVERY, "--cpu": EVERY,
    "--control": EVERY,
    "--warmup": TIMED,  # a serving run's untimed pass is its gate, one replay of the trace per kind
    "--batch": TIMED,  # a serving run's batch is whichever requests the scheduler admits
    "--seed": EVERY, "--threads": EVERY, "--device": EVERY,
    "--quality": TIMED,  # with --model or --gguf (NEEDS), which a serving run has not
    "--needle": TIMED, "--needle-depths": TIMED, "--needle-ratios": TIMED,  # the same, and with --needle
    "--per-step": (LOOP,),  # a request or contexts run times every step itself
    "--output": EVERY, "--force": EVERY,
    "--no-progress": EVERY,  # every workload draws its long stages (kvbench.cli.progress.stage) on stderr
    "--wide": EVERY,
    # a saved trace carries its own requests, arrivals, prefixes and cancellations
    "--requests": (SERVING,), "--arrivals": (SERVING,), "--prefix": (SERVING,), "--prefix-fraction": (SERVING,),
    "--cancel": (SERVING,),
    "--share-prefix": SERVED, "--kv-budget": SERVED, "--reserve": SERVED, "--block-size": SERVED,
    "--max-batched-tokens": SERVED, "--save-trace": SERVED, "--prefix-cache": SERVED, "--queue-order": SERVED,
    "--rate-sweep": SERVED, "--capacity": SERVED, "--slo": SERVED,
    "--preset": EVERY, "--width": EVERY, "--heads": EVERY, "--kv-heads": EVERY, "--layers": EVERY,
    "--vocab-size": EVERY, "--max-length": EVERY, "--dtype": EVERY,
    "--window": TIMED, "--sinks": TIMED, "--window-pattern": TIMED,  # the scheduler's batches need full attention
    "--model": EVERY, "--gguf": EVERY,  # a served trained model's requests are runs of the corpus
    "--quant-group": EVERY, "--quant-residual": EVERY,  # and only where a quantized kind runs (KIND_OPTIONS)
    "--evict-ratio": EVERY, "--kv-keep": EVERY, "--evict-every": EVERY,  # and only where an evicting kind runs
}
NEEDS = {  # option -> (the workloads where it does something only beside one of these options, those, why)
    "--prefix-fraction": ((SERVING,), ("--prefix",), "it is the share of requests that carry the prefix"),
    "--max-repeats": (SERVED, ("--precision",), "without a precision target a serving run replays exactly "
                                                "--repeats rotations"),
    "--max-seconds": (SERVED, ("--precision", "--rate-sweep", "--capacity"), "without a precision target a "
                      "serving run replays exactly --repeats rotations, and without a sweep it has none to bound"),
    "--slo": (SERVED, ("--rate-sweep", "--capacity"), "its targets judge a sweep's replays"),
    "--queue-order": (SERVED, ("--prefix-cache",), "it orders the queue of the kinds that keep a prefix cache"),
    "--quality": (TIMED, ("--model", "--gguf"), "it measures a trained model on text"),
    "--needle": (TIMED, ("--model", "--gguf"), "it measures a trained model's retrieval"),
    "--needle-depths": (TIMED, ("--needle",), "they say where --needle hides the needle"),
    "--needle-ratios": (TIMED, ("--needle",), "they are the evict_ratio values --needle runs each kind at"),
}
# The options that become a cache's keyword options (ModeSpec.options), with the argument each is read from: a kind
# whose spec takes the keyword gets the option's value, whatever its name.
CACHE_OPTIONS = {"--quant-group": ("group_size", "quant_group"), "--quant-residual": ("residual", "quant_residual"),
                 "--evict-ratio": ("evict_ratio", "evict_ratio"), "--kv-keep": ("kv_keep", "kv_keep"),
                 "--evict-every": ("evict_every", "evict_every")}
KIND_OPTIONS = {  # options only some kinds read (kvbench.cli.run and .serve tell which do): who reads each
    "--quant-group": "the quantized kinds", "--quant-residual": "the quantized kinds",
    "--block-size": "paged and hf-continuous", "--reserve": "static, the quantized and the scored kinds",
    "--evict-ratio": "the evicting kinds", "--kv-keep": "the evicting kinds", "--evict-every": "the evicting kinds",
}


def given_options(argv: list[str]) -> list[str]:
    """The options `kvbench run ARGV` gives, in the parser's order. Told apart from the defaults by parsing again
    with none, not by comparing values: --warmup 1 is the default's value, and given to a serving run still asks
    for a warm-up that it does not do."""
    parser = run_parser()
    for action in parser.actions():
        action.default = argparse.SUPPRESS
    given = vars(parser.parse_args(argv))
    return [action.option_strings[-1] for action in parser.actions() if action.option_strings and action.dest in given]


def workload_list(workloads) -> str:
    names = [name for name in WORKLOADS if name in workloads]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def check_used(given: list[str], trace: str | None) -> str:
    """The workload the given options choose, once none of them is one it does not use; a refusal is one line
    naming the options. Values, paths and memory are the next checks' (kvbench.cli.run.check_run)."""
    chosen: dict[str, list[str]] = {}
    for option in given:
        if option in CHOOSERS:
            chosen.setdefault(CHOOSERS[option], []).append(option)
    if len(chosen) > 1:
        raise CliError(f"{' and '.join('/'.join(options) for options in chosen.values())} choose different "
                       "workloads: give one of them")
    workload = next(iter(chosen), LOOP)
    if workload == SERVING and trace.partition(":")[0] not in TRACE_LENGTHS:
        workload = REPLAY
    unused = [option for option in given if workload not in USED_BY[option]]
    if len(unused) == 1:
        raise CliError(f"{unused[0]} is not used by a {workload} run ({WORKLOADS[workload]}), only by "
                       f"{workload_list(USED_BY[unused[0]])} runs")
    if unused:
        raise CliError(f"{', '.join(unused)} are not used by a {workload} run ({WORKLOADS[workload]}): leave them out")
    for option in given:
        workloads, needed, why = NEEDS.get(option, ((), (), ""))
        if workload in workloads and not set(needed) & set(given):
            raise CliError(f"{option} needs {' or '.join(needed)} in a {workload} run: {why}")
    return workload


def takes(kind: str) -> tuple[str, ...]:
    """The cache options a kind's spec takes (none for a kind the registry does not hold: the serving peer)."""
    found = modes.SPECS.get(kind)
    return found.options if found is not None else ()


def cache_options(args: argparse.Namespace, kind: str) -> dict:
    """The keyword options the command line gives `kind`'s cache: those of CACHE_OPTIONS its spec takes."""
    given = {keyword: getattr(args, dest) for keyword, dest in CACHE_OPTIONS.values() if keyword in takes(kind)}
    if "evict_ratio" in given and given["evict_ratio"] is None and given.get("kv_keep") is None:
        given["evict_ratio"] = DEFAULT_EVICT_RATIO  # the record names the ratio a kind ran at, given or not
    return {keyword: value for keyword, value in given.items() if value is not None}


def option_readers(kinds: list[str]) -> dict[str, list[str]]:
    """Each cache option's readers among `kinds` (check_read's `readers`)."""
    return {option: [kind for kind in kinds if keyword in takes(kind)] for option, (keyword, _) in CACHE_OPTIONS.items()}


def check_read(given: list[str], readers: dict[str, list[str]], kinds: list[str]) -> None:
    """Refuse an option of KIND_OPTIONS that none of the run's kinds reads (`readers`: option -> the kinds that do)."""
    for option, kinds_reading in readers.items():
        if option in given and not kinds_reading:
            raise CliError(f"{option} is read by {KIND_OPTIONS[option]} only, and --modes {','.join(kinds)} runs "
                           "none of them")
