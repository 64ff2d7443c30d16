"""kvbench.serving.trace and kvbench.serving.admission: seeded traces, their checks, and what a request costs a
budget."""

import json
import math
import statistics

import pytest

from kvbench.config import PlainConfig
from kvbench.serving import admission
from kvbench.serving.sharing import make_shaped, parse_shape
from kvbench.serving.trace import (PUBLISHED_MEANS, Trace, TraceRequest, check_rate, check_spec, check_trace,
                                   make_trace, parse_arrivals, parse_lengths, trace_from_dict)

CONFIG = PlainConfig.from_preset("llama-mini")


def spec(lengths="uniform:4-20,2-10", arrivals="all", requests=8, **more):
    return {**parse_lengths(lengths), **parse_arrivals(arrivals), "requests": requests, **more}


def test_a_trace_is_seeded_and_survives_its_file():
    trace = make_trace(spec(arrivals="poisson:5", prefix=8, prefix_fraction=0.5, cancel_fraction=0.5, cancel_after=1),
                       seed=3, max_positions=CONFIG.max_length)
    again = make_trace(spec(arrivals="poisson:5", prefix=8, prefix_fraction=0.5, cancel_fraction=0.5, cancel_after=1),
                       seed=3, max_positions=CONFIG.max_length)
    other = make_trace(spec(arrivals="poisson:5"), seed=4, max_positions=CONFIG.max_length)
    assert trace == again and trace.requests != other.requests
    assert trace_from_dict(json.loads(json.dumps(trace.to_dict())), CONFIG.max_length) == trace
    arrivals = [r.arrival for r in trace.requests]
    assert arrivals == sorted(arrivals) and arrivals[-1] > 0
    assert {r.prefix for r in trace.requests} == {0, 8}
    assert all(r.prompt > r.prefix and (r.cancel_after is None or r.cancel_after < r.output) for r in trace.requests)


@pytest.mark.parametrize("lengths, mean_in, mean_out", [
    ("chat", 161.31, 337.99),  # ShareGPT, as Kwon et al. (SOSP 2023, Fig. 11) publish it
    ("alpaca", 19.31, 58.45),  # Alpaca, the same figure
])
def test_a_large_drawn_trace_has_the_papers_means(lengths, mean_in, mean_out):
    """The numbers are the paper's, written here, not read from the module: a wrong constant fails too. 20,000
    requests put the sample mean within about 0.7% of the log-normal's (its SD is 0.95 x its mean at sigma 0.8);
    a max_length far beyond the tail keeps the cap from trimming it."""
    assert PUBLISHED_MEANS[lengths] == (mean_in, mean_out)
    trace = make_trace(spec(lengths, requests=20_000), seed=1, max_positions=1 << 16)
    assert statistics.mean(r.prompt for r in trace.requests) == pytest.approx(mean_in, rel=0.03)
    assert statistics.mean(r.output for r in trace.requests) == pytest.approx(mean_out, rel=0.03)


def test_every_request_draws_its_own_ids_from_the_trace_seed():
    """scheduler.TokenSource: the same (seed, request) gives the same ids; another seed or another request, others;
    the shared prefix is the same ids for every request that carries it."""
    from kvbench.serving.scheduler import TokenSource

    trace = make_trace(spec("fixed:24,8", requests=3, prefix=8), seed=0, max_positions=CONFIG.max_length)
    first, second = trace.requests[:2]
    ids = {seed: TokenSource(CONFIG.vocab_size, seed, trace.prefix).ids for seed in (0, 1)}
    assert ids[0](first).tolist() == TokenSource(CONFIG.vocab_size, 0, trace.prefix).ids(first).tolist()
    assert ids[0](first).shape == (1, first.positions) and int(ids[0](first).max()) < CONFIG.vocab_size
    own = lambda seed, request: ids[seed](request)[0, request.prefix:].tolist()  # noqa: E731
    assert own(0, first) != own(1, first)  # another seed
    assert own(0, first) != own(0, second)  # another request
    assert ids[0](first)[0, :8].tolist() == ids[0](second)[0, :8].tolist() != ids[1](first)[0, :8].tolist()


