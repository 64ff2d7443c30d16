"""Serving: ragged batches give every request its own logits, the scheduler keeps its invariants, and the
command line refuses bad input before measuring."""

import json
import signal
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvbench import modes
from kvbench.cache import BlockPool, PagedCache, make_cache
from kvbench.cache.batch import BatchedCache
from kvbench.cli import main
from kvbench.model import DecoderConfig, build_model, preset_config
from kvbench.serving import admission
from kvbench.serving.replay import gate
from kvbench.serving.scheduler import Scheduler, TokenSource, make_ledger
from kvbench.serving.trace import Trace, TraceRequest, make_trace, parse_arrivals, parse_lengths, trace_from_dict

ROOT = Path(__file__).resolve().parents[1]
LLAMA = preset_config("llama-tiny", vocab_size=128, max_length=96)


pytestmark = pytest.mark.usefixtures("one_torch_thread")
MODELS = {"gpt2": build_model(DecoderConfig(max_length=96), seed=0), "llama": build_model(LLAMA, seed=0)}


def trace_of(lengths="uniform:3-20,2-12", requests=6, arrivals="all", seed=0, **more):
    spec = {**parse_lengths(lengths), **parse_arrivals(arrivals), "requests": requests, **more}
    return make_trace(spec, seed, 96)


def replay(model, trace, kind, budget, keep_logits=True, max_batched_tokens=None, **options):
    ledger = make_ledger(model, kind, budget, **options)
    scheduler = Scheduler(model, trace, ledger, TokenSource(model.config.vocab_size, trace.seed, trace.prefix),
                          keep_logits, max_batched_tokens)
    return scheduler, ledger, scheduler.run()


@pytest.mark.parametrize("family", list(MODELS))
@pytest.mark.parametrize("kind", ["static", "paged", "quantized-int8"])
def test_a_ragged_batch_gives_every_row_its_own_requests_logits(family, kind):
    model = MODELS[family]
    prompts, new = [5, 1, 12], [1, 7, 3]  # rows at different lengths taking different numbers of tokens
    ids = [torch.randint(0, 128, (1, p + n), generator=torch.Generator().manual_seed(i))
           for i, (p, n) in enumerate(zip(prompts, new))]
    pool = BlockPool(model.config, 16, 4)
    with torch.inference_mode():
        caches = [PagedCache(model.config, 1, pool=pool) if kind == "paged" else make_cache(kind, model.config, 1, 40)
                  for _ in ids]
        for cache, row, prompt in zip(caches, ids, prompts):
            model(row[:, :prompt], cache)
        batch = torch.zeros(3, max(new), dtype=torch.long)
        for b, (row, prompt, count) in enumerate(zip(ids, prompts, new)):
            batch[b, :count] = row[0, prompt : prompt + count]
        logits, _ = model(batch, BatchedCache(caches, new))
        for b, (row, prompt, count) in enumerate(zip(ids, prompts, new)):
            alone = model(row)[0][0, prompt : prompt + count]  # the request's own full path
            tolerance = 1e-5 if kind != "quantized-int8" else 1e-2
            torch.testing.assert_close(logits[b, :count], alone, atol=tolerance, rtol=tolerance)
            assert caches[b].length == prompt + count


def test_a_batched_call_that_fails_leaves_every_row_as_it_was():
    model = MODELS["llama"]
    pool = BlockPool(model.config, 3, 4)
    with torch.inference_mode():
        rows = [PagedCache(model.config, 1, pool=pool) for _ in range(2)]
        model(torch.ones(1, 4, dtype=torch.long), rows[0])
        model(torch.ones(1, 4, dtype=torch.long), rows[1])
        with pytest.raises(ValueError, match="block pool exhausted"):
            model(torch.ones(2, 8, dtype=torch.long), BatchedCache(rows, [8, 8]))
    assert [row.length for row in rows] == [4, 4] and pool.free_blocks == 1


@pytest.mark.parametrize("kind, options", [("static", {}), ("paged", {}), ("paged", {"share_prefix": True, "block_size": 4}),
                                           ("quantized-int4", {})])
def test_the_gate_holds_through_batching_preemption_sharing_and_cancellation(kind, options):
    model = MODELS["llama"]
    trace = trace_of(requests=8, prefix=8, prefix_fraction=0.8, cancel_fraction=0.3, cancel_after=2)
    minimum = admission.minimum_budget(kind, model.config, trace, share_prefix=bool(options), block_size=4)
    check = gate(model, trace, kind, int(minimum * (3 if options else 1.6)), options)  # sharing needs two at once
    assert check["passed"], check
    assert check["tokens_checked"] == sum(r.emits for r in trace.requests)
    if kind == "paged" and not options:
        assert check["preemptions"] > 0  # the budget is tight enough that the recompute path ran
    if options:
        assert check["shared_saved"] > 0


@pytest.mark.parametrize("family, fault", [("gpt2", "positions"), ("llama", "mask"), ("llama", "lengths")])
def test_a_wrong_position_or_mask_fails_the_gate(monkeypatch, family, fault):
    original = BatchedCache.__init__

    def broken(self, rows, new, workspace=None):
        original(self, rows, new, workspace)
        if fault == "positions":  # every row one position off (learned positions: RoPE would not notice)
            self.row_positions = self.row_positions + 1
        elif fault == "mask":  # every query sees every key: another row's padding, its own future
            self.key_mask, self.key_lengths = torch.ones_like(self.key_mask), None
        else:  # a decode row attends one key past its own: padding
            self.key_lengths = tuple(length + 1 for length in self.key_lengths)

    monkeypatch.setattr(BatchedCache, "__init__", broken)
    check = gate(MODELS[family], trace_of(requests=4), "paged", 10**6, {})
    assert not check["passed"] and check["failed_requests"]


