"""Shared, seeded builders for the asv suites, and the hook asv runs once per commit.

The suites are thin wrappers: the model, the decode loops, the equivalence gate and
the paired timing protocol all come from kvbench. This module fixes the protocol
(batch 1, seed 0, one torch thread) and the grid:

- models: ``MODELS``, the seed's lab and the llama family's tiny preset (rotary positions,
  RMSNorm, SwiGLU, grouped-query attention), each a parameter, so both histories are tracked.
  A commit without a preset skips its cells. (Before 2026-12-02 the suites had no model
  parameter: asv starts the model-parameterised series afresh, under new versions.)
- modes: ``KNOWN_MODES`` then any newer kind in the decode module's ``MODES``. asv
  passes a benchmark process the *index* of its parameter combination, and the
  suites (always today's) run against every commit's kvbench, so the list must
  not shrink or reorder from one commit to the next: every kind kvbench has ever
  shipped is listed in ``KNOWN_MODES`` in the order it arrived, a kind a commit
  does not have is skipped there, and a kind only a newer commit has is picked up
  at the end. Anything a suite needs that older commits lack is imported where it
  is used, so their other benchmarks still run. Each import tries today's path first, then the flat
  module older commits have (``kvbench.workloads.decode``, then ``kvbench.workloads.decode``).
- lengths: ``KVBENCH_ASV_LENGTHS="64,256,1024"`` (read at import, so set it for
  the whole ``asv run``) replaces the default ``DEFAULT_LENGTHS``. Lengths are
  parameter values, so results at different lengths never mix.

``prepare`` is every suite's ``setup_cache``: one shared function, so asv runs it
once per commit and environment (in its own process, untimed). It saves the
environment capture beside asv's result file, runs the equivalence gate and opens the
commit's sampling budget.

The budget: ``KVBENCH_ASV_BUDGET`` seconds (default ``DEFAULT_BUDGET``) of precision-
targeted sampling for the whole commit, shared by every ``track_speedup`` parameter. Each
parameter runs in its own process, so the share left is kept in a small ledger file in the
setup_cache directory (every benchmark's working directory): a parameter may take what is
left divided by the parameters still to come, so one that stops early leaves its time to
the next, and however noisy the machine the commit's sampling never exceeds the budget by
more than the minimum rotations of its last parameters.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import math
import os
import sys
from pathlib import Path

from kvbench.cache import KINDS

try:  # the mode registry; a commit before it has no mode newer than KNOWN_MODES either
    from kvbench.modes import SPECS
except ImportError:
    SPECS = {}
from kvbench.model import DecoderConfig, build_model, preset_config

try:  # kvbench's packages by concern; a commit before them (asv runs today's suites on older commits) has flat modules
    from kvbench.measure.timing import Protocol, set_threads
    from kvbench.workloads.decode import MODES as KVBENCH_MODES
    from kvbench.workloads.decode import run_gate, token_ids
except ImportError:
    from kvbench.workloads.decode import MODES as KVBENCH_MODES
    from kvbench.workloads.decode import run_gate, token_ids
    from kvbench.measure.timing import Protocol, set_threads

LENGTHS_VARIABLE = "KVBENCH_ASV_LENGTHS"
DEFAULT_LENGTHS = (64, 256)
BUDGET_VARIABLE = "KVBENCH_ASV_BUDGET"
DEFAULT_BUDGET = 180.0  # seconds of track_speedup sampling per commit (docs/asv.md: what each run takes)
LEDGER = Path("kvbench-asv-budget.json")  # in the setup_cache directory, the benchmarks' working directory
KNOWN_MODES = ("full", "concat", "static", "paged", "quantized-int8", "quantized-int4", "window")  # never reorder
MODELS = ("seed", "llama-tiny")  # presets, never reordered: asv passes parameter indices
PROTOCOL = Protocol()  # the seed's protocol: batch 1, seed 0, one thread
WINDOW = 32  # before the mode registry: the window kind's model attends to the last 32 positions


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


def parse_budget(text: str | None) -> float:
    if text is None or not text.strip():
        return DEFAULT_BUDGET
    try:
        budget = float(text)
    except ValueError:
        raise ValueError(f"{BUDGET_VARIABLE} must be seconds, such as 240, got {text!r}") from None
    if not 0 < budget < float("inf"):
        raise ValueError(f"{BUDGET_VARIABLE} must be a positive number of seconds, got {text!r}")
    return budget


LENGTHS = parse_lengths(os.environ.get(LENGTHS_VARIABLE))
BUDGET = parse_budget(os.environ.get(BUDGET_VARIABLE))
# A kind that compresses its prompt (kvbench.cache.scored) evicts nothing in a decode loop, whose prompt is one
# token: asv would time a static cache under its name. docs/eviction.md times them after a compressed prompt.
MODES = KNOWN_MODES + tuple(m for m in KVBENCH_MODES if m not in KNOWN_MODES
                            and not getattr(SPECS.get(m), "compresses_prompt", False))
CACHED_MODES = MODES[1:]  # KNOWN_MODES starts with the baseline, full
KNOWN_LOSSY = ("quantized-int8", "quantized-int4")  # fixed like KNOWN_MODES: a commit without them skips them
LOSSY_MODES = KNOWN_LOSSY + tuple(m for m in CACHED_MODES if m not in KNOWN_LOSSY and m in KINDS
                                  and not getattr(SPECS.get(m), "exact", True))


def model_and_ids(model: str, mode: str, length: int):
    """(model, ids) for one cell, seeded; cheap enough for asv's per-sample setup."""
    set_threads(PROTOCOL.threads)  # before any torch work in this process
    if mode not in KVBENCH_MODES:
        raise NotImplementedError(f"mode {mode!r} does not exist at this commit")
    config = config_for(model, mode)
    if length > config.max_length:
        raise NotImplementedError(f"length {length} exceeds max_length {config.max_length}")
    return build_model(config, seed=PROTOCOL.seed), token_ids(config, PROTOCOL.batch, length, PROTOCOL.seed)