def test_seed_0_draws_the_same_trace_in_every_version():
    """The draw order is part of the seed's meaning: prefix share, output, prompt, cancellation, then the gap."""
    trace = make_trace(spec(arrivals="poisson:5", requests=4, prefix=3, prefix_fraction=0.5, cancel_fraction=0.5,
                            cancel_after=2), seed=0, max_positions=CONFIG.max_length)
    assert [(r.prompt, r.output, r.arrival, r.prefix, r.cancel_after) for r in trace.requests] == [
        (17, 3, 0.204673, 0, 2), (16, 8, 0.435612, 0, None), (8, 9, 0.780099, 3, 2), (11, 10, 1.301312, 3, None)]
    plain = make_trace(spec(arrivals="poisson:5", requests=3), seed=0, max_positions=CONFIG.max_length)
    assert [(r.prompt, r.output, r.arrival) for r in plain.requests] == [
        (11, 10, 0.080143), (16, 10, 0.114047), (18, 6, 0.12094)]  # no prefix, no cancellation: no draws for them
    assert trace.prefix == 3 and plain.prefix == 0


def test_a_request_holds_its_prompt_and_every_output_but_the_last():
    request = TraceRequest(0, prompt=10, output=5, arrival=0.0)
    assert (request.positions, request.emits) == (14, 5)
    assert TraceRequest(0, 10, 5, 0.0, cancel_after=2).emits == 2
    assert make_trace(spec("fixed:4000,97"), seed=0, max_positions=4096).requests[0].positions == 4096  # just fits
    with pytest.raises(ValueError, match="holds 4097 positions, beyond max_length 4096"):
        make_trace(spec("fixed:4000,98"), seed=0, max_positions=4096)


def test_a_cancellation_at_the_whole_output_is_no_cancellation():
    trace = make_trace(spec("fixed:4,3", cancel_fraction=1.0, cancel_after=3), seed=0, max_positions=64)
    assert [r.cancel_after for r in trace.requests] == [None] * 8
    assert [r.cancel_after for r in make_trace(spec("fixed:4,4", cancel_fraction=1.0, cancel_after=3), seed=0,
                                               max_positions=64).requests] == [3] * 8


def test_drawn_chat_lengths_are_capped_to_fit_the_model():
    """An output is at most half of max_length, a prompt at most what the output leaves: chat's means (161 in, 338
    out) are far beyond a 64-position model, so nearly every request is drawn at both caps and fits."""
    requests = make_trace(spec("chat", requests=20), seed=0, max_positions=64).requests
    assert {r.output for r in requests} == {32}  # 64 // 2
    assert max(r.prompt for r in requests) == 32 and min(r.prompt for r in requests) >= 1  # 64 - 32
    assert max(r.positions for r in requests) == 63


def test_a_drawn_trace_is_checked_against_the_model_too():
    """Chat lengths are capped by max_positions, but a shared prefix can still carry a request past it."""
    with pytest.raises(ValueError, match="beyond max_length 10"):
        make_trace(spec("chat", requests=20, prefix=8), seed=0, max_positions=10)


@pytest.mark.parametrize("text, parse", [("bogus", parse_lengths), ("fixed:4", parse_lengths), ("chat:3", parse_lengths),
                                         ("all:5", parse_arrivals), ("poisson", parse_arrivals), ("x:1", parse_arrivals)])
def test_bad_length_and_arrival_texts_are_refused(text, parse):
    with pytest.raises(ValueError, match=f"got {text!r}"):
        parse(text)


def test_closed_loop_requests_belong_to_clients_in_turn():
    trace = make_trace(spec(arrivals="closed:3", requests=7), seed=0, max_positions=CONFIG.max_length)
    assert [r.client for r in trace.requests] == [0, 1, 2, 0, 1, 2, 0]
    assert all(r.arrival is None for r in trace.requests)