def retire_when(emits):
    """A Scheduler.retire that releases a request once it emitted emits(spec) tokens (a scheduler miscounting)."""

    def retire(self, stepped):
        freed, ended = 0, 0
        for live in stepped:
            if live.emitted >= emits(live.spec):
                self.running.remove(live)
                freed += self.ledger.release(live)
                live.finished, ended = live.token_times[-1], ended + 1
        return freed, ended

    return retire


def test_a_scheduler_that_retires_every_request_one_token_early_fails_the_gate(monkeypatch):
    trace = trace_of("fixed:5,6", requests=4)
    monkeypatch.setattr(Scheduler, "retire", retire_when(lambda spec: spec.emits - 1))
    check = gate(MODELS["gpt2"], trace, "static", 10**6, {})
    assert not check["passed"]
    assert check["failed_requests"] == [{"request": r, "position": 5, "reason": "emitted 5 tokens, the trace asks 6"}
                                        for r in range(4)]
    assert check["tokens_checked"] == 4 * 5  # the tokens it did emit are still compared


def test_the_gate_counts_a_cancelled_requests_tokens_as_its_cancel_after(monkeypatch):
    trace = trace_of("fixed:5,6", requests=3, cancel_fraction=1.0, cancel_after=2)
    check = gate(MODELS["gpt2"], trace, "paged", 10**6, {"block_size": 4})
    assert check["passed"] and check["tokens_checked"] == 3 * 2, check
    monkeypatch.setattr(Scheduler, "retire", retire_when(lambda spec: spec.output))  # the client's cancel ignored
    check = gate(MODELS["gpt2"], trace, "paged", 10**6, {"block_size": 4})
    assert not check["passed"]
    assert check["failed_requests"] == [{"request": r, "position": 2,
                                         "reason": "emitted 6 tokens, the trace asks 2 (cancelled after 2)"}
                                        for r in range(3)]


def test_static_admits_what_its_reservations_fit_and_paged_more():
    model = MODELS["gpt2"]
    trace = trace_of("fixed:8,24", requests=12)  # 31 positions each
    budget = 3 * admission.reservation("static", model.config, 31)
    _, _, static = replay(model, trace, "static", budget, keep_logits=False)
    _, _, paged = replay(model, trace, "paged", budget, keep_logits=False, block_size=4)
    assert max(it["running"] for it in static["iterations"]) == 3
    assert max(it["running"] for it in paged["iterations"]) >= 6
    assert all(it["reserved"] <= budget for it in static["iterations"] + paged["iterations"])


def test_a_next_token_that_takes_the_last_free_block_preempts_nothing():
    """A pool of 2 blocks of 4 and one request of 4 prompt tokens and 2 outputs: its prompt fills block 1, its second
    token takes block 2, the last one free. That fits: the request is not preempted, its prompt prefilled once."""
    model = MODELS["gpt2"]
    trace = trace_of("fixed:4,2", requests=1)
    _, ledger, outcome = replay(model, trace, "paged", 2 * admission.block_bytes(model.config, 4), keep_logits=False,
                                block_size=4)
    assert [(it["preempted"], it["prefill_tokens"], it["decoded"], it["free_blocks"]) for it in outcome["iterations"]] \
        == [(0, 4, 0, 1), (0, 0, 1, 0)]
    assert ledger.pool.free_blocks == ledger.pool.num_blocks == 2


def test_sharing_a_prefix_saves_exactly_n_minus_one_copies():
    model = MODELS["llama"]
    trace = trace_of("fixed:5,6", requests=4, prefix=16)  # every request: the same 16 tokens, then its own
    _, ledger, outcome = replay(model, trace, "paged", 10**6, keep_logits=False, block_size=8, share_prefix=True)
    per_position = admission.bytes_per_position(model.config)
    assert max(it["saved"] for it in outcome["iterations"]) == (4 - 1) * 16 * per_position
    assert sum(it["prefill_tokens"] for it in outcome["iterations"]) == 16 + 4 * 5  # the prefix once, then their own
    assert ledger.pool.free_blocks == ledger.pool.num_blocks
    # every iteration stores the prefix's 16 positions once and each fork's own as far as its blocks are filled
    # (21 positions each, then one more a step: their third block partly filled, then a fourth)
    assert [(it["used"], it["saved"]) for it in outcome["iterations"]] == [
        ((16 + 4 * (length - 16)) * per_position, (4 - 1) * 16 * per_position) for length in range(21, 27)]