def asv_config(mode: str) -> dict:
    """The config overrides of the model a mode is timed on: its spec's (the window kind's model has a sliding
    window, and so has the full-prefix baseline it is gated against)."""
    if not SPECS:  # a commit before the mode registry: only the window kind had a model of its own
        return {"window": WINDOW} if mode == "window" else {}
    return dict(SPECS[mode].asv_config) if mode in SPECS else {}


def config_for(model: str, mode: str | None = None, overrides: dict | None = None) -> DecoderConfig:
    """The preset with a mode's asv overrides (or `overrides`). A preset this commit does not have is
    skipped (NotImplementedError)."""
    overrides = asv_config(mode) if overrides is None else overrides
    try:
        return preset_config(model, **overrides)
    except ValueError as error:
        raise NotImplementedError(f"model {model!r} at this commit: {error}") from None


def require_equivalent(gate: dict, model: str, mode: str, length: int) -> None:
    """asv stores bare numbers, so a mode that failed the gate is not timed at all: the benchmark
    fails (kvbench.workloads.decode.run_gate states the policy)."""
    if mode not in CACHED_MODES or mode not in KVBENCH_MODES:  # the baseline is the gate's reference
        return
    check = gate.get((model, mode, length))
    if check is None:
        raise RuntimeError(f"no equivalence check for {mode} at length {length} on {model}")
    if not check["passed"]:
        raise RuntimeError(f"{mode} at length {length} failed the equivalence gate: {check.get('error') or check}")


def drift(gate: dict, model: str, mode: str, length: int) -> dict:
    """A lossy kind's drift check from the gate; a failure in asv when it raised or is not a drift check."""
    check = gate.get((model, mode, length))
    if check is None or "error" in check or "kl_mean" not in check:
        raise RuntimeError(f"no drift check for {mode} at length {length}: {check}")
    return check


def note_speedup(model: str, mode: str, length: int, estimate, state, clock: dict | None = None, budget: dict | None = None) -> None:
    """Keep beside asv's number what asv cannot hold: its interval, why sampling stopped, the noise."""
    try:  # since the commit that brought track_speedup's sampling
        from kvbench.measure.telemetry import disturbances
    except ImportError:  # before kvbench's packages by concern
        from kvbench.measure.telemetry import disturbances

    stopped = state.lengths[length]
    reasons: dict[str, int] = {}
    disturbed = 0  # counted here, not with telemetry.tally: the suite also runs against older commits
    for kept in state.samples:
        found = disturbances(kept.seconds, kept.telemetry or {})
        disturbed += bool(found)
        for reason in found:
            reasons[reason] = reasons.get(reason, 0) + 1
    annotate("track_speedup", f"{model}@{mode}@{length}", {  # the parameters, joined by @
        "speedup": estimate.ratio, "low": estimate.low, "high": estimate.high, "half_width": estimate.half_width,
        "estimator": estimate.estimator, "interval": estimate.interval, "rotations": stopped.rotations,
        "stop": stopped.stop, "samples": len(state.samples),
        "disturbed": disturbed,
        "disturbances": reasons, "telemetry_unavailable": state.telemetry_unavailable,
        "telemetry_per_sample_seconds": state.telemetry_seconds, "precise": stopped.stop == "precise",
        "budget": budget or {}, "estimation": clock,
    })


def annotate(section: str, key: str, value: dict) -> None:
    """Keep `value` under capture[section][key] beside asv's result, where the commit's kvbench can."""
    asvtools = _asvtools()
    if asvtools is not None and hasattr(asvtools, "annotate_capture"):
        asvtools.annotate_capture(section, key, value)


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


