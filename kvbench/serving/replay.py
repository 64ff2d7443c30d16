"""The serving workload: one trace replayed per kind under one KV budget, gated, sampled, summarised.

The gate comes first, as everywhere in kvbench: every request of the trace, replayed with the
scheduler (batching, padding, preemption, shared prefixes and all), must give the logits of its
own single-request full path (one causal forward over its prompt and fed-back outputs, no cache)
within the dtype's tolerance (exact kinds) or the kind's drift limits (lossy kinds). Then the
sampler (kvbench.measure.sampling) replays the trace once per kind per rotation, in random mode order,
with an A/A control, and every replay's per-token timestamps and per-iteration memory are kept
(kvbench.serving.figures reads them).
"""

from __future__ import annotations

import torch

from kvbench.cache.evicting import masked_reference
from kvbench.measure import stats
from kvbench.measure.clock import clock_for
from kvbench.modes import SPECS, spec
from kvbench.workloads.decode import judge_logits, model_tolerances
from kvbench.model import Decoder
from kvbench.serving.peer import PEER, PeerReplay, greedy_continuations, peer_gate
from kvbench.measure.sampling import Sampling, sample
from kvbench.serving.disciplines import FirstComeFirstServed, disciplines
from kvbench.serving.prefix_cache import PrefixLedger, SharedSource
from kvbench.serving.scheduler import Scheduler, make_ledger
from kvbench.serving.tokens import TokenSource
from kvbench.serving.figures import replay_figures
from kvbench.measure.timing import Protocol, control_mode
from kvbench.serving.trace import Trace

REPLAY_STAGE = "replay"  # what a sampled replay's progress starts with: the caller's display must not tick in it


class Replay:
    """The call the sampler times: one whole trace on one kind. `prepare()` builds the pool or ledger outside
    the timed region (a server starts with its memory); `detail()` hands over what the replay recorded."""

    def __init__(self, model: Decoder, trace: Trace, kind: str, budget: int, settings: dict,
                 keep_logits: bool = False, continuations: dict[int, list[int]] | None = None, text=None) -> None:
        self.model, self.trace, self.kind, self.budget, self.settings = model, trace, kind, budget, settings
        self.keep_logits, self.scheduler, self.last, self.continuations = keep_logits, None, {}, continuations
        self.text = text  # the corpus's token ids a trained model's requests are cut from (None: random ids)

    def prepare(self) -> None:
        """The kind's settings hold its ledger's options, the scheduler's token budget (max_batched_tokens) and
        order discipline, and for a serving mode that is a kind with its prefix cache (`prefix_cache`), the kind.
        Each replay starts with an empty prefix cache, as a server starts."""
        options = dict(self.settings)
        tokens, order = options.pop("max_batched_tokens", None), options.pop("order", FirstComeFirstServed.name)
        kind, prefix = options.pop("kind", self.kind), options.pop("prefix_cache", False)
        ledger = (PrefixLedger(self.model, self.budget, options["block_size"]) if prefix
                  else make_ledger(self.model, kind, self.budget, **options))
        source = SharedSource(self.model.config.vocab_size, self.trace.seed, self.trace, self.continuations,
                              self.text)
        self.scheduler = Scheduler(self.model, self.trace, ledger, source, self.keep_logits, tokens,
                                   disciplines=disciplines(order=order),
                                   clock=clock_for(self.model.device))  # its stamps after the device's work

    def __call__(self) -> None:
        self.last = self.scheduler.run()
        if isinstance(self.scheduler.ledger, PrefixLedger):
            self.last["prefix_cache"] = self.scheduler.ledger.stats(len(self.trace.requests))

    def detail(self) -> dict:
        return {"replay": self.last}


def token_count_problem(spec, emitted: int) -> str | None:
    """Why `emitted` tokens are wrong for `spec`'s request, or None: a replay gives exactly what the trace asks
    (spec.emits: its output, or cancel_after when its client cancels)."""
    if emitted == spec.emits:
        return None
    cancelled = f" (cancelled after {spec.cancel_after})" if spec.cancel_after is not None else ""
    return f"emitted {emitted} tokens, the trace asks {spec.emits}{cancelled}"


