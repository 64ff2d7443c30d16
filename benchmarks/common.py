"""Shared, seeded builders for the asv suites, and the hook asv runs once per commit.

The suites are thin wrappers: the model, the decode loops, the equivalence gate and
the paired timing protocol all come from kvbench. This module fixes the workload
(the seed's lab model, batch 1, seed 0, one torch thread) and the grid:

- modes: ``KNOWN_MODES`` then any newer kind in ``kvbench.decode.MODES``. asv
  passes a benchmark process the *index* of its parameter combination, and the
  suites (always today's) run against every commit's kvbench, so the list must
  not shrink or reorder from one commit to the next: a kind a commit does not
  have is skipped there, and a new kind is picked up at the end.
- lengths: ``KVBENCH_ASV_LENGTHS="64,256,1024"`` (read at import, so set it for
  the whole ``asv run``) replaces the default ``DEFAULT_LENGTHS``. Lengths are
  parameter values, so results at different lengths never mix.

``prepare`` is every suite's ``setup_cache``: one shared function, so asv runs it
once per commit and environment (in its own process, untimed). It saves the
environment capture beside asv's result file and runs the equivalence gate.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import sys
from pathlib import Path

from kvbench.decode import FULL, MODES as KVBENCH_MODES, check_equivalence, decode_full, token_ids
from kvbench.model import DecoderConfig, build_model
from kvbench.timing import set_threads

LENGTHS_VARIABLE = "KVBENCH_ASV_LENGTHS"
DEFAULT_LENGTHS = (64, 256)
KNOWN_MODES = ("full", "concat", "static", "paged")
SEED = 0
BATCH = 1
THREADS = 1


def parse_lengths(text: str | None) -> tuple[int, ...]:
    if text is None or not text.strip():
        return DEFAULT_LENGTHS
    try:
        lengths = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"{LENGTHS_VARIABLE} must be comma-separated positive integers, got {text!r}") from None
    if any(n < 1 for n in lengths) or len(set(lengths)) != len(lengths):
        raise ValueError(f"{LENGTHS_VARIABLE} must be distinct positive integers, got {text!r}")
    return lengths


LENGTHS = parse_lengths(os.environ.get(LENGTHS_VARIABLE))
MODES = KNOWN_MODES + tuple(m for m in KVBENCH_MODES if m not in KNOWN_MODES)
CACHED_MODES = tuple(m for m in MODES if m != FULL)


def workload(mode: str, length: int):
    """(model, ids) for one cell, seeded; cheap enough for asv's per-sample setup."""
    set_threads(THREADS)  # before any torch work in this process
    if mode not in KVBENCH_MODES:
        raise NotImplementedError(f"mode {mode!r} does not exist at this commit")
    config = DecoderConfig()
    if length > config.max_length:
        raise NotImplementedError(f"length {length} exceeds max_length {config.max_length}")
    return build_model(config, seed=SEED), token_ids(config, BATCH, length, SEED)


def require_equivalent(gate: dict, mode: str, length: int) -> None:
    """A mode that fails the gate is not timed as if it were correct: the benchmark fails."""
    if mode == FULL or mode not in KVBENCH_MODES:
        return
    check = gate.get((mode, length))
    if check is None:
        raise RuntimeError(f"no equivalence check for {mode} at length {length}")
    if not check["passed"]:
        raise RuntimeError(f"{mode} at length {length} failed the equivalence gate: {check.get('error') or check}")


def median_ratio(samples, numerator: str, denominator: str) -> float:
    """median seconds of `numerator` over median seconds of `denominator` (kvbench's speedup)."""
    seconds = {numerator: [], denominator: []}
    for sample in samples:
        seconds[sample.mode].append(sample.seconds)
    return statistics.median(seconds[numerator]) / statistics.median(seconds[denominator])


def _asvtools():
    """kvbench.asvtools of the benchmarked commit, or of the checkout running asv for
    commits that predate it (asv only exports ASV_CONF_DIR to environments it builds)."""
    try:
        from kvbench import asvtools
    except ImportError:
        path = Path(os.environ.get("ASV_CONF_DIR", ".")) / "kvbench" / "asvtools.py"
        spec = importlib.util.spec_from_file_location("kvbench_asvtools_from_checkout", path)
        if spec is None or not path.is_file():
            return None
        asvtools = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(asvtools)
    return asvtools


def prepare() -> dict:
    """Once per commit and environment: the capture, then the gate for every cached cell.

    Returns {(mode, length): Equivalence dict}; an error in a mode becomes a failed
    check with the error, so one broken cache kind cannot cost the others.
    """
    set_threads(THREADS)  # the capture then records the threads the benchmarks use
    try:
        asvtools = _asvtools()
        if asvtools is not None:
            asvtools.capture_beside_results()
    except Exception as error:  # noqa: BLE001 - never let the capture cost the benchmarks
        print(f"kvbench: capture failed: {type(error).__name__}: {error}", file=sys.stderr)

    config = DecoderConfig()
    model = build_model(config, seed=SEED)
    lengths = [n for n in LENGTHS if n <= config.max_length]
    gate: dict = {}
    if not lengths:
        return gate
    longest = token_ids(config, BATCH, max(lengths), SEED)
    reference = decode_full(model, longest, keep_logits=True)
    for length in lengths:
        for mode in CACHED_MODES:
            if mode not in KVBENCH_MODES:
                continue
            try:
                result = check_equivalence(model, longest[:, :length], [mode], reference=reference)[mode]
                gate[(mode, length)] = result.to_dict()
            except Exception as error:  # noqa: BLE001
                gate[(mode, length)] = {"mode": mode, "length": length, "passed": False,
                                        "error": f"{type(error).__name__}: {error}"}
    return gate


prepare.timeout = 900  # the gate at long KVBENCH_ASV_LENGTHS runs the full-prefix loop once
