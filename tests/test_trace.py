"""kvbench.serving.trace and kvbench.serving.admission: seeded traces, their checks, and what a request costs a
budget."""

import json
import math
import statistics

import pytest

from kvbench.config import PlainConfig
from kvbench.serving import admission
from kvbench.serving.trace import PUBLISHED_MEANS, make_trace, parse_arrivals, parse_lengths, trace_from_dict

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


def test_chat_lengths_have_the_published_means():
    trace = make_trace(spec("chat", requests=3000), seed=0, max_positions=CONFIG.max_length)
    mean_in, mean_out = PUBLISHED_MEANS["chat"]
    assert statistics.mean(r.prompt for r in trace.requests) == pytest.approx(mean_in, rel=0.06)
    assert statistics.mean(r.output for r in trace.requests) == pytest.approx(mean_out, rel=0.06)


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
    (spec("fixed:4000,200"), "beyond max_length 4096"),
    (spec(cancel_fraction=0.5, cancel_after=0), "cancel after must be a positive integer"),
])
def test_bad_specs_are_refused_naming_the_value(bad, fragment):
    with pytest.raises(ValueError, match=fragment):
        make_trace(bad, seed=0, max_positions=CONFIG.max_length)


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
])
def test_bad_trace_files_are_refused(data, fragment):
    with pytest.raises(ValueError, match=fragment):
        trace_from_dict(data, CONFIG.max_length)


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
