"""kvbench.measure.latency: every client-visible figure from raw per-step durations, checked by hand."""

import pytest

from kvbench.measure import latency


def request(rotation, ttft, steps, mode="static"):
    return {"mode": mode, "length": len(steps) + 4, "repetition": rotation, "seconds": ttft + sum(steps) + 1e-6,
            "ttft_seconds": ttft, "step_seconds": steps}


def test_one_request_by_hand():
    figures = latency.request_figures(request(0, 0.010, [0.002, 0.003, 0.004]), batch=2)
    assert figures["ttft"] == 0.010
    assert figures["e2e"] == pytest.approx(0.019)
    assert figures["tpot"] == pytest.approx((0.019 - 0.010) / 3)  # vLLM: (E2E - TTFT) / (N - 1)
    assert figures["tokens_per_second"] == pytest.approx(2 * 4 / 0.019)  # batch x N tokens over E2E
    assert latency.request_figures(request(0, 0.01, []))["tpot"] is None  # one token: no TPOT
    assert latency.request_figures(request(0, 0.010, [0.002]))["tokens_per_second"] == pytest.approx(2 / 0.012)  # batch 1


def test_a_modes_figures_are_medians_and_its_itl_percentiles_pool_every_step():
    reps = [request(r, 0.010 + 0.001 * r, [0.002] * 9 + [0.02 * (r + 1)]) for r in range(5)]
    figures = latency.mode_latency(reps)
    assert figures["ttft"]["median"] == pytest.approx(0.012)
    assert figures["ttft"]["low"] == 0.010 and figures["ttft"]["high"] == 0.014  # five values: their range
    assert figures["itl_p50"] == pytest.approx(0.002) and figures["itl_p99"] > 0.05  # the slow last steps
    assert (figures["requests"], figures["generated"]) == (5, 11)


def test_ratios_to_the_baseline_are_paired_by_rotation():
    """Rotations differ, so the median of per-rotation ratios (2 for TPOT, 2 for TTFT) is not the ratio of
    the medians (3 and 1.5) nor what pairing by list position gives (3 and 1.25); the mode's requests come in
    another order than the baseline's, and its extra rotation 5 has no pair."""
    base_tpot, mine_tpot = [4e-3, 8e-3, 2e-3, 6e-3, 10e-3], [2e-3, 2e-3, 2e-3, 1e-3, 5e-3]
    base_ttft, mine_ttft = [0.010, 0.020, 0.030, 0.040, 0.050], [0.020, 0.010, 0.015, 0.040, 0.025]
    base = [request(r, base_ttft[r], [base_tpot[r]] * 4, "full") for r in range(5)]
    mine = [request(r, mine_ttft[r], [mine_tpot[r]] * 4) for r in (4, 2, 0, 3, 1)] + [request(5, 1.0, [1.0] * 4)]
    tpot = latency.ratio_to_baseline(base, mine, "tpot", between_run=0.0, interval="within")
    ttft = latency.ratio_to_baseline(base, mine, "ttft", between_run=0.0, interval="within")
    assert tpot.ratio == pytest.approx(2.0) and tpot.pairs == 5
    assert (tpot.low, tpot.high) == pytest.approx((1.0, 6.0))  # five ratios 2, 4, 1, 6, 2: the median's range
    assert ttft.ratio == pytest.approx(2.0) and ttft.pairs == 5
    assert (ttft.low, ttft.high) == pytest.approx((0.5, 2.0))  # ratios 0.5, 2, 2, 1, 2


def test_achieved_bandwidth_is_bytes_over_seconds():
    assert latency.achieved_bandwidth(2_000_000, 0.001) == pytest.approx(2e9)


def test_the_matmul_floor_adds_each_product_of_a_forward_at_its_measured_rate_rounds_first():
    from kvbench.config import preset_config

    config = preset_config("llama-mini")  # C 256, I 512, H*D 256, q/k/v 256 + 2 * 64, V 1024, 4 layers
    shapes = {(256, 384), (256, 256), (256, 1024), (512, 256)}
    assert set(latency.step_matmuls(config)) == shapes and len(latency.step_matmuls(config)) == 4 * 4 + 1
    once = {"matmul": [{"shape": [1, k, n], "flops_per_second": {"median": 1e9}} for k, n in shapes]}
    flops = 2 * (4 * (256 * 384 + 256 * 256 + 256 * 1024 + 512 * 256) + 256 * 1024)
    assert latency.matmul_floor(config, 1, once) == pytest.approx(flops / 1e9)
    assert latency.matmul_floor(config, 2, once) is None  # a shape the run did not measure: no floor
    # measured again at every round: their median replaces the one measurement
    rounds = [{"round": r, "triad": 4e9 + r * 1e9, "copy": 1e9,
               "matmul": [{"shape": [1, k, n], "flops_per_second": 2e9 * (r + 1)} for k, n in shapes]} for r in range(3)]
    both = {**once, "rounds": rounds, "memory_bandwidth": {"triad": {"1": {"median": 99e9}}}}
    assert latency.matmul_floor(config, 1, both) == pytest.approx(flops / 4e9)
    assert latency.bandwidth_limit(both, 1) == 5e9 and latency.compute_limit(both) == 4e9