@pytest.mark.parametrize("bad, fragment", [
    (spec(requests=0), "requests must be a positive integer"),
    (spec(arrivals="poisson:0"), "poisson rate must be a positive finite number"),
    (spec(arrivals="poisson:-2"), "poisson rate"),
    (spec(arrivals="poisson:nan"), "poisson rate"),
    (spec(arrivals="poisson:inf"), "poisson rate"),
    (spec(arrivals="closed:0"), "closed-loop clients"),
    (spec("fixed:0,4"), "prompt length must be a positive integer"),
    (spec("uniform:9-3,2-4"), "low <= high"),
    (spec("uniform:3-0,2-4"), "prompt length must be a positive integer, got 0"),  # the high end checked too
    (spec("uniform:0-3,2-4"), "prompt length must be a positive integer, got 0"),  # and the low end
    (spec("fixed:4000,200"), "beyond max_length 4096"),
    (spec(cancel_fraction=0.5, cancel_after=0), "cancel after must be a positive integer"),
    # a rate so low its arrivals are beyond float seconds' resolution, or so high its gaps round to 0
    (spec(arrivals="poisson:1e-300"), "poisson rate 1e-300 requests/s spreads 8 requests over about 8e+300 s, "
                                      "beyond the 1e+07 s a trace may span: expected a rate >= 8e-07"),
    (spec(arrivals="poisson:1e-7"), "spreads 8 requests over about 8e+07 s"),
    (spec(arrivals="poisson:1e300"), "poisson rate must be at most 1e+06 requests/s"),
    (spec(requests=200_000), "requests must be at most 100000, got 200000"),
    (spec(prefix=-3), "shared prefix must be a positive integer, got -3"),
    (spec(prefix=2.5), "shared prefix must be a positive integer, got 2.5"),
    (spec(prefix=4, prefix_fraction=1.5), "prefix fraction must be a fraction in [0, 1], got 1.5"),
    (spec(prefix=4, prefix_fraction=True), "prefix fraction must be a fraction in [0, 1], got True"),
    (spec(cancel_fraction=-0.5, cancel_after=1), "cancel fraction must be a fraction in [0, 1], got -0.5"),
    (spec(cancel_fraction="0.5", cancel_after=1), "cancel fraction must be a fraction in [0, 1], got '0.5'"),
])
def test_bad_specs_are_refused_naming_the_value(bad, fragment):
    with pytest.raises(ValueError) as refused:
        make_trace(bad, seed=0, max_positions=CONFIG.max_length)
    assert fragment in str(refused.value)


def closed_file():
    return make_trace(spec(arrivals="closed:2", requests=3), seed=0, max_positions=CONFIG.max_length).to_dict()


def saved(**change):
    data = make_trace(spec(arrivals="poisson:2", requests=3), seed=0, max_positions=CONFIG.max_length).to_dict()
    data["requests"][1].update(change)
    return data


