"""kvbench.serving_figures: one replay's figures from its raw timestamps and iterations, checked by hand."""

import pytest

from kvbench.serving import figures as serving_figures

# Three requests: the middle one gets a single token (no TPOT, no ITL, no CPU step); the last one's first CPU
# time (2.0) is below an earlier request's last (1.25 < 2.0 < 2.5), so the CPU makespan is read at the last token.
REQUESTS = [
    {"arrival": 0.0, "admitted": 0.5, "token_times": [1.0, 1.5, 2.5], "token_cpu_times": [0.5, 0.75, 1.25]},
    {"arrival": 1.0, "admitted": 1.0, "token_times": [2.0], "token_cpu_times": [1.0]},
    {"arrival": 2.0, "admitted": 3.0, "token_times": [4.0, 5.0], "token_cpu_times": [2.0, 2.5]},
]
# Iterations ending at 1, 2 and 5 s weigh 1, 1 and 3 s; the middle one records no prefill or decode time.
ITERATIONS = [
    {"time": 1.0, "running": 1, "preempted": 0, "used": 100, "reserved": 200, "saved": 0,
     "prefill_seconds": 0.25, "decode_seconds": 0.0, "prefill_tokens": 8},
    {"time": 2.0, "running": 2, "preempted": 1, "used": 300, "reserved": 400, "saved": 50},
    {"time": 5.0, "running": 1, "preempted": 0, "used": 100, "reserved": 400, "saved": 10,
     "prefill_seconds": 0.5, "decode_seconds": 1.5, "prefill_tokens": 4},
]


def spread(p50, p90, p99):
    return {"p50": pytest.approx(p50), "p90": pytest.approx(p90), "p99": pytest.approx(p99)}


def test_per_request_latencies_from_the_timestamps():
    found = serving_figures.request_latencies({"requests": REQUESTS})
    assert found["ttft"] == pytest.approx([1.0, 1.0, 2.0])  # first token - arrival
    assert found["e2e"] == pytest.approx([2.5, 1.0, 3.0])  # last token - arrival
    assert found["queueing"] == pytest.approx([0.5, 0.0, 1.0])  # first admission - arrival
    assert found["itl"] == pytest.approx([0.5, 1.0, 1.0])  # every gap of every request, pooled
    assert found["tpot"] == pytest.approx([0.75, 1.0])  # (last - first) / (tokens - 1); none for one token


def test_a_replay_by_hand():
    figures = serving_figures.replay_figures({"requests": REQUESTS, "iterations": ITERATIONS})
    assert figures == {
        "makespan": 5.0, "output_tokens": 6, "output_tokens_per_second": pytest.approx(1.2),
        "requests_per_second": pytest.approx(0.6),
        "ttft": spread(1.0, 1.8, 1.98), "tpot": spread(0.875, 0.975, 0.9975), "itl": spread(1.0, 1.0, 1.0),
        "e2e": spread(2.5, 2.9, 2.99), "queueing": spread(0.5, 0.9, 0.99),
        # the CPU clock: makespan at the last token's CPU time, TPOT over the requests of two tokens or more
        "cpu_makespan": 2.5, "output_tokens_per_cpu_second": pytest.approx(2.4),
        "tpot_cpu": spread(0.4375, 0.4875, 0.49875),  # (1.25 - 0.5) / 2 and (2.5 - 2.0) / 1
        "max_concurrency": 2, "mean_concurrency": pytest.approx((1 + 2 + 3 * 1) / 5),
        "preemptions": 1, "iterations": 3,
        "used_bytes": pytest.approx((100 + 300 + 3 * 100) / 5), "reserved_bytes": pytest.approx((200 + 400 + 3 * 400) / 5),
        "waste": pytest.approx(1 - 140 / 360), "peak_reserved_bytes": 400, "saved_bytes_max": 50,
        "prefill_seconds": pytest.approx(0.75), "decode_seconds": pytest.approx(1.5), "prefill_tokens": 12,
    }


def test_a_peer_replay_has_tokens_and_no_iterations_or_cpu_clock():
    requests = [{key: value for key, value in request.items() if key != "token_cpu_times"} for request in REQUESTS]
    figures = serving_figures.replay_figures({"requests": requests, "iterations": []})
    assert figures["output_tokens"] == 6 and figures["queueing"] == spread(0.5, 0.9, 0.99)
    assert not {"cpu_makespan", "tpot_cpu", "max_concurrency", "used_bytes", "waste"} & set(figures)


def test_a_replay_of_no_time_and_no_reservation_weighs_nothing():
    iterations = [{"time": 0.0, "running": 1, "preempted": 0, "used": 0, "reserved": 0, "saved": 0}]
    assert serving_figures.time_weighted(iterations, "running") == 0.0  # no time passed: no weight, no division
    figures = serving_figures.replay_figures({"requests": REQUESTS, "iterations": iterations})
    assert figures["waste"] == 0.0 and figures["reserved_bytes"] == 0.0  # nothing reserved: nothing wasted