def test_round_limits_are_measured_once_per_round_beside_the_samples():
    from kvbench.measure.machine import RoundLimits
    from kvbench.measure.sampling import sample
    from kvbench.measure.timing import Protocol

    probe = RoundLimits([(1, 64, 32)], 1 << 20)
    found = probe()
    assert found["copy"] > 0 and found["triad"] > 0 and found["matmul"][0]["shape"] == [1, 64, 32]
    state = sample({4: {"full": lambda: None, "static": lambda: None}}, Protocol.fixed(repeats=3), limits=probe)
    assert [entry["round"] for entry in state.limits] == [0, 1, 2]  # one per round, three rounds of one rotation


def test_the_roofline_work_of_a_decode_step_and_a_prefill_by_hand():
    from kvbench.config import preset_config

    config = preset_config("llama-mini")  # 4 layers, 8 heads of 32, float32: 4 bytes a weight
    assert (config.layers, config.heads, config.head_dim, config.element_bytes) == (4, 8, 32, 4)
    # decode at context 9 (10 positions attended), batch 2: every weight and cached byte read once;
    # 2 FLOPs a weight and 4 per layer, head, head width and position, for each sequence
    step = latency.decode_step(4000, 1000, config, batch=2, context=9)
    assert step == {"bytes": 5000, "flops": pytest.approx(2 * (2 * 1000 + 4 * 4 * 8 * 32 * 10))}
    # a prefill of 3 tokens: the weights read once, 2 FLOPs a weight a token, 2 per visible pair (3 * 4)
    work = latency.prefill(4000, config, batch=2, tokens=3)
    assert work == {"bytes": 4000, "flops": pytest.approx(2 * (2 * 1000 * 3 + 2 * 4 * 8 * 32 * 3 * 4))}


def test_itl_percentiles_pool_every_step_by_linear_interpolation():
    reps = [request(0, 0.01, [0.001, 0.002, 0.003]), request(1, 0.01, [0.004, 0.005])]
    assert latency.itl_percentiles(reps) == {"itl_p50": pytest.approx(0.003), "itl_p90": pytest.approx(0.0046),
                                             "itl_p99": pytest.approx(0.00496)}
    assert latency.itl_percentiles([request(0, 0.01, [])]) == {}  # one-token requests: no gap to pool


def test_one_request_and_none_at_the_default_batch_of_one():
    one = latency.mode_latency([request(0, 0.010, [0.002, 0.004])])
    assert one["tokens_per_second"]["median"] == pytest.approx(3 / 0.016)  # batch 1: N tokens over E2E
    assert (one["requests"], one["generated"], one["tpot"]["median"]) == (1, 3, pytest.approx(0.003))
    assert latency.mode_latency([]) == {"requests": 0, "generated": 0}
    reps = [request(3, 0.010, [0.002, 0.004]), request(5, 0.02, [])]
    assert latency.figure_by_rotation(reps, "tokens_per_second") == {3: pytest.approx(3 / 0.016), 5: pytest.approx(50)}
    assert latency.figure_by_rotation(reps, "tpot") == {3: pytest.approx(0.003)}  # one token: no TPOT, no entry


def test_a_context_sample_is_its_timed_steps_mean_and_its_first_step():
    reps = [request(r, 0.1, [0.05 + r, 0.01 * (r + 1), 0.02 * (r + 1), 0.03 * (r + 1)]) for r in range(3)]
    assert latency.context_figures(reps[0], warmup_steps=1) == {"step": pytest.approx(0.02), "first_step": 0.05}
    found = latency.context_latency(reps, warmup_steps=1)
    assert found["samples"] == 3
    assert found["step"] == {"median": pytest.approx(0.04), "low": pytest.approx(0.02), "high": pytest.approx(0.06)}
    assert found["first_step"] == {"median": 1.05, "low": 0.05, "high": 2.05}


def test_the_bandwidth_roof_is_the_most_threads_measured_at_or_below_the_runs():
    limits = {"memory_bandwidth": {"triad": {"2": {"median": 2e9}, "4": {"median": 4e9}, "8": {"median": 8e9}}}}
    assert latency.bandwidth_limit(limits, 4) == 4e9  # measured on exactly its threads
    assert latency.bandwidth_limit(limits, 6) == 4e9 and latency.bandwidth_limit(limits, 16) == 8e9
    assert latency.bandwidth_limit(limits, 1) == 2e9  # below every count measured: the fewest threads
    assert latency.bandwidth_limit(None, 1) is None and latency.compute_limit({}) is None


def test_percentiles_interpolate_linearly_and_name_their_levels():
    """The one percentile function (serving figures and pooled ITLs read it): numpy's linear interpolation."""
    from kvbench.measure.latency import percentiles

    assert percentiles([1.0, 0.0, 0.5]) == {"p50": pytest.approx(0.5), "p90": pytest.approx(0.9),
                                           "p99": pytest.approx(0.99)}
    assert percentiles([2.0], prefix="itl_p") == {"itl_p50": 2.0, "itl_p90": 2.0, "itl_p99": 2.0}
    assert percentiles([]) == {}