def gate(model: Decoder, trace: Trace, kind: str, budget: int, settings: dict,
         continuations: dict[int, list[int]] | None = None, text=None) -> dict:
    """Every request's logits through the scheduler against its own full path: the kind's check, with the
    worst request's figures and where the first failing one failed. A request given more or fewer tokens than
    the trace asks fails too, at the first position it should not have (a scheduler that retires requests
    early does less work, and would otherwise be timed as if it did it all). A trained model is held to the
    tolerance it carries (kvbench.workloads.decode.model_tolerances: docs/drift.md), random weights to the dtype's."""
    name, kind = kind, settings.get("kind", kind)  # a serving mode (paged-prefix) names its kind in its settings
    if spec(kind).evicts:  # its caches record what each step saw: its reference is the full path masked to that
        settings = {**settings, "options": {**settings.get("options", {}), "history": True}}
    replay = Replay(model, trace, name, budget, settings, keep_logits=True, continuations=continuations, text=text)
    replay.prepare()
    replay()
    atol, rtol = model_tolerances(model)
    worst, failed, checked = None, [], 0
    with torch.inference_mode():
        for live in replay.scheduler.lives:
            compared = min(live.emitted, live.spec.emits)
            miscounted = token_count_problem(live.spec, live.emitted)
            check = None
            if compared:
                start = live.spec.prompt - 1
                reference = (model(live.ids)[0] if live.history is None else
                             masked_reference(model, live.ids, live.history))[:, start : start + compared]  # (1, n, V)
                check = judge_logits(kind, torch.stack(live.logits[:compared])[None], reference, atol, rtol,
                                     model.config).to_dict()
                checked += compared
                if worst is None or check["max_abs_diff"] > worst["max_abs_diff"]:
                    worst = check
            if check is not None and not check["passed"]:
                failed.append({"request": live.spec.id, "position": check["first_divergent_position"]})
            elif miscounted:
                failed.append({"request": live.spec.id, "position": compared, "reason": miscounted})
    iterations = replay.last["iterations"]
    return {**(worst or {}), "mode": name, "passed": not failed, "failed_requests": failed,
            "tokens_checked": checked, "requests": len(trace.requests), "preemptions": sum(it["preempted"] for it in iterations),
            "max_concurrency": max(it["running"] for it in iterations), "shared_saved": max(it["saved"] for it in iterations)}


def serve(model: Decoder, trace: Trace, kinds: list[str], budget: int, settings: dict[str, dict],
          protocol: Protocol, on_sample=None, state=None, checks: dict | None = None, on_progress=None,
          text=None) -> dict:
    """The gate of every kind, then the sampled replays: {"checks", "control", "sampling"} (samples keep their
    replays). Pass `checks` and `state` to keep what was done when an interrupt ends the run early.
    `on_progress(done, total, what)`, if given, before each gate ("gate ...") and after each replay ("replay ...",
    called between samples, outside the timed region; total None under a precision target, whose stop rule
    decides the count). `text`: 1-D token ids (a trained model's corpus) every request is cut from."""
    checks = checks if checks is not None else {}
    continuations, prompts = None, TokenSource(model.config.vocab_size, trace.seed, trace.prefix, text=text).prompt
    if PEER in kinds:  # a greedy peer: every kind's outputs become the full path's greedy continuation
        continuations = greedy_continuations(model, trace, prompts)

    peer = PeerReplay(model, trace, budget, settings[PEER], prompts) if PEER in kinds else None

    def replay(kind: str):
        return peer if kind == PEER else Replay(model, trace, kind, budget, settings[kind], continuations=continuations,
                                                text=text)

    try:
        for index, kind in enumerate(kinds):
            if on_progress is not None:
                on_progress(index, len(kinds), f"gate {index + 1} of {len(kinds)}: {kind}")
            checks[kind] = (peer_gate(peer, continuations) if kind == PEER
                            else gate(model, trace, kind, budget, settings[kind], continuations, text))
        runnable = [kind for kind in kinds if checks[kind]["passed"]]
        if not runnable:  # nothing may be timed as if it were correct
            return {"checks": checks, "control": None, "sampling": state if state is not None else Sampling(),
                    "continuations": continuations}
        loops = {kind: replay(kind) for kind in runnable}
        control = control_mode(protocol.control, [kind for kind in runnable if kind in SPECS])  # kvbench's kinds
        if control is not None:
            loops["control"] = replay(control)
        sampled = sample({0: loops}, protocol, baseline=runnable[0], on_sample=counted(on_sample, on_progress, protocol,
                                                                                     len(loops)), state=state,
                         watch=lambda samples, length: makespan_half_widths(samples, runnable[0], protocol.between_run),
                         clock=clock_for(model.device))
    finally:
        if peer is not None:
            peer.close()
    return {"checks": checks, "control": control, "sampling": sampled, "continuations": continuations}


def counted(on_sample, on_progress, protocol: Protocol, loops: int):
    """on_sample that also reports each replay kept as "replay k of N: kind" (N: the fixed protocol's rotations
    times the kinds and control replayed in each); first a count of 0, before the first replay is timed."""
    if on_progress is None:
        return on_sample
    total = protocol.repeats * loops if protocol.precision is None else None
    on_progress(0, total, REPLAY_STAGE)
    done = 0

    def kept(replayed) -> None:
        nonlocal done
        done += 1
        if on_sample is not None:
            on_sample(replayed)
        of = f" of {total}" if total is not None else ""
        on_progress(done, total, f"{REPLAY_STAGE} {done}{of}: {replayed.mode}")

    return kept


def makespan_half_widths(samples, baseline: str, between_run: float) -> dict[str, float]:
    """The stop rule's watch: every kind's throughput ratio to the baseline's (same tokens: makespans)."""
    by_mode: dict[str, dict[int, float]] = {}
    for kept in samples:
        by_mode.setdefault(kept.mode, {})[kept.repetition] = kept.detail["replay"] and replay_figures(
            kept.detail["replay"])["makespan"]
    widths = {}
    for mode, values in by_mode.items():
        if mode != baseline and baseline in by_mode:
            estimate = stats.speedup(by_mode[baseline], values, between_run=between_run, key=("serving", mode))
            if estimate is not None:
                widths[mode] = estimate.half_width
    return widths