@contextlib.contextmanager
def ledger(path: Path = LEDGER):
    """The commit's budget ledger, locked while it is read and updated: {"budget", "spent", "done"}."""
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        text = handle.read()
        entries = json.loads(text) if text.strip() else {"budget": BUDGET, "spent": 0.0, "done": []}
        yield entries
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(entries))


def allowance(key: str, parameters: int, path: Path = LEDGER) -> tuple[float, dict]:
    """Seconds this parameter may sample: what is left of the budget over the parameters still to come
    (this one included), and the ledger as it stood."""
    with ledger(path) as entries:
        left = max(entries["budget"] - entries["spent"], 0.0)
        remaining = max(parameters - len([done for done in entries["done"] if done != key]), 1)
        return left / remaining, dict(entries)


def spend(key: str, seconds: float, path: Path = LEDGER) -> None:
    with ledger(path) as entries:
        entries["spent"] += seconds
        entries["done"] = [*dict.fromkeys([*entries["done"], key])]


def round_to_interval(value: float, low: float, high: float) -> float:
    """`value` to the digits its interval supports: two significant digits of the half-width (3.0812 within
    ±0.12 is 3.08, within ±0.012 is 3.081), so asv shows no digits that the interval says are noise."""
    half = (high - low) / 2
    if not (math.isfinite(half) and half > 0):  # a degenerate interval says nothing: four significant digits
        return float(f"{value:.4g}")
    return round(value, 1 - math.floor(math.log10(half)))


def keep_interval(key: str, estimate, path: Path = LEDGER) -> None:
    """Leave track_speedup's interval in the commit's ledger for track_speedup_halfwidth, which asv runs next
    (benchmarks run by name within a round), in another process."""
    with ledger(path) as entries:
        entries.setdefault("intervals", {})[key] = {"speedup": estimate.ratio, "low": estimate.low,
                                                    "high": estimate.high, "half_width": estimate.half_width}


def kept_interval(key: str, path: Path = LEDGER) -> dict:
    with ledger(path) as entries:
        kept = entries.get("intervals", {}).get(key)
    if kept is None:  # asv shows a skip (n/a): there is no interval to report, not a failure
        raise NotImplementedError(f"no track_speedup interval for {key} in this asv run: run track_speedup with it")
    return kept


def prepare() -> dict:
    """Once per commit and environment: the capture, the budget ledger, then the gate for every cached cell.

    Returns {(model, mode, length): Equivalence dict}; an error in a mode becomes a failed
    check with the error, so one broken cache kind cannot cost the others.
    """
    set_threads(PROTOCOL.threads)  # the capture then records the threads the benchmarks use
    try:
        asvtools = _asvtools()
        if asvtools is not None:
            asvtools.capture_beside_results()
    except Exception as error:  # noqa: BLE001 - never let the capture cost the benchmarks
        print(f"kvbench: capture failed: {type(error).__name__}: {error}", file=sys.stderr)
    LEDGER.write_text(json.dumps({"budget": BUDGET, "spent": 0.0, "done": []}))  # a fresh budget per commit

    gate: dict = {}
    modes = [mode for mode in CACHED_MODES if mode in KVBENCH_MODES]
    groups: dict[tuple, list[str]] = {}  # modes by the model they are timed on (the window kind: a windowed one)
    for mode in modes:
        groups.setdefault(tuple(sorted(asv_config(mode).items())), []).append(mode)
    for name in MODELS:
        for overrides, group in groups.items():
            try:
                config = config_for(name, overrides=dict(overrides))
            except NotImplementedError:  # a preset this commit lacks: its cells are skipped
                continue
            lengths = [n for n in LENGTHS if n <= config.max_length]
            if not lengths:
                continue
            model = build_model(config, seed=PROTOCOL.seed)
            longest = token_ids(config, PROTOCOL.batch, max(lengths), PROTOCOL.seed)
            gate.update({(name, *key): check for key, check in run_gate(model, longest, lengths, group).items()})
    return gate


prepare.timeout = 900  # the gate at long KVBENCH_ASV_LENGTHS runs the full-prefix loop once


class Cells:
    """The shared shape of kvbench's suites: one benchmark per (model, mode, length) cell.

    asv runs ``prepare`` once per commit (the gate), then ``setup`` before each sample:
    it skips a cell this commit lacks, refuses one whose mode failed the gate, and
    builds the seeded model and ids, so each timed body is a single call.
    """

    params = (MODELS, MODES, LENGTHS)
    param_names = ("model", "mode", "length")
    setup_cache = staticmethod(prepare)
    timeout = 600

    def setup(self, gate, model, mode, length):
        require_equivalent(gate, model, mode, length)
        self.model, self.ids = model_and_ids(model, mode, length)
