"""The steady decode step at a context, per mode, the compiled modes among them (docs/compiled.md).

One sample is one step of ``kvbench run --contexts``'s workload (``kvbench.workloads.workload.Contexts``, whose calls
are ``kvbench.workloads.requests.ContextSteps``): the prefill of ``CONTEXT`` tokens and the steps before it, made in
``setup``, untimed, then the last step of the command's window (its warm-up and its timed steps less one), in
seconds. The gate is the command's too: the first ``setup`` in a process runs the contexts gate over the
same positions (every step of the window against ``full``'s logits), and a mode that fails it is not timed.

A compiled mode compiles once per process, in that gate (its first call of the compiled function, the
compile included, is what ``kvbench.models.compiled.compile_seconds`` keeps), never in a sample: asv re-runs
``setup`` before every sample, so what a process builds once (the model, the gate, the compiled step) is
kept in ``PREPARED`` and a later ``setup`` only prefills. The compile's seconds go into the environment
capture beside asv's result (``compile_seconds``), not into asv's number. One round per cell, since every
process pays the compile (about 20 s with inductor's cache warm, a minute or two cold).

Parameters stay few (``docs/asv.md``: what a quick run takes): ``llama-mini`` at one context, eager
``static`` beside ``static-compiled``. A mode this commit or machine cannot run is skipped (no such mode, no
C++ compiler).
"""

from __future__ import annotations

from . import common

try:  # commits before the steady contexts workload and the compiled modes skip this suite
    from kvbench.modes import SPECS, spec

    try:  # kvbench's packages by concern, then the flat modules before them
        from kvbench.workloads.requests import check_context
        from kvbench.workloads.workload import Contexts
    except ImportError:
        from kvbench.workloads.requests import check_context
        from kvbench.workloads import Contexts
except ImportError:
    Contexts = None

MODELS = ("llama-mini",)
# Never reordered (asv passes parameter indices); a mode is added at the end. hf-static-compiled is left out: its
# compile took 51 s of a 404 s quick run (static-compiled's 25 s), measured 2026-12-03 (docs/asv.md).
MODES = ("static", "static-compiled")
CONTEXTS = (256,)
PREPARED: dict = {}  # (model, mode, context) -> (model, ids, gate check): once per process


def workloads():
    """The command's contexts workload (the gate's window), and the same positions timed as one last step."""
    window = Contexts()
    try:
        last_step = Contexts(warmup_steps=window.warmup_steps + window.timed_steps - 1, timed_steps=1)
    except (AttributeError, TypeError):  # a commit whose contexts workload timed one cold step
        raise NotImplementedError("no steady contexts workload (warm-up and timed steps) at this commit") from None
    return window, last_step


def prepared(model: str, mode: str, context: int) -> tuple:
    """The seeded model and ids of a cell, gated, built once per process; NotImplementedError for a cell this
    commit or machine cannot run, RuntimeError for one that failed the gate."""
    key = (model, mode, context)
    if key not in PREPARED:
        PREPARED[key] = gated(model, mode, context)
    built, ids, check = PREPARED[key]
    if not check["passed"]:
        raise RuntimeError(f"{mode} at context {context} failed the equivalence gate: {check.get('error') or check}")
    return built, ids


def gated(model: str, mode: str, context: int) -> tuple:
    from kvbench.model import build_model

    try:  # kvbench's packages by concern, then the flat modules before them
        from kvbench.measure.timing import set_threads
        from kvbench.workloads.decode import token_ids
    except ImportError:
        from kvbench.workloads.decode import token_ids
        from kvbench.measure.timing import set_threads

    if Contexts is None or mode not in SPECS:
        raise NotImplementedError(f"mode {mode!r} or the contexts workload does not exist at this commit")
    set_threads(common.PROTOCOL.threads)  # before any torch work in this process
    config = common.config_for(model, mode)
    try:
        spec(mode).require(config)  # a compiler, transformers, the llama family
    except ValueError as error:
        raise NotImplementedError(str(error)) from None
    window = workloads()[0]
    positions = window.positions(context)
    if positions > config.max_length:
        raise NotImplementedError(f"context {context} needs {positions} positions, over max_length {config.max_length}")
    built = build_model(config, seed=common.PROTOCOL.seed)
    ids = token_ids(config, common.PROTOCOL.batch, positions, common.PROTOCOL.seed)
    check = check_context(built, ids, [mode], context, None, window.warmup_steps, window.timed_steps)[mode]
    note = {"compile_seconds": compile_seconds(mode), "gate_passed": check["passed"], "max_abs_diff": check.get("max_abs_diff")}
    common.annotate("compile_seconds", f"{model}@{mode}@{context}", note)
    return built, ids, check


def compile_seconds(mode: str) -> list[float]:
    """The first calls of `mode`'s compiled functions in this process, compile included (none for eager modes)."""
    if not SPECS[mode].compiled:
        return []
    try:  # kvbench's packages by concern, then the flat module before them
        from kvbench.models.compiled import compile_seconds as kept
    except ImportError:
        from kvbench.models.compiled import compile_seconds as kept

    return list(kept.get(mode, []))


class TimeStep:
    """Seconds of one steady decode step at a context: the last step of ``kvbench run --contexts``'s window."""

    params = (MODELS, MODES, CONTEXTS)
    param_names = ("model", "mode", "context")
    setup_cache = staticmethod(common.prepare)  # the commit's capture, which the compile seconds are kept in
    version = "kvbench-step-1"
    number = 1  # one step per sample; setup prefills before every sample
    repeat = (5, 21, 10.0)  # min and max samples per round, and the time budget
    rounds = 1  # every process compiles: one per cell
    warmup_time = 0  # the window's earlier steps, in setup, are the warm-up
    timeout = 600  # a cold compile of transformers' forward took up to 122 s under load (docs/compiled.md)

    def setup(self, gate, model, mode, context):
        built, ids = prepared(model, mode, context)
        self.stepping = workloads()[1].call(built, ids, context, mode, None)
        self.stepping.prepare()  # the prefill and the steps before the timed one

    def teardown(self, gate, model, mode, context):
        stepping = getattr(self, "stepping", None)
        if stepping is not None:
            stepping.finish()

    def time_step(self, gate, model, mode, context):
        self.stepping()
