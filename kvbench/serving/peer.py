"""The serving peer: transformers' own continuous batching on the same weights and the same trace.

transformers (kvbench's pinned version) schedules requests itself, in a background thread, over its
own paged cache (`ContinuousBatchingManager`, `PagedAttentionCache`, attn_implementation "sdpa" on the
CPU), and generates greedily: it cannot be teacher-forced. So when the peer is in a run, every
request's output ids are made the full path's own greedy continuation of its prompt, computed once
(`greedy_continuations`), and the kvbench kinds teacher-force exactly those ids: both sides then do
the same work. The peer's gate is token equality with that continuation.

A replay (`PeerReplay`) hands the manager each request at its arrival time (a Poisson trace's gaps
are slept, not skipped: the peer's clock cannot jump) with its own max_new_tokens (a cancelled
request's cancel point: transformers then stops it where its client would have cancelled it), and
reads transformers' per-token timestamps (`record_timestamps=True`) into the same outcome as
kvbench's scheduler: arrival, admission (when the request left transformers' queue), token times.
transformers records no per-iteration memory, so the peer's replay has no iterations.
"""

from __future__ import annotations

import time

import torch

from kvbench.cache import make_cache
from kvbench.measure.clock import HOST
from kvbench.model import Decoder
import kvbench.serving.admission as admission
from kvbench.serving.trace import Trace

PEER = admission.PEER
RESULT_TIMEOUT = 600.0  # seconds without any finished request before the peer is declared stuck


def greedy_continuation(model: Decoder, prompt: torch.Tensor, count: int) -> list[int]:
    """`count` ids: the full path's greedy continuation of `prompt` (1, P). Generated with a static cache, then
    checked against one causal forward over prompt and continuation; where a near-tie made them differ, the
    full path's choice is kept and generation resumes from it."""
    chosen: list[int] = []
    with torch.inference_mode():
        while True:
            cache = make_cache("static", model.config, 1, prompt.shape[1] + count, device=model.device)
            fed = torch.cat((prompt, torch.tensor([chosen], dtype=torch.long, device=prompt.device).view(1, -1)), dim=1)
            logits, _ = model(fed, cache)
            while len(chosen) < count:
                chosen.append(int(logits[0, -1].argmax()))
                if len(chosen) < count:
                    logits, _ = model(torch.tensor([[chosen[-1]]], device=prompt.device), cache)
            given = torch.tensor([chosen[:-1]], dtype=torch.long, device=prompt.device).view(1, -1)
            full = model(torch.cat((prompt, given), dim=1))[0]
            path = full[0, prompt.shape[1] - 1 :].argmax(-1).tolist()
            differ = next((i for i, (a, b) in enumerate(zip(path, chosen)) if a != b), None)
            if differ is None:
                return chosen
            chosen = chosen[:differ] + [path[differ]]


def greedy_continuations(model: Decoder, trace: Trace, prompts) -> dict[int, list[int]]:
    """request id -> its `output` greedy ids; `prompts(request)` gives its prompt ids (1, prompt)."""
    return {r.id: greedy_continuation(model, prompts(r), r.output) for r in trace.requests}


def peer_config(model: Decoder, budget: int, settings: dict):
    """transformers' continuous-batching config for the budget: as many pages of block_size positions (in
    every layer) as the budget holds, kvbench's token budget per iteration, prefix sharing only if asked."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    size = settings.get("block_size", admission.DEFAULT_BLOCK_SIZE)
    blocks = budget // admission.block_bytes(model.config, size)
    tokens = settings.get("max_batched_tokens") or model.config.max_length
    return ContinuousBatchingConfig(num_blocks=blocks, page_size=size, max_batch_tokens=tokens,
                                    allow_block_sharing=bool(settings.get("share_prefix")), use_cuda_graph=False)


class PeerReplay:
    """The call the sampler times: the whole trace through transformers' manager. `prepare()` builds and starts
    the manager (its cache allocated) outside the timed region; `detail()` hands over the outcome."""

    def __init__(self, model: Decoder, trace: Trace, budget: int, settings: dict, prompts) -> None:
        if trace.arrivals == "closed":
            raise ValueError(f"the peer {PEER} replays arrivals all or poisson, got closed-loop clients")
        from kvbench.models.hf import model_for

        self.model, self.trace, self.budget, self.settings = model, trace, budget, settings
        self.hf, self.prompts = model_for(model), {r.id: prompts(r)[0].tolist() for r in trace.requests}
        self.manager, self.last, self.outputs, self.replays = None, {}, {}, 0

    def prepare(self) -> None:
        """The manager, built and started once and kept across replays (its stop runs gc.collect(), seconds
        in a big process: `close()` stops it once, after the last replay)."""
        if self.manager is not None:
            return
        from transformers import GenerationConfig

        generation = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0)  # no EOS: every token asked
        self.manager = self.hf.init_continuous_batching(generation, peer_config(self.model, self.budget, self.settings))
        self.manager.start()

    def close(self) -> None:
        if self.manager is not None:
            self.manager.stop(block=True)
            self.manager.destroy()
            self.manager = None

    def __call__(self) -> None:
        self.replays += 1
        # the host clock, whatever device the kvbench kinds ran on: transformers stamps each token and each
        # request's lifespan with time.perf_counter, which is HOST.now_ns() in seconds
        start = HOST.now_ns() / 1e9
        for request in self.trace.requests:  # arrival order
            wait = start + request.arrival - HOST.now_ns() / 1e9
            if wait > 0:
                time.sleep(wait)
            self.manager.add_request(self.prompts[request.id], f"{self.replays}-{request.id}",
                                     max_new_tokens=request.emits, record_timestamps=True)
        results = {}
        while len(results) < len(self.trace.requests):
            result = self.manager.get_result(timeout=RESULT_TIMEOUT)
            if result is None:
                raise ValueError(f"transformers' continuous batching returned {len(results)} of "
                                 f"{len(self.trace.requests)} requests, then nothing for {RESULT_TIMEOUT:.0f} s")
            if result.error:
                raise ValueError(f"transformers' continuous batching failed request {result.request_id}: {result.error}")
            if result.is_finished():
                results[int(result.request_id.partition("-")[2])] = result
        self.outputs = {rid: list(result.generated_tokens) for rid, result in results.items()}
        self.last = {"requests": [self.outcome(r, results[r.id], start) for r in self.trace.requests],
                     "iterations": []}

    @staticmethod
    def outcome(request, result, start: float) -> dict:
        times = [round(stamp - start, 9) for stamp in result.timestamps]  # to the nanosecond, as kvbench's own
        return {"id": request.id, "arrival": request.arrival, "admitted": round(result.lifespan[0] - start, 9),
                "token_times": times, "finished": times[-1], "cancelled": request.cancel_after is not None,
                "preemptions": None}

    def detail(self) -> dict:
        return {"replay": self.last}


def peer_gate(replay: PeerReplay, continuations: dict[int, list[int]]) -> dict:
    """One replay (the warmup too): every request's generated ids against its greedy continuation."""
    replay.prepare()
    replay()
    failed, checked = [], 0
    for request in replay.trace.requests:
        expected, got = continuations[request.id][: request.emits], replay.outputs[request.id]
        checked += len(expected)
        if got != expected:
            first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
            failed.append({"request": request.id, "position": first})
    return {"mode": PEER, "rule": "token equality with the full path's greedy continuation", "passed": not failed,
            "failed_requests": failed, "tokens_checked": checked, "requests": len(replay.trace.requests),
            "max_concurrency": None, "preemptions": None, "shared_saved": None}