@pytest.mark.parametrize("data, fragment", [
    ([], "schema"),
    ({"schema": "other"}, "schema"),
    ({**saved(), "requests": [{"id": 0}]}, "exactly the fields"),
    (saved(id=5), "ids must count from 0"),
    (saved(arrival=-1.0), "arrival must be a finite number"),
    (saved(arrival=0.0), "arrivals must not decrease"),
    (saved(output=0), "output must be a positive integer"),
    (saved(cancel_after=10_000), "beyond its output"),
    (saved(prompt=5000), "beyond max_length"),
    (saved(prefix=10_000), "shared prefix must be in"),
    (saved(prompt=0), "request 1 prompt must be a positive integer"),
    (saved(cancel_after=0), "request 1 cancel_after must be a positive integer"),
    (saved(output=4, cancel_after=4), "cancellation after 4 tokens is beyond its output of 4"),
    ({**saved(), "requests": [{**row, "prefix": 1 + (row["id"] > 0)} for row in saved()["requests"]]}, "one prefix length, got [1, 2]"),
    ({**saved(), "spec": 5}, "spec: expected an object (how the trace was drawn), got int"),
    ({**saved(), "spec": ["chat"]}, "spec: expected an object (how the trace was drawn), got list"),
    (saved(client=0), "request 1: client is only a closed-loop request's (null with arrivals 'poisson'), got 0"),
    ({**saved(), "clients": 2}, "clients: a trace with arrivals 'poisson' has no clients (null), got 2"),
    (saved(arrival=1e300), "request 1: arrival must be at most 1e+07 s after the start, got 1e+300"),
    (saved(id=True), "ids must count from 0 in order, got id True"),
    (saved(prefix=[1]), "request 1: shared prefix must be in [0, prompt"),
    ({**saved(), "seed": -1}, "a trace's seed must be an integer >= 0, got -1"),
    ({**closed_file(), "clients": 0}, "clients must be a positive integer, got 0"),
])
def test_bad_trace_files_are_refused(data, fragment):
    with pytest.raises(ValueError) as refused:
        trace_from_dict(data, CONFIG.max_length)
    assert fragment in str(refused.value)


def test_a_trace_file_holds_no_more_requests_than_a_run_may_draw():
    """200,000 requests, twice what `--requests` allows, are refused before one is built; 100,000 are read."""
    from kvbench.cli import CliError, build_parser

    def rows(count):
        return [{"id": i, "prompt": 4, "output": 3, "arrival": 0.0, "client": None, "prefix": 0, "cancel_after": None}
                for i in range(count)]

    data = {"schema": "kvbench.trace/1", "seed": 0, "arrivals": "all", "clients": None, "spec": {}}
    with pytest.raises(ValueError, match="a trace holds at most 100000 requests, got 200000"):
        trace_from_dict({**data, "requests": rows(200_000)}, CONFIG.max_length)
    assert len(trace_from_dict({**data, "requests": rows(100_000)}, CONFIG.max_length).requests) == 100_000
    with pytest.raises(CliError, match=r"--requests: expected an integer in \[1, 100000\]"):  # the same cap
        build_parser().parse_args(["run", "--trace", "chat", "--requests", "100001"])


def test_a_file_of_too_many_requests_is_refused_before_one_is_built(monkeypatch):
    from kvbench.serving import trace as module

    def built(**row):
        raise AssertionError("a request was built from a file that holds too many")

    monkeypatch.setattr(module, "TraceRequest", built)
    row = {"id": 0, "prompt": 4, "output": 3, "arrival": 0.0, "client": None, "prefix": 0, "cancel_after": None}
    data = {"schema": "kvbench.trace/1", "seed": 0, "arrivals": "all", "clients": None, "spec": {},
            "requests": [row] * 100_001}
    with pytest.raises(ValueError, match="a trace holds at most 100000 requests, got 100001"):
        trace_from_dict(data, CONFIG.max_length)


def test_the_caps_themselves_are_allowed():
    """Each limit is a maximum, not a bound never reached: 100,000 requests, 1e6 requests/s, a trace spanning
    1e7 s, a request of exactly max_length positions (its output's high end counted)."""
    check_spec(spec(requests=100_000), CONFIG.max_length)
    check_rate(1e6, 8)
    check_rate(1.0, 10_000_000)  # 1e7 requests at 1/s: about 1e7 s
    data = saved()
    data["requests"][2]["arrival"] = 1e7
    assert trace_from_dict(data, CONFIG.max_length).requests[2].arrival == 1e7
    check_spec(spec("uniform:4-4,2-97"), 100)
    with pytest.raises(ValueError, match="holds 101 positions, beyond max_length 100"):  # the output's high end
        check_spec(spec("uniform:4-4,2-98"), 100)
    check_spec(spec(prefix=4, prefix_fraction=0, cancel_fraction=1, cancel_after=1), CONFIG.max_length)  # both ends