@pytest.mark.parametrize("kind", ["static", "paged"])
def test_chunked_prefill_keeps_every_iteration_within_its_token_budget(kind):
    model = MODELS["llama"]
    trace = trace_of("uniform:20-40,3-8", requests=5)
    budget = admission.minimum_budget(kind, model.config, trace, block_size=4) * 5  # every request at once
    scheduler, ledger, outcome = replay(model, trace, kind, budget, max_batched_tokens=8,
                                        **({"block_size": 4} if kind == "paged" else {}))
    for it in outcome["iterations"]:
        assert it["prefill_tokens"] + it["decoded"] <= max(8, it["decoded"]), it  # decodes first, chunks the rest
    fed = sum(it["prefill_tokens"] + it["decoded"] for it in outcome["iterations"])
    assert fed == sum(r.positions for r in trace.requests)  # every position once: no preemption at this budget
    assert sum(it["preempted"] for it in outcome["iterations"]) == 0
    assert max(len(r["token_times"]) for r in outcome["requests"]) == max(r.emits for r in trace.requests)
    for live in scheduler.lives:  # a prompt of 20-40 took several chunks, and the logits are still its own
        reference = model(live.ids)[0][0, live.spec.prompt - 1 : live.spec.prompt - 1 + live.emitted]
        torch.testing.assert_close(torch.stack(live.logits), reference, atol=1e-5, rtol=1e-5)
    unchunked = replay(model, trace, kind, budget, keep_logits=False, **({"block_size": 4} if kind == "paged" else {}))
    assert max(it["prefill_tokens"] for it in unchunked[2]["iterations"]) >= 20  # without a budget: whole prompts
    if kind == "paged":
        assert ledger.pool.free_blocks == ledger.pool.num_blocks


def test_a_shared_prefix_is_prefilled_in_chunks_of_the_token_budget():
    """The review's case: 2 requests of (80, 4) whose first 64 tokens are shared, 32 tokens per iteration: the holder
    took the whole prefix beside the requests' own chunks (96 tokens in iteration 1)."""
    model = MODELS["llama"]
    trace = trace_of("fixed:16,4", requests=2, prefix=64)
    _, ledger, outcome = replay(model, trace, "paged", 10**6, max_batched_tokens=32, block_size=8, share_prefix=True)
    fed = [(it["prefill_tokens"], it["decoded"]) for it in outcome["iterations"]]
    assert fed[:4] == [(32, 0), (32, 0), (32, 0), (0, 2)]  # the prefix in two chunks, then both own parts at once
    assert sum(prefill for prefill, _ in fed) == 64 + 2 * 16  # the prefix once
    assert ledger.pool.free_blocks == ledger.pool.num_blocks
    # the holder's first chunk is stored before any request holds it: it saves nothing yet (not less than nothing);
    # then both forks hold the whole prefix, stored once, and each its own 16 positions beside it
    per_position = admission.bytes_per_position(MODELS["llama"].config)
    assert [(it["used"] // per_position, it["saved"] // per_position) for it in outcome["iterations"][:3]] == [
        (32, 0), (64, 64), (64 + 2 * 16, 64)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), requests=st.integers(1, 5), share=st.booleans(), prefix=st.integers(1, 40),
       tokens=st.integers(1, 24), slack=st.floats(1.0, 3.0), arrivals=st.sampled_from(["all", "poisson:500"]))
def test_every_iteration_keeps_its_token_budget_with_or_without_a_shared_prefix(seed, requests, share, prefix, tokens,
                                                                              slack, arrivals):
    model = MODELS["llama"]
    trace = trace_of("uniform:1-20,1-6", requests, arrivals, seed, prefix=prefix, prefix_fraction=0.7)
    budget = int(admission.minimum_budget("paged", model.config, trace, block_size=4, share_prefix=share) * slack)
    scheduler, ledger, outcome = replay(model, trace, "paged", budget, max_batched_tokens=tokens, block_size=4,
                                        share_prefix=share)
    for it in outcome["iterations"]:  # decoding rows always step; prompt chunks, the prefix's too, share the rest
        assert it["prefill_tokens"] + it["decoded"] <= max(tokens, it["decoded"]), it
    for live in scheduler.lives:
        assert live.emitted == live.spec.emits
        reference = model(live.ids)[0][0, live.spec.prompt - 1 : live.spec.prompt - 1 + live.emitted]
        torch.testing.assert_close(torch.stack(live.logits), reference, atol=1e-5, rtol=1e-5)
    assert ledger.pool.free_blocks == ledger.pool.num_blocks


