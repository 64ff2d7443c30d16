"""kvbench.admission under the scheduler: what a kind is admitted with is what its caches ever allocate, so a replay
never holds more than its KV budget; and the budget's own parsing."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvbench import modes
from kvbench.serving import admission
from kvbench.cache import make_cache
from kvbench.model import build_model, preset_config
from kvbench.serving.scheduler import Ledger, Scheduler, TokenSource, make_ledger
from kvbench.serving.trace import make_trace, parse_arrivals, parse_lengths

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CONFIG = preset_config("llama-tiny", vocab_size=64, max_length=224)
MODEL = build_model(CONFIG, seed=0)
QUANTIZED = {"defaults": {}, "g16-r16": {"group_size": 16, "residual": 16}, "g8-r0": {"group_size": 8, "residual": 0}}
SCORED = [name for name, *_ in modes.SCORED_KINDS]  # they compress their prompts (kvbench.cache.scored)
EVICTION = {"defaults": {}, "g16-r16": {"evict_ratio": 0.75}, "g8-r0": {"kv_keep": 70, "evict_every": 2}}


def replay_watched(trace, kind, budget, options, tokens):
    """Replay `trace`, after every model call checking what the running caches allocated against the budget (a kind
    that compresses its prompt: what its tensors hold within its reservation, which only falls)."""
    ledger_options = {"block_size": 4} if kind == "paged" else {"options": options}
    ledger = make_ledger(MODEL, kind, budget, **ledger_options)
    scheduler = Scheduler(MODEL, trace, ledger, TokenSource(CONFIG.vocab_size, trace.seed, 0), False, tokens)
    forward, calls = scheduler.forward, []

    def watched(rows, counts):
        emitted = forward(rows, counts)
        if kind == "paged":  # one pool, allocated up front: blocks are taken from it, never beyond it
            held = ledger.pool.num_blocks - ledger.pool.free_blocks
            assert ledger.pool.nbytes <= budget and held * ledger.pool.block_bytes == ledger.held_bytes()
        else:  # what the caches really allocated, the tensors a long prefill chunk grows included
            allocated = sum(live.cache.reserved_bytes for live in scheduler.running)
            assert allocated <= budget, (allocated, budget)
            assert allocated == ledger.held_bytes()  # the ledger's `reserved` is the truth, not a lower bound
            for live in scheduler.running if kind in SCORED else ():
                assert live.cache.allocated_bytes <= live.cache.reserved_bytes == live.reserved
                assert live.reserved <= reserved.setdefault(live.spec.id, live.reserved)  # given back, never taken
                reserved[live.spec.id] = live.reserved
        calls.append(sum(counts))
        return emitted

    reserved: dict[int, int] = {}
    scheduler.forward = watched
    outcome = scheduler.run()
    return scheduler, ledger, outcome, calls


def test_a_quantized_prefill_longer_than_the_window_is_admitted_with_its_peak():
    """The review's case: 4 requests of (300, 10), a budget of two reservations: the caches grew 1.67x (int8) past
    the budget while the record said reserved = budget."""
    config = preset_config("llama-tiny", vocab_size=64, max_length=320)
    model = build_model(config, seed=0)
    trace = make_trace({**parse_lengths("fixed:300,10"), **parse_arrivals("all"), "requests": 4}, 0, 320)
    for kind, tokens in (("quantized-int8", None), ("quantized-int4", None), ("quantized-int8", 64)):
        budget = 2 * admission.minimum_budget(kind, config, trace, max_batched_tokens=tokens)
        window = 300 if tokens is None else 64 + 128 + 32 - 1  # the longest chunk after a window one short of full
        assert budget == 2 * admission.quantized_reserved_bytes(config, 309, admission.QUANTIZED_BITS[kind],
                                                                 recent_positions=window)
        ledger = make_ledger(model, kind, budget)
        scheduler = Scheduler(model, trace, ledger, TokenSource(64, 0, 0), False, tokens)
        most = 0
        iterate = scheduler.iterate

        def watched():
            nonlocal most
            iterate()
            most = max(most, sum(live.cache.reserved_bytes for live in scheduler.running))

        scheduler.iterate = watched
        outcome = scheduler.run()
        assert most == budget and max(it["reserved"] for it in outcome["iterations"]) == budget, kind
        assert max(it["running"] for it in outcome["iterations"]) == 2


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), requests=st.integers(1, 4), kind=st.sampled_from(
       ["static", "paged", "quantized-int8", "quantized-int4", *SCORED]), quantized=st.sampled_from(sorted(QUANTIZED)),
       tokens=st.one_of(st.none(), st.integers(1, 48), st.integers(100, 224)), slack=st.floats(1.0, 2.5),
       data=st.data())
def test_no_replay_ever_holds_more_than_its_budget(seed, requests, kind, quantized, tokens, slack, data):
    options = QUANTIZED[quantized] if kind.startswith("quantized") else EVICTION[quantized] if kind in SCORED else {}
    longest = 200 if quantized == "defaults" else 48  # beyond the window (residual + group) and its chunks
    prompt = data.draw(st.integers(1, longest), label="prompt")
    lengths = f"uniform:{data.draw(st.integers(1, prompt), label='shortest')}-{prompt},1-6"
    trace = make_trace({**parse_lengths(lengths), **parse_arrivals("all"), "requests": requests}, seed, 224)
    minimum = admission.minimum_budget(kind, CONFIG, trace, block_size=4, options=options, max_batched_tokens=tokens)
    budget = int(minimum * slack)
    scheduler, ledger, outcome, calls = replay_watched(trace, kind, budget, options, tokens)
    assert all(live.emitted == live.spec.emits for live in scheduler.lives)
    assert all(it["reserved"] <= budget for it in outcome["iterations"])
    assert ledger.held_bytes() == 0 and calls


@settings(max_examples=60, deadline=None)
@given(quantized=st.sampled_from(sorted(QUANTIZED)), bits=st.sampled_from(["quantized-int8", "quantized-int4"]),
       tokens=st.one_of(st.none(), st.integers(1, 64)), data=st.data())
def test_the_window_a_chunk_rule_reaches_is_quantized_window(quantized, bits, tokens, data):
    """Fed its prompt in any chunks of at most `tokens`, then decoded, a cache made with its least window allocates at
    most what quantized_window counts, and exactly that when a chunk of the whole budget follows a window one short of
    full; a cache made with that window never allocates more."""
    options = QUANTIZED[quantized]
    group, residual = options.get("group_size", 32), options.get("residual", 128)
    prompt = data.draw(st.integers(1, 200), label="prompt")
    capacity = prompt + data.draw(st.integers(0, 8), label="decoded")
    window = admission.quantized_window(prompt, capacity, tokens, group, residual)
    counted = admission.quantized_reserved_bytes(CONFIG, capacity, admission.QUANTIZED_BITS[bits], group, residual,
                                                 window)
    longest = prompt if tokens is None else tokens
    worst = [] if prompt <= longest else [min(residual + group - 1, prompt - longest)]  # then chunks of `longest`
    chunks = data.draw(st.sampled_from([worst, None]), label="adversarial") if worst else None
    fed, sizes = sum(chunks or []), list(chunks or [])
    while fed < prompt:
        sizes.append(longest if chunks else data.draw(st.integers(1, min(longest, prompt - fed)), label="chunk"))
        sizes[-1] = min(sizes[-1], prompt - fed)
        fed += sizes[-1]
    sizes += [1] * (capacity - prompt)
    ids = torch.randint(0, CONFIG.vocab_size, (1, capacity), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        least = make_cache(bits, CONFIG, 1, capacity, **options)
        sized = make_cache(bits, CONFIG, 1, capacity, **options, recent_positions=window)
        assert sized.reserved_bytes == counted
        start = 0
        for size in sizes:
            grown, _ = MODEL(ids[:, start : start + size], least)
            allocated, _ = MODEL(ids[:, start : start + size], sized)
            assert torch.equal(grown, allocated)  # the same arithmetic, only where the window lives differs
            start += size
            assert least.reserved_bytes <= counted and sized.reserved_bytes == counted
    if chunks:
        assert least.reserved_bytes == counted  # the bound is reached: counting less would be a lie


@pytest.mark.parametrize("recent, capacity", [(159, 200), (201, 200), (True, 200), (8, 8 + 1)])
def test_a_window_outside_least_and_capacity_is_refused(recent, capacity):
    least = min(capacity, 128 + 32)
    with pytest.raises(ValueError, match=rf"recent_positions must be an integer in \[{least}, capacity {capacity}\], "
                                         rf"got {recent!r}"):
        make_cache("quantized-int8", CONFIG, 1, capacity, recent_positions=recent)


def test_a_ledger_admits_with_the_chunk_rule_it_is_given():
    """The scheduler hands its token budget to the ledger: the same request costs more when it is prefilled whole."""
    trace = make_trace({**parse_lengths("fixed:200,4"), **parse_arrivals("all"), "requests": 1}, 0, 224)
    costs = {}
    for tokens in (None, 8):
        ledger = Ledger(MODEL, "quantized-int8", 10**9, "request", None)
        scheduler = Scheduler(MODEL, trace, ledger, TokenSource(64, 0, 0), False, tokens)
        live = scheduler.lives[0]
        assert ledger.admit(live, tokens)
        costs[tokens] = live.reserved
        assert live.cache.reserved_bytes == live.reserved == ledger.held_bytes()
        ledger.release(live)
    per_position = 2 * CONFIG.layers * CONFIG.kv_heads * CONFIG.head_dim * 4  # full-precision keys and values
    assert costs[None] - costs[8] == (200 - (8 + 128 + 32 - 1)) * per_position


@pytest.mark.parametrize("text, expected", [
    ("1KiB", 1024), ("3 kib", 3 * 1024), ("1.5KiB", 1536), ("2MB", 2_000_000), ("2 mb", 2_000_000),
    ("64MiB", 64 * 2**20), ("1.5GB", 1_500_000_000), ("3gb", 3_000_000_000), ("1GiB", 2**30), ("7kB", 7000),
    ("1e3", 1000), ("12b", 12), ("  4096  ", 4096), ("50%", 500), ("100%", 1000),
    ("1", 1), ("0.5%", 5),  # the smallest budget, and a share below 1%
])
def test_parse_budget_reads_every_unit_to_the_byte(text, expected):
    assert admission.parse_budget(text, 1000) == expected


@pytest.mark.parametrize("text, available, fragment", [
    ("12 parsecs", 1000, "--kv-budget must be bytes ('64MiB', '1048576') or a share of free memory ('25%'), "
                         "got '12 parsecs'"),
    ("5TB", 1000, "got '5TB'"),
    ("-1MB", 1000, "got '-1MB'"),
    ("0.5", 1000, "--kv-budget must be at least 1 byte, got '0.5'"),
    ("0KiB", 1000, "at least 1 byte, got '0KiB'"),
    ("0%", 1000, "a share of free memory must be in (0, 100]%"),
    ("101%", 1000, "a share of free memory must be in (0, 100]%"),
    ("25%", None, "and free memory is unknown here"),
])
def test_parse_budget_refusals_name_what_they_got(text, available, fragment):
    with pytest.raises(ValueError) as refused:
        admission.parse_budget(text, available)
    assert fragment in str(refused.value)


def test_an_unknown_policy_or_kind_is_refused_naming_it():
    config = preset_config("llama-mini")
    trace = make_trace({**parse_lengths("fixed:8,4"), **parse_arrivals("all"), "requests": 2}, 0, config.max_length)
    with pytest.raises(ValueError, match=r"reserve policy must be one of \['request', 'max-length'\], got 'forever'"):
        admission.capacity(trace.requests[0], config, "forever")
    with pytest.raises(ValueError, match="a reserving kind is one of static, quantized-int8, quantized-int4, knorm, "
                                         "snapkv, tova, h2o, pyramidkv, streamingllm, random; got 'paged'"):
        admission.reservation("paged", config, 16)
    with pytest.raises(ValueError, match="a serving kind is one of .*, got 'concat'"):
        admission.minimum_budget("concat", config, trace)


@pytest.mark.parametrize("kind", SCORED)
@pytest.mark.parametrize("options", [{}, {"kv_keep": 70, "evict_every": 3}, {"evict_ratio": 0.25}])
@pytest.mark.parametrize("policy", ["request", "max-length"])
def test_a_compressing_kind_is_admitted_with_what_its_cache_reserves(kind, options, policy):
    """The torch-free reservation (its spec's `reserve`, with what the kind keeps to score with) is what a fresh cache
    made for the request reserves, and the most it ever holds: its uncompressed prompt, or its budget and the steps
    since if those come to more."""
    state = make_cache(kind, CONFIG, 1, 8).state_kept()  # the class's, which the spec's table must repeat
    assert {"observation": 0, "totals": False, **modes.SCORED_STATE.get(kind, {})} == state
    trace = make_trace({**parse_lengths("uniform:1-150,1-40"), **parse_arrivals("all"), "requests": 6}, 3, 224)
    for request in trace.requests:
        capacity = admission.capacity(request, CONFIG, policy)
        made = admission.cache_options(kind, request, capacity, options, 16)
        assert made["prompt"] == request.prompt
        cache = make_cache(kind, CONFIG, 1, capacity, **made, history=True)
        assert admission.reservation(kind, CONFIG, capacity, {**made, "history": True}) == cache.reserved_bytes
    with pytest.raises(ValueError, match=f"{kind} reserves for a request's prompt: expected options with its 'prompt'"):
        admission.reservation(kind, CONFIG, 16, options)


def test_a_compressing_kind_admits_more_once_its_prompts_are_compressed():
    """Under the budget of two static requests (183 positions of 512 bytes each), knorm at ratio 0.75 is admitted on
    its prompt's peak (160 positions of 544 bytes: keys, values and positions) and keeps 40 of them from its first
    decoding step on, 63 at most: two compressed requests and a third's prompt fit, a fourth's prompt then does
    not (3 x 63 + 160 positions of 544 bytes is above the budget)."""
    trace = make_trace({**parse_lengths("fixed:160,24"), **parse_arrivals("all"), "requests": 8}, 0, 224)
    budget = 2 * admission.minimum_budget("static", CONFIG, trace)
    peaks = {}
    for kind, options in (("static", {}), ("knorm", {"evict_ratio": 0.75})):
        scheduler, ledger, outcome, _ = replay_watched(trace, kind, budget, options, 64)
        iterations = outcome["iterations"]
        peaks[kind] = max(it["running"] for it in iterations)
        assert all(live.emitted == live.spec.emits for live in scheduler.lives) and ledger.held_bytes() == 0
        assert all(it["reserved"] <= budget for it in iterations)
    assert peaks == {"static": 2, "knorm": 3}