def test_just_beyond_the_trace_span_is_refused():
    """1e7 s is the last second a trace may reach: half a second more, or one request more at 1/s, is refused."""
    with pytest.raises(ValueError, match=r"spreads 10000001 requests over about 1e\+07 s, beyond the 1e\+07 s a trace "
                                         r"may span: expected a rate >= 1$"):  # 1.0000001 to 6 digits
        check_rate(1.0, 10_000_001)
    data = saved()
    data["requests"][2]["arrival"] = 10_000_000.5
    with pytest.raises(ValueError, match=r"request 2: arrival must be at most 1e\+07 s after the start"):
        trace_from_dict(data, CONFIG.max_length)


def test_a_trace_is_frozen_and_one_without_requests_shares_no_prefix():
    import dataclasses

    trace = make_trace(spec(), seed=0, max_positions=CONFIG.max_length)
    with pytest.raises(dataclasses.FrozenInstanceError):
        trace.seed = 1  # a record keeps the trace it was measured on: nothing changes it after the draw
    assert Trace((), "all", None, 0, {}).prefix == 0


def test_budget_parsing():
    assert admission.parse_budget("64MiB", None) == 64 * 2**20
    assert admission.parse_budget("1048576", None) == 2**20
    assert admission.parse_budget("25%", 4000) == 1000
    for bad in ("", "-5", "0", "12 parsecs", "150%", "nan"):
        with pytest.raises(ValueError, match="kv-budget"):
            admission.parse_budget(bad, 4000)


def test_what_each_kind_reserves_matches_its_cache():
    import torch

    from kvbench.cache import make_cache
    from kvbench.model import DecoderConfig

    config = DecoderConfig.from_dict(CONFIG.to_dict())
    for kind in ("static", "quantized-int8", "quantized-int4"):
        for capacity in (5, 160, 300):
            with torch.inference_mode():
                cache = make_cache(kind, config, 1, capacity)
            assert admission.reservation(kind, CONFIG, capacity) == cache.reserved_bytes, (kind, capacity)
    assert admission.block_bytes(CONFIG, 16) == 16 * admission.bytes_per_position(CONFIG)
    assert math.isclose(admission.bytes_per_position(CONFIG), 2 * 4 * 2 * 32 * 4)


def test_minimum_budget_is_the_largest_request_alone():
    trace = make_trace(spec("fixed:40,10", requests=3, prefix=16), seed=0, max_positions=CONFIG.max_length)
    per_position = admission.bytes_per_position(CONFIG)
    assert admission.minimum_budget("static", CONFIG, trace) == 65 * per_position  # 40 + 16 + 10 - 1 positions
    assert admission.minimum_budget("static", CONFIG, trace, "max-length") == 4096 * per_position
    assert admission.minimum_budget("paged", CONFIG, trace) == 5 * 16 * per_position
    assert admission.minimum_budget("paged", CONFIG, trace, share_prefix=True) == 6 * 16 * per_position


def conversation(**change):
    """Two conversations of two turns (messages of 4 tokens, outputs of 3), as a file; `change` edits request 2, the
    second turn of conversation 0 (its parent request 0: prompt 4 and output 3, a history of 7 tokens)."""
    data = make_shaped(parse_shape("multi-turn:2,2,4,3"), seed=0, max_positions=CONFIG.max_length).to_dict()
    data["requests"][2].update(change)
    return data


def test_a_later_turn_extends_its_parents_whole_history_by_at_least_one_token():
    trace = trace_from_dict(conversation(), CONFIG.max_length)
    assert [(r.prompt, r.output, r.parent, r.prefix, r.group) for r in trace.requests] == [
        (4, 3, None, 0, None), (4, 3, None, 0, None), (11, 3, 0, 0, None), (11, 3, 1, 0, None)]
    assert trace.prefix == 0  # a request built without a prefix shares none
    assert trace_from_dict(conversation(prompt=8), CONFIG.max_length).requests[2].prompt == 8  # one token more