def test_the_holder_is_dropped_once_no_request_that_could_fork_it_is_left():
    """Request 0 forks a 16-token prefix (blocks of 8) and ends after 2 tokens; request 1 has no prefix and runs 6:
    once request 0 ends, the holder's 2 blocks go back with it, while request 1 still runs on its own 2."""
    model = MODELS["llama"]
    requests = (TraceRequest(0, 20, 2, 0.0, prefix=16), TraceRequest(1, 8, 6, 0.0))
    trace = trace_from_dict(Trace(requests, "all", None, 0, {}).to_dict(), 96)
    _, ledger, outcome = replay(model, trace, "paged", 10**6, keep_logits=False, block_size=8, share_prefix=True)
    block = admission.block_bytes(model.config, 8)
    assert [(it["ended"], it["reserved"] // block, it["reserved_after"] // block) for it in outcome["iterations"]] == [
        (0, 2 + 1 + 1, 2 + 1 + 1), (1, 2 + 1 + 2, 2)] + [(0, 2, 2)] * 3 + [(1, 2, 0)]
    assert ledger.holder is None and ledger.pool.free_blocks == ledger.pool.num_blocks


def test_a_request_that_can_never_be_admitted_is_refused_and_the_holder_given_back():
    """A pool of 3 blocks of 4 cannot hold a 16-token prefix: its holder takes 3 chunks of 4 tokens, then nothing
    fits and nothing runs. The replay stops naming the request and the budget, and gives the holder's blocks back.
    (A replay that went on would loop for ever, doing nothing: an alarm turns that into this test's failure.)"""
    model = MODELS["llama"]
    trace = trace_of("fixed:4,2", requests=1, prefix=16)
    budget = 3 * admission.block_bytes(model.config, 4)
    ledger = make_ledger(model, "paged", budget, block_size=4, share_prefix=True)
    scheduler = Scheduler(model, trace, ledger, TokenSource(model.config.vocab_size, trace.seed, trace.prefix),
                          max_batched_tokens=4)

    def stuck(signum, frame):
        raise TimeoutError(f"the replay went on for 10 s after {len(scheduler.iterations)} iterations")

    previous = signal.signal(signal.SIGALRM, stuck)
    signal.setitimer(signal.ITIMER_REAL, 10)
    try:
        with pytest.raises(ValueError, match=f"^request 0 cannot be admitted even alone: the KV budget {budget} bytes "
                                             r"is below its minimum \(kvbench.serving.admission.minimum_budget\)$"):
            scheduler.run()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert [it["prefill_tokens"] for it in scheduler.iterations] == [4, 4, 4]
    assert ledger.holder is None and ledger.pool.free_blocks == ledger.pool.num_blocks == 3


def test_a_cancelled_request_frees_its_blocks_in_the_same_iteration():
    model = MODELS["gpt2"]
    trace = trace_of("fixed:6,12", requests=3, cancel_fraction=1.0, cancel_after=3)
    _, ledger, outcome = replay(model, trace, "paged", 10**6, keep_logits=False, block_size=4)
    ending = [it for it in outcome["iterations"] if it["ended"]]
    assert len(ending) == 1 and ending[0]["ended"] == 3  # all three emitted their 3rd token together
    assert ending[0]["freed"] == ending[0]["reserved"] and ending[0]["reserved_after"] == 0
    assert all(len(r["token_times"]) == 3 for r in outcome["requests"])


def test_a_block_another_request_holds_is_never_freed():
    model = MODELS["llama"]
    pool = BlockPool(model.config, 8, 4)
    with torch.inference_mode():
        parent = PagedCache(model.config, 1, pool=pool)
        model(torch.arange(8)[None], parent)
        child = parent.fork()
        keys = child.keys(0).clone()
        parent.release()
        assert pool.free_blocks == 6 and child.keys(0).equal(keys)  # the child's two blocks stay held
        child.release()
    assert pool.free_blocks == 8


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), requests=st.integers(1, 6), arrivals=st.sampled_from(["all", "poisson:200",
       "closed:2"]), kind=st.sampled_from(["static", "paged", "paged-shared"]), slack=st.floats(1.0, 3.0),
       cancel=st.floats(0, 1), prefix=st.sampled_from([0, 4, 9]), tokens=st.sampled_from([None, 1, 3, 8]))
def test_any_trace_keeps_the_gate_and_leaves_the_pool_whole(seed, requests, arrivals, kind, slack, cancel, prefix,
                                                            tokens):
    model = MODELS["gpt2"]
    share = kind == "paged-shared"
    trace = trace_of("uniform:1-12,2-9", requests, arrivals, seed, cancel_fraction=cancel, cancel_after=1,
                     **({"prefix": prefix} if prefix else {}))
    kind = kind.removesuffix("-shared")
    options = {"block_size": 4, "share_prefix": share} if kind == "paged" else {}
    budget = int(admission.minimum_budget(kind, model.config, trace, block_size=4, share_prefix=share) * slack)
    scheduler, ledger, outcome = replay(model, trace, kind, budget, max_batched_tokens=tokens, **options)
    for live in scheduler.lives:
        assert live.emitted == live.spec.emits and live.cache is None
        reference = model(live.ids)[0][0, live.spec.prompt - 1 : live.spec.prompt - 1 + live.emitted]
        torch.testing.assert_close(torch.stack(live.logits), reference, atol=1e-5, rtol=1e-5)
        assert live.token_times == sorted(live.token_times) and live.token_times[0] >= live.arrival
    if kind == "paged":
        assert ledger.pool.free_blocks == ledger.pool.num_blocks  # no leak, preemptions and cancellations included
    assert ledger.held_bytes() == 0 and outcome["iterations"][-1]["reserved_after"] == 0