@pytest.mark.parametrize("change, fragment", [
    ({"parent": 2}, "request 2: a turn's parent is an earlier request (0 to 1), got 2"),  # itself
    ({"parent": 3}, "request 2: a turn's parent is an earlier request (0 to 1), got 3"),  # a later request
    ({"parent": -1}, "request 2: a turn's parent is an earlier request (0 to 1), got -1"),
    ({"parent": "0"}, "request 2: a turn's parent is an earlier request (0 to 1), got '0'"),
    ({"parent": 0.0}, "request 2: a turn's parent is an earlier request (0 to 1), got 0.0"),
    ({"parent": True}, "request 2: a turn's parent is an earlier request (0 to 1), got True"),
    ({"prefix": 3}, "request 2: a later turn carries its conversation's prefix in its history: expected prefix 0 and "
                    "no group, got prefix 3 and group None"),
    ({"prefix": 3, "group": 0}, "expected prefix 0 and no group, got prefix 3 and group 0"),
    ({"prompt": 7}, "request 2: a turn is its history's extension: its prompt must hold request 0's prompt 4 and "
                    "whole output 3 (7 tokens, not cancelled) and a new message, got prompt 7"),
])
def test_a_turn_that_does_not_extend_an_earlier_requests_history_is_refused(change, fragment):
    with pytest.raises(ValueError) as refused:
        trace_from_dict(conversation(**change), CONFIG.max_length)
    assert str(refused.value).endswith(fragment)


def test_a_turn_after_a_cancelled_parent_is_refused_whatever_its_prompt():
    """A cancelled turn has no whole output for the next turn's history to hold."""
    data = conversation()
    data["requests"][0]["cancel_after"] = 1
    with pytest.raises(ValueError) as refused:
        trace_from_dict(data, CONFIG.max_length)
    assert str(refused.value) == ("request 2: a turn is its history's extension: its prompt must hold request 0's "
                                  "prompt 4 and whole output 3 (7 tokens, not cancelled) and a new message, got "
                                  "prompt 11 after a cancelled parent")


def shared(**change):
    """Two groups of two requests sharing a system prompt of 8 tokens (questions of 4, outputs of 3), as a file;
    `change` edits request 1."""
    data = make_shaped(parse_shape("shared-prefix:2,2,8,4,3"), seed=0, max_positions=CONFIG.max_length).to_dict()
    data["requests"][1].update(change)
    return data


@pytest.mark.parametrize("change, fragment", [
    ({"group": -1}, "request 1 group must be an integer >= 0, got -1"),
    ({"group": "0"}, "request 1 group must be an integer >= 0, got '0'"),
    ({"group": False}, "request 1 group must be an integer >= 0, got False"),
    ({"prefix": 0}, "request 1: group 0 names a shared prefix, and its prefix is 0"),
])
def test_a_group_is_a_count_and_names_a_shared_prefix(change, fragment):
    assert [r.group for r in trace_from_dict(shared(), CONFIG.max_length).requests] == [1, 0, 1, 0]
    with pytest.raises(ValueError) as refused:
        trace_from_dict(shared(**change), CONFIG.max_length)
    assert str(refused.value) == fragment


def test_a_hand_built_trace_is_checked_for_its_structure_too():
    """check_trace, not only a file's reader, refuses a turn whose parent is not before it."""
    requests = (TraceRequest(0, 4, 3, 0.0), TraceRequest(1, 8, 3, 0.0, parent=1))
    with pytest.raises(ValueError, match=r"request 1: a turn's parent is an earlier request \(0 to 0\), got 1"):
        check_trace(Trace(requests, "all", None, 0, {}), CONFIG.max_length)
    check_trace(Trace((requests[0], TraceRequest(1, 8, 3, 0.0, parent=0)), "all", None, 0, {}), CONFIG.max_length)