def run_main(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("args, fragment", [
    (["--kv-budget", "1KiB"], "below one request's minimum for static: 38912 bytes"),
    (["--kv-budget", "12 parsecs"], "--kv-budget must be bytes"),
    (["--arrivals", "poisson:0"], "poisson rate must be a positive finite number"),
    (["--arrivals", "poisson:inf"], "poisson rate"),
    (["--arrivals", "poisson:1e-300"], "--trace fixed:8,12: poisson rate 1e-300 requests/s spreads 16 requests over "
                                       "about 1.6e+301 s, beyond the 1e+07 s a trace may span"),
    (["--requests", "0"], "expected an integer in [1"),
    (["--cancel", "0.5:0"], "cancel after must be a positive integer"),
    (["--modes", "concat"], "a serving run takes kinds"),
    (["--max-batched-tokens", "0"], "expected an integer in [1"),
    (["--modes", "static", "--share-prefix"], "--share-prefix forks paged blocks"),
    (["--modes", "static,paged", "--evict-ratio", "0.5"], "--evict-ratio is read by the evicting kinds only, and "
                                                          "--modes static,paged runs none of them"),
    (["--modes", "static", "--reserve", "max-length", "--kv-keep", "4"], "--kv-keep is read by the evicting kinds"),
])
def test_bad_serving_input_is_one_line_exit_2(capsys, tmp_path, args, fragment):
    code, _, err = run_main(capsys, "run", "--preset", "llama-mini", "--trace", "fixed:8,12", "--output",
                            tmp_path / "r.json", *args)
    assert code == 2 and len(err.splitlines()) == 1 and fragment in err, err
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("tokens, window", [("none", 300), ("512", 300), ("64", 64 + 128 + 32 - 1)])
def test_a_quantized_minimum_counts_the_window_its_prefill_chunks_reach(capsys, tmp_path, tokens, window):
    """llama-mini, prompt 300: the full-precision window reaches the whole prompt when a chunk may take it whole,
    64 + 128 + 32 - 1 positions in chunks of 64. The cache as first made (a 160-position window) is 419,840 bytes;
    a budget below the peak is refused before any replay."""
    minimum = 419_840 + (window - 160) * 2 * 4 * 2 * 32 * 4  # float32 keys and values, 4 layers, 2 heads of 32
    code, _, err = run_main(capsys, "run", "--preset", "llama-mini", "--trace", "fixed:300,10", "--requests", "2",
                            "--modes", "quantized-int8", "--max-batched-tokens", tokens, "--kv-budget", minimum - 1,
                            "--output", tmp_path / "r.json")
    assert code == 2 and f"below one request's minimum for quantized-int8: {minimum} bytes" in err, err


@pytest.mark.parametrize("field, value, fragment", [
    ("cancel_after", 3, "request 1: cancellation after 3 tokens is beyond its output of 3 (expected fewer than 3)"),
    ("arrival", 1e300, "request 1: arrival must be at most 1e+07 s after the start, got 1e+300"),
    ("client", 0, "request 1: client is only a closed-loop request's (null with arrivals 'all'), got 0"),
    ("spec", 5, "spec: expected an object (how the trace was drawn), got int"),
])
def test_a_bad_trace_file_is_one_line_exit_2(capsys, tmp_path, field, value, fragment):
    trace = trace_of("fixed:4,3", requests=2).to_dict()
    (trace if field == "spec" else trace["requests"][1])[field] = value
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    code, _, err = run_main(capsys, "run", "--trace", path, "--output", tmp_path / "r.json")
    assert code == 2 and err == f"kvbench: error: --trace {path}: {fragment}\n", err
    assert not (tmp_path / "r.json").exists()


def test_a_serving_run_end_to_end_and_its_report(capsys, tmp_path):
    record, plot = tmp_path / "serving.json", tmp_path / "memory.png"
    code, out, err = run_main(capsys, "run", "--trace", "fixed:6,5", "--requests", "4", "--modes", "static,paged",
                              "--repeats", "2", "--output", record, "--cancel", "0.5:2", "--prefix", "4",
                              "--share-prefix")
    assert code == 0, err
    data = json.loads(record.read_text())
    assert data["schema"] == "kvbench.record/4" and len(data["serving"]["trace"]["requests"]) == 4
    assert data["run"]["workload"] == {"kind": "serving", "trace": "fixed"}
    budget = data["serving"]["budget"]["bytes"]
    assert {(s["mode"], s["trace"], s["budget"]) for s in data["repetitions"]} == \
        {(mode, "fixed", budget) for mode in ("control", "paged", "static")}  # each a cell of its own: no length 0
    assert all("length" not in s and len(s["replay"]["iterations"]) > 0 for s in data["repetitions"])
    assert "output tok/s" in out and "A/A control" in out and "on the replay thread's CPU time, paged / static" in out
    for sample in data["repetitions"]:  # every token also stamped on the replay thread's CPU clock, never ahead of wall
        for request in sample["replay"]["requests"]:
            cpu, wall = request["token_cpu_times"], request["token_times"]
            assert len(cpu) == len(wall) and cpu == sorted(cpu) and cpu[-1] <= wall[-1] + 1e-3
    code, out, err = run_main(capsys, "report", record, "--plot", plot)
    assert code == 0 and "p99 TPOT x static" in out and plot.read_bytes().startswith(b"\x89PNG")
    code, _, err = run_main(capsys, "run", "--trace", record, "--repeats", "1", "--output", tmp_path / "again.json")
    assert code == 0, err  # a record's trace replays
    assert json.loads((tmp_path / "again.json").read_text())["serving"]["trace"] == data["serving"]["trace"]
    code, out, err = run_main(capsys, "show", record)
    assert code == 0 and "p99 TPOT x static" in out, err


def synthetic_replay(scale, reserved, used):
    requests = [{"id": i, "arrival": 0.0, "admitted": 0.0, "token_times": [scale * (i + 1), scale * (i + 2)],
                 "token_cpu_times": [scale * (i + 1) / 2, scale * (i + 2) / 2],
                 "finished": scale * (i + 2), "cancelled": False, "preemptions": 0} for i in range(3)]
    iterations = [{"time": scale * t, "running": 2, "waiting": 0, "admitted": 0, "preempted": 0, "ended": 0,
                   "freed": 0, "used": used, "reserved": reserved, "saved": 0, "reserved_after": reserved}
                  for t in range(1, 5)]
    return {"requests": requests, "iterations": iterations}


def test_the_summary_reads_ratios_the_right_way_round():
    from kvbench.record import RecordView
    from kvbench.record.upgrade import serving_to_v4
    from kvbench.report.record.serving import summarise

    record = serving_to_v4(json.loads((ROOT / "results/serving/llama-mini-prefix-64.json").read_text()))
    record["repetitions"] = [{"mode": mode, "trace": "fixed", "budget": record["serving"]["budget"]["bytes"],
                              "repetition": r, "replay": synthetic_replay(scale * (1 + 0.01 * r), 1000, used)}
                             for r in range(3) for mode, scale, used in (("static", 1.0, 600), ("paged", 0.5, 970),
                                                                          ("control", 1.0, 600))]
    record["protocol"]["between_run"] = 0.01
    summary = summarise(RecordView(record))
    assert summary["ratios"]["paged"]["throughput"]["ratio"] == pytest.approx(2.0)  # paged twice as fast
    assert summary["ratios"]["paged"]["tpot_p99"]["ratio"] == pytest.approx(0.5)  # at half static's TPOT
    assert summary["control"]["throughput"]["ratio"] == pytest.approx(1.0)
    assert summary["kinds"]["static"]["waste"]["median"] == pytest.approx(0.4)
    assert summary["kinds"]["paged"]["waste"]["median"] == pytest.approx(0.03)
    assert summary["kinds"]["paged"]["output_tokens_per_second"]["median"] == pytest.approx(6 / (0.5 * 4 * 1.01))
    assert summary["ratios"]["paged"]["throughput_cpu"]["ratio"] == pytest.approx(2.0)  # the same on CPU time
    assert summary["ratios"]["paged"]["tpot_p99_cpu"]["ratio"] == pytest.approx(0.5)


def test_a_kind_that_fails_the_gate_is_recorded_and_not_timed(capsys, tmp_path, monkeypatch):
    original = BatchedCache.__init__

    def sees_everything(self, rows, new, workspace=None):
        original(self, rows, new, workspace)
        self.key_mask, self.key_lengths = torch.ones_like(self.key_mask), None

    monkeypatch.setattr(BatchedCache, "__init__", sees_everything)
    record = tmp_path / "failed.json"
    code, out, _ = run_main(capsys, "run", "--trace", "uniform:3-12,2-9", "--requests", "4", "--modes", "paged",
                            "--repeats", "1", "--output", record)
    data = json.loads(record.read_text())
    assert code == 1 and "EQUIVALENCE FAILED: paged" in out
    assert [check["passed"] for check in data["checks"]] == [False] and data["repetitions"] == []


@pytest.mark.parametrize("command", [["compare", "{record}", "{record}"], ["show", "{record}"],
                                     ["export", "--format", "bmf", "--output", "{out}", "{record}"]])
def test_a_malformed_serving_record_is_one_line_for_every_reader(capsys, tmp_path, command):
    """show, compare and export read serving records through one loader, and say what a malformed one lacks."""
    record = tmp_path / "serving.json"
    record.write_text(json.dumps({"schema": "kvbench.serving/1"}))
    code, _, err = run_main(capsys, *[part.format(record=record, out=tmp_path / "out.json") for part in command])
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"{record}: malformed serving record ('kvbench.serving/1'): kinds: expected list, got NoneType" in err
    assert not (tmp_path / "out.json").exists()


def test_token_ids_are_drawn_from_the_seed_and_the_request_id():
    """Request r of seed s: torch's generator seeded s * 1_000_003 + r + 1 (-1: the shared prefix), so a trace's
    ids are the same in every run and version; seed 0 and seed 1 pinned, the prefix the same for every request."""
    prefixed, plain = TraceRequest(0, 5, 3, 0.0, prefix=3), TraceRequest(1, 4, 2, 0.0)
    for seed, prefix, own, other in ((0, [21, 28, 26], [45, 39, 24, 18], [48, 37, 1, 44, 8]),
                                     (1, [3, 27, 30], [13, 7, 16, 43], [46, 11, 17, 35, 47])):
        source = TokenSource(50, seed, 3)
        assert source.prefix.tolist() == [prefix]
        assert source.ids(prefixed).tolist() == [prefix + own]  # prompt 5 + output 3 - 1 positions
        assert source.ids(plain).tolist() == [other] and source.prompt(plain).tolist() == [other[:4]]
        drawn = torch.randint(0, 50, (1, 5), generator=torch.Generator().manual_seed(seed * 1_000_003 + 2))
        assert torch.equal(source.ids(plain), drawn)
    assert TokenSource(50, 0, 0).prefix is None


def test_a_generating_peers_continuations_replace_the_drawn_outputs():
    request = TraceRequest(0, 4, 3, 0.0)
    source = TokenSource(50, 0, 0, continuations={0: [7, 8, 9]})
    drawn = TokenSource(50, 0, 0).ids(request)
    assert source.ids(request).tolist() == [drawn[0, :4].tolist() + [7, 8]]  # the prompt, then output - 1 fed back
    assert torch.equal(source.prompt(request), drawn[:, :4])


def test_a_reserving_kind_saves_nothing_and_reserves_each_running_requests_capacity():
    model = MODELS["gpt2"]
    trace = trace_of("fixed:8,4", requests=3)
    _, ledger, outcome = replay(model, trace, "static", 10**6, keep_logits=False)
    per_request = admission.reservation("static", model.config, 11)
    assert [it["saved"] for it in outcome["iterations"]] == [0] * len(outcome["iterations"])
    assert outcome["iterations"][0]["reserved"] == 3 * per_request and ledger.held == 0


@pytest.mark.parametrize("tokens", [0, -1, True, 1.5])
def test_a_token_budget_that_is_not_a_positive_integer_is_refused(tokens):
    with pytest.raises(ValueError, match=f"max_batched_tokens must be a positive integer or None, got {tokens!r}"):
        replay(MODELS["gpt2"], trace_of(), "static", 10**6, max_batched_tokens=tokens)


def test_idle_gaps_are_skipped_and_every_request_is_admitted_at_its_arrival():
    """Arrivals at 0.6 s and 3 s on an ample budget: the clock jumps to each arrival (the replay takes a fraction
    of those seconds), and each request is admitted when it arrives, never before or a jump too far."""
    requests = (TraceRequest(0, 6, 3, 0.6), TraceRequest(1, 6, 3, 3.0))
    trace = trace_from_dict(Trace(requests, "poisson", None, 0, {}).to_dict(), 96)
    started = time.perf_counter()
    _, _, outcome = replay(MODELS["gpt2"], trace, "static", 10**6, keep_logits=False)
    assert time.perf_counter() - started < 2.4  # the 2.4 s without a request were skipped, not slept
    for request, arrival in zip(outcome["requests"], (0.6, 3.0)):
        assert 0 <= request["admitted"] - arrival < 0.2 and request["token_times"][0] >= arrival
    assert outcome["iterations"][-1]["time"] < 3.5


def test_each_iterations_prefill_and_decode_seconds_lie_within_the_time_since_the_last_one():
    """Arrivals at 0.5 s and 2 s: the clock jumps to each, and each iteration's prefill and decode seconds are the
    parts of its own time, never the seconds since the replay began."""
    requests = (TraceRequest(0, 6, 3, 0.5), TraceRequest(1, 6, 3, 2.0))
    trace = trace_from_dict(Trace(requests, "poisson", None, 0, {}).to_dict(), 96)
    _, _, outcome = replay(MODELS["gpt2"], trace, "static", 10**6, keep_logits=False)
    last = 0.0
    for it in outcome["iterations"]:  # each of the three is rounded to the microsecond
        assert 0 <= it["prefill_seconds"] and 0 <= it["decode_seconds"], it
        assert it["prefill_seconds"] + it["decode_seconds"] <= it["time"] - last + 3e-6, (it, last)
        last = it["time"]
    assert sum(it["prefill_tokens"] > 0 for it in outcome["iterations"]) == 2 and last > 2.0


def test_an_arrival_finer_than_a_nanosecond_still_gives_stamps_of_nine_decimals():
    """A trace file may give an arrival to any precision: the clock jumps to it, and the stamps after it are still
    kept to the clock's nanosecond (the 0.44 ns past 0.6 s are not written)."""
    requests = (TraceRequest(0, 6, 3, 0.60000000044),)
    trace = trace_from_dict(Trace(requests, "poisson", None, 0, {}).to_dict(), 96)
    _, _, outcome = replay(MODELS["gpt2"], trace, "static", 10**6, keep_logits=False)
    request = outcome["requests"][0]
    stamps = [request["admitted"], request["finished"], *request["token_times"]]
    assert 0 <= request["admitted"] - 0.6 < 2.0 and len(request["token_times"]) == 3  # at its arrival, plus a busy host
    assert all(stamp == round(stamp, 9) for stamp in stamps), stamps
    assert max(len(repr(stamp).partition(".")[2]) for stamp in stamps) <= 9


@pytest.mark.parametrize("prefix", [40, 64])
def test_a_prefix_that_is_no_multiple_of_the_token_budget_is_prefilled_once(prefix):
    trace = trace_of("fixed:16,4", requests=2, prefix=prefix)
    _, ledger, outcome = replay(MODELS["llama"], trace, "paged", 10**6, max_batched_tokens=32, block_size=8,
                                share_prefix=True)
    assert sum(it["prefill_tokens"] for it in outcome["iterations"]) == prefix + 2 * 16  # its last chunk: the rest
    assert ledger.pool.free_blocks == ledger.pool.num_blocks


def test_closed_loop_clients_send_at_0_and_then_when_their_previous_request_ends():
    _, _, outcome = replay(MODELS["gpt2"], trace_of("fixed:4,3", requests=5, arrivals="closed:2"), "static", 10**6,
                           keep_logits=False)
    done = outcome["requests"]
    assert [r["arrival"] for r in done[:2]] == [0.0, 0.0]  # each client's first request, at the start
    for earlier, later in zip(done, done[2:]):  # request i + 2 is client i % 2's next: sent when request i ends
        assert later["arrival"] == earlier["finished"] == earlier["token_times"][-1]
        assert later["admitted"] >= later["arrival"]


def test_a_fork_takes_only_the_blocks_the_holder_does_not_hold():
    """4 requests of a 16-token prefix and 5 own tokens, blocks of 8: a fork's prompt takes 1 block of its own (the
    copied partial one) beside the holder's 2, so all four are admitted in the iteration the holder is filled, in
    2 + 4 = 6 of 12 blocks (2 + 4 x 2 = 10 by their last tokens); counting the shared blocks again (3 + 2 a fork)
    would admit two, then one an iteration."""
    model = MODELS["llama"]
    trace = trace_of("fixed:5,6", requests=4, prefix=16)
    budget = 12 * admission.block_bytes(model.config, 8)
    _, ledger, outcome = replay(model, trace, "paged", budget, keep_logits=False, block_size=8, share_prefix=True)
    assert ledger.pool.num_blocks == 12
    first = outcome["iterations"][0]
    assert (first["admitted"], first["running"], first["free_blocks"]) == (4, 4, 12 - 2 - 4)
    assert sum(it["preempted"] for it in outcome["iterations"]) == 0


def test_serve_reports_each_gate_and_each_replay_kept_to_its_progress_callback():
    """Two kinds and the A/A control, 2 fixed rotations: the gates, a count of 0 before the first replay is timed,
    then one call per replay kept, named by its kind, as many as the record keeps samples."""
    from kvbench.measure.timing import Protocol
    from kvbench.serving.replay import serve

    model, trace = MODELS["llama"], trace_of(requests=4)
    budget = 2 * max(admission.minimum_budget(kind, model.config, trace) for kind in ("static", "paged"))
    settings = {"static": {"policy": "request"}, "paged": {"block_size": 16, "share_prefix": False}}
    events = []
    outcome = serve(model, trace, ["static", "paged"], budget, settings, Protocol.fixed(2, warmup=0),
                    on_progress=lambda *event: events.append(event))
    samples = outcome["sampling"].samples
    assert outcome["control"] == "static" and len(samples) == 2 * 3
    assert events[:3] == [(0, 2, "gate 1 of 2: static"), (1, 2, "gate 2 of 2: paged"), (0, 6, "replay")]
    assert events[3:] == [(k, 6, f"replay {k} of 6: {kept.mode}") for k, kept in enumerate(samples, 1)]


SCORED = [name for name, *_ in modes.SCORED_KINDS]


@pytest.mark.parametrize("kind", SCORED)
@pytest.mark.parametrize("family", list(MODELS))
def test_the_gate_holds_a_scored_kind_to_the_full_path_masked_to_what_each_request_kept(kind, family):
    """Batched decoding beside prompt chunks of any size (a budget of 3 tokens leaves one-token chunks), arrivals
    over time, cancellations: each request's logits are its own full path masked to what its own cache kept."""
    model = MODELS[family]
    trace = trace_of("uniform:3-40,2-12", requests=6, arrivals="poisson:400", cancel_fraction=0.3, cancel_after=1)
    options = {"options": {"kv_keep": 70 if kind in ("snapkv", "pyramidkv") else 4, "evict_every": 3}}
    for tokens in (None, 3):
        minimum = admission.minimum_budget(kind, model.config, trace, options=options["options"],
                                           max_batched_tokens=tokens)
        check = gate(model, trace, kind, int(minimum * 1.8), {**options, "max_batched_tokens": tokens})
        assert check["passed"], check
        assert check["tokens_checked"] == sum(r.emits for r in trace.requests) and check["max_concurrency"] > 1


def test_a_batch_that_masks_a_compressed_row_by_its_length_fails_the_gate(monkeypatch):
    """A row that kept 6 of its positions per head, masked as if it held them all (its keys 0..length), sees the
    padding past its own keys: the gate sees it. (Every head's mask has the same pattern over its own keys: each
    keeps as many as the others, all older than the step's query, which sees them all; the batch's (B, KVH, L, S)
    mask is tested in tests/test_batch.py.)"""
    monkeypatch.setattr(BatchedCache, "_mask_row", lambda self, b, held: None)
    trace = trace_of("fixed:24,8", requests=4)
    check = gate(MODELS["llama"], trace, "knorm", 10**6, {"options": {"kv_keep": 6}})
    assert not check["passed"] and check["failed_requests"]


def test_a_scored_kind_is_served_with_its_options_from_the_command_line(capsys, tmp_path):
    """--kv-keep and --evict-every reach the served kind's caches (their settings are in the record), its gate
    passes, and it reserves less than static once its prompts are compressed."""
    record = tmp_path / "r.json"
    code, out, err = run_main(capsys, "run", "--preset", "llama-tiny", "--trace", "fixed:40,6", "--requests", "4",
                              "--modes", "static,h2o", "--kv-keep", "8", "--evict-every", "2", "--repeats", "1",
                              "--output", record)
    assert code == 0, err
    data = json.loads(record.read_text())
    settings = data["serving"]["settings"]
    assert settings["h2o"]["options"] == {"kv_keep": 8, "evict_every": 2} and "options" not in settings["static"]
    check = next(check for check in data["checks"] if check["mode"] == "h2o")
    assert check["passed"] and check["tokens_checked"] == 4 * 6
    replays = {s["mode"]: s["replay"]["iterations"] for s in data["repetitions"]}
    assert min(it["reserved"] for it in replays["h2o"] if it["running"] == 4) < \
        min(it["reserved"] for it in replays["static"] if it["running"] == 4)


def test_every_stamp_is_kept_to_the_nanosecond_the_clock_counts():
    """Idle gaps are skipped by adding them as floats: without rounding a stamp would be written with 17 digits.
    Every stamp is seconds to 9 decimals (the clock's integer nanoseconds), and JSON writes it with no more."""
    trace = trace_of(lengths="fixed:4,3", requests=5, arrivals="poisson:3", seed=1)
    _, _, result = replay(MODELS["llama"], trace, "paged", 10**6, keep_logits=False)
    stamps = [stamp for request in result["requests"]
              for stamp in [request["admitted"], request["finished"], *request["token_times"], *request["token_cpu_times"]]]
    assert len(stamps) == 5 * 8 and all(stamp == round(stamp, 9) for stamp in stamps)
    assert max(len(repr(stamp).partition(".")[2]) for stamp in stamps) <= 9
    assert any(request["arrival"] > 0 for request in result["requests"])  # gaps were skipped: the sums were made
